"""Generic e2e fixtures shared by every e2e test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.faults import DurabilityEnv, durability_env
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


@pytest.fixture(scope="module")
def durability_module_env(busybox_ref: str,
                          request: pytest.FixtureRequest) -> Iterator[DurabilityEnv]:
    """One durability daemon per test module, on the bridge/subnet of the module's `_TAG`
    (each durability module has its own, so modules can run side by side)."""
    with durability_env(busybox_ref, request.module._TAG) as e:
        yield e


@pytest.fixture()
def denv(durability_module_env: DurabilityEnv) -> DurabilityEnv:
    """The module's durability daemon, reset to a clean state for this test."""
    durability_module_env.reset()
    return durability_module_env
