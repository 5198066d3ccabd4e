"""Shared pytest setup. e2e tests are skipped unless run as root with the host parts."""

from __future__ import annotations

import os
import shutil

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
