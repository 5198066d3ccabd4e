"""What the scenarios that compare one runtime with a setting off and on (nri, tracing)
share: the order of the phases in a block, and the restart between two phases."""

from __future__ import annotations

from collections.abc import Callable

from hack.benchlib.runtimes import Runtime
from hack.benchlib.scenarios import Progress, Side


def alternate(phases: tuple[str, ...], block: int) -> tuple[str, ...]:
    """Blocks alternate the order of the phases: a phase is neither always first after
    a restart nor always last."""
    return phases if block % 2 == 0 else phases[::-1]


def restart(side: Side, scen: str, what: str, change: Callable[[Runtime], None],
            log: Progress) -> bool:
    """Stops the side's runtime, applies `change` to it and starts it again; a runtime that
    does not come back is marked failed for `scen` (`what` says how it was restarted)."""
    rt = side.runtime
    rt.stop()
    change(rt)
    try:
        rt.start()
    except RuntimeError as exc:
        log(f"{side.name}: restart with {what}: {exc}")
        side.failed.setdefault(scen, "did not restart")
        return False
    return True
