"""UpdateContainerResources in the container manager: the update is merged over the stored
resources, applied, and only then recorded and persisted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.manager import KIND
from crishim.errors import FailedPrecondition
from crishim.oci import spec as oci_spec
from crishim.store.container import EXITED, Container
from tests.fakes.containers import POD
from tests.fakes.containers import container_config as _config
from tests.fakes.containers import env as env  # the fixture


async def test_an_update_before_start_goes_into_the_bundle_and_is_persisted(
        env: SimpleNamespace) -> None:
    mgr = await env.manager()
    config = _config()
    config.linux.resources.CopyFrom(pb.LinuxContainerResources(cpu_shares=512,
                                                               memory_limit_in_bytes=64 << 20))
    rec = await mgr.create_container(POD, config)
    await mgr.update_resources(rec, pb.LinuxContainerResources(memory_limit_in_bytes=128 << 20))
    # Only the memory changed: the cpu shares stored before stay.
    res = rec.config.linux.resources
    assert (res.memory_limit_in_bytes, res.cpu_shares) == (128 << 20, 512)
    spec = oci_spec.read_bundle(rec.bundle)
    assert spec["linux"]["resources"]["memory"]["limit"] == 128 << 20
    data = (await env.db.load_all(KIND))[rec.id]
    stored = Container.from_dict(data).config.linux.resources
    assert (stored.memory_limit_in_bytes, stored.cpu_shares) == (128 << 20, 512)


async def test_an_exited_container_is_not_updated(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.stop_container(rec.id, 0)
    assert rec.state == EXITED
    with pytest.raises(FailedPrecondition, match="CONTAINER_EXITED"):
        await mgr.update_resources(rec, pb.LinuxContainerResources(cpu_quota=20000))
    assert rec.config.linux.resources.cpu_quota == 0
