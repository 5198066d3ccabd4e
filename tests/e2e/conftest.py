"""Generic e2e fixtures shared by every e2e test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.imagebuild import push_busybox
from tests.e2e.registry import Registry


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    """One plain-HTTP docker-registry on 127.0.0.1 for the whole session."""
    with Registry() as reg:
        yield reg


@pytest.fixture(scope="session")
def busybox_ref(registry: Registry) -> str:
    """`<host>/test/busybox:latest`, the standard busybox test image, pushed once."""
    push_busybox(registry.host, "test/busybox", "latest")
    return f"{registry.host}/test/busybox:latest"
