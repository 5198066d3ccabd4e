"""Shared pytest setup. e2e tests are skipped unless run as root with the host parts; in CI
only the skips tests/ci_skips.txt lists are allowed."""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Generator
from typing import Any

import pytest

E2E_TOOLS = ("runc", "conmon", "docker-registry", "busybox")


def e2e_missing() -> list[str]:
    missing = [t for t in E2E_TOOLS if shutil.which(t) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = e2e_missing()
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
            if missing:
                item.add_marker(pytest.mark.skip(reason="e2e needs " + ", ".join(missing)))
        if item.get_closest_marker("slow") and not os.environ.get("CRISHIM_SLOW"):
            item.add_marker(pytest.mark.skip(reason="slow suite: set CRISHIM_SLOW=1"))


# --- skips in CI -----------------------------------------------------------------------
# A skip is a test that checked nothing: in CI only the ones listed in tests/ci_skips.txt
# may happen (there, a missing tool is a broken CI host, not a reason to pass).
CI_SKIPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ci_skips.txt")


def cgroup_version() -> str:
    return "v2" if os.path.isfile("/sys/fs/cgroup/cgroup.controllers") else "v1"


def allowed_ci_skips(path: str = CI_SKIPS, where: str = "") -> list[str]:
    """The node id patterns that may skip on this host (`where`: v1 or v2)."""
    where = where or cgroup_version()
    patterns = []
    with open(path) as fh:
        for n, raw in enumerate(fh, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or parts[0] not in ("any", "v1", "v2"):
                raise ValueError(f"{path}:{n}: expected 'any|v1|v2 NODEID-PATTERN': {raw!r}")
            if parts[0] in ("any", where):
                patterns.append(parts[1])
    return patterns


def skip_allowed(nodeid: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(nodeid, p) for p in patterns)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not os.environ.get("CI"):
        return
    if skip_allowed(item.nodeid, allowed_ci_skips()):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI ({reason}), and {item.nodeid} is not in "
                       f"tests/ci_skips.txt: CI must run it (or list it there, saying why)")
