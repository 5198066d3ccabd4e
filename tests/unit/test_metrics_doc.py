"""docs/metrics.md names every metric crishim serves, and only those."""

from __future__ import annotations

import re
from pathlib import Path

from crishim.observe import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _documented() -> set[str]:
    return {m.group(1) for line in DOC.read_text().splitlines()
            if (m := re.match(r"\| `(crishim_\w+)` \|", line))}


def _registered() -> set[str]:
    names: set[str] = set()
    for family in metrics.REGISTRY.collect():
        # prometheus_client names a counter family without its _total.
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    # The state gauges come from sources registered at start: one family per kind.
    return names | {"crishim_pods", "crishim_containers"}


def test_every_metric_is_documented() -> None:
    missing = _registered() - _documented()
    assert not missing, f"add to docs/metrics.md: {sorted(missing)}"
    stale = _documented() - _registered()
    assert not stale, f"documented but not registered: {sorted(stale)}"
