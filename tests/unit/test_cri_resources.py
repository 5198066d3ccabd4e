"""UpdateContainerResources (crishim/cri/resources.py) against a fake daemon: bad requests
are refused naming the field before the manager sees them, a valid one is the manager's
(tests/unit/test_container_update.py), and a failed `runc update` is FailedPrecondition
naming the container."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.resources import ResourceRPCs
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.cgroups import CgroupFacts
from crishim.host.topology import HostTopology
from crishim.oci.resources import ResourceMapper
from crishim.runtime.runc import OCIRuntimeError
from crishim.store.container import RUNNING
from crishim.validate.requests import RequestChecks

CID = "c" * 64


class FakeContainers:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.applied: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def get(self, cid: str) -> Any:
        assert cid == CID
        return self.rec

    async def update_resources(self, rec: Any, update: pb.LinuxContainerResources) -> None:
        if self.fail is not None:
            raise self.fail
        self.applied.append(update)


def service(state: int = RUNNING) -> tuple[ResourceRPCs, FakeContainers, Any]:
    config = pb.ContainerConfig(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(cpu_shares=512, cpu_quota=50000,
                                             cpu_period=100000,
                                             memory_limit_in_bytes=64 << 20)))
    rec = SimpleNamespace(id=CID, state=state, config=config,
                          to_dict=lambda: {"resources": str(config.linux.resources)})
    containers = FakeContainers(rec)
    svc = ResourceRPCs()
    mapper = ResourceMapper(CgroupFacts.everything(),
                            topology=HostTopology(frozenset({0, 1}), frozenset({0})))
    svc.daemon = SimpleNamespace(containers=containers,  # type: ignore[assignment]
                                 checks=RequestChecks(mapper))
    return svc, containers, rec


def update(**res: Any) -> pb.UpdateContainerResourcesRequest:
    return pb.UpdateContainerResourcesRequest(container_id=CID,
                                              linux=pb.LinuxContainerResources(**res))


async def test_an_update_is_validated_and_handed_to_the_manager() -> None:
    svc, containers, _ = service()
    req = update(memory_limit_in_bytes=128 << 20)
    await svc.UpdateContainerResources(req, None)
    assert containers.applied == [req.linux]


@pytest.mark.parametrize(("req", "field"), [
    (pb.UpdateContainerResourcesRequest(linux=pb.LinuxContainerResources()), "container_id"),
    (pb.UpdateContainerResourcesRequest(container_id=CID), "linux"),
])
async def test_a_request_without_a_field_is_refused_naming_it(
        req: pb.UpdateContainerResourcesRequest, field: str) -> None:
    svc, containers, _ = service()
    with pytest.raises(InvalidArgument, match=field):
        await svc.UpdateContainerResources(req, None)
    assert containers.applied == []


async def test_out_of_range_values_are_refused_before_the_runtime() -> None:
    svc, containers, _ = service()
    with pytest.raises(InvalidArgument, match="cpu_shares"):
        await svc.UpdateContainerResources(update(cpu_shares=1), None)
    assert containers.applied == []


@pytest.mark.parametrize("stderr", ["container does not exist", "device or resource busy"])
async def test_a_failed_runc_update_is_a_failed_precondition(stderr: str) -> None:
    svc, containers, rec = service()
    containers.fail = OCIRuntimeError("runc update failed", rc=1, stderr=stderr)
    with pytest.raises(FailedPrecondition, match=CID):
        await svc.UpdateContainerResources(update(memory_limit_in_bytes=32 << 20), None)
    assert rec.config.linux.resources.memory_limit_in_bytes == 64 << 20
