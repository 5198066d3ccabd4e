"""UpdateContainerResources (crishim/cri/resources.py) against a fake daemon: bad requests
are refused naming the field, an update merges over the stored resources (zero means
unchanged), is mapped for the host and persisted only after the runtime took it, and a
failed `runc update` leaves the stored resources as they were."""

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
from crishim.oci.runc import OCIRuntimeError
from crishim.store.container import CREATED, EXITED, RUNNING

CID = "c" * 64


class FakeContainers:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.applied: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def get(self, cid: str) -> Any:
        assert cid == CID
        return self.rec

    async def update_resources(self, rec: Any, linux: dict[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.applied.append(linux)


class FakeDB:
    def __init__(self) -> None:
        self.puts: list[tuple[str, str, dict[str, Any]]] = []

    async def put(self, kind: str, key: str, value: dict[str, Any]) -> None:
        self.puts.append((kind, key, value))


def service(state: int = RUNNING) -> tuple[ResourceRPCs, FakeContainers, FakeDB, Any]:
    config = pb.ContainerConfig(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(cpu_shares=512, cpu_quota=50000,
                                             cpu_period=100000,
                                             memory_limit_in_bytes=64 << 20)))
    rec = SimpleNamespace(id=CID, state=state, config=config,
                          to_dict=lambda: {"resources": str(config.linux.resources)})
    containers, db = FakeContainers(rec), FakeDB()
    svc = ResourceRPCs()
    mapper = ResourceMapper(CgroupFacts.everything(),
                            topology=HostTopology(frozenset({0, 1}), frozenset({0})))
    svc.daemon = SimpleNamespace(containers=containers, db=db,  # type: ignore[assignment]
                                 resources=mapper)
    return svc, containers, db, rec


def update(**res: Any) -> pb.UpdateContainerResourcesRequest:
    return pb.UpdateContainerResourcesRequest(container_id=CID,
                                              linux=pb.LinuxContainerResources(**res))


async def test_an_update_merges_maps_and_persists() -> None:
    svc, containers, db, rec = service()
    await svc.UpdateContainerResources(update(memory_limit_in_bytes=128 << 20), None)
    # Only the memory changed: the cpu settings stored before stay.
    assert containers.applied == [{"cpu": {"shares": 512, "quota": 50000, "period": 100000},
                                   "memory": containers.applied[0]["memory"]}]
    assert containers.applied[0]["memory"]["limit"] == 128 << 20
    res = rec.config.linux.resources
    assert (res.memory_limit_in_bytes, res.cpu_shares) == (128 << 20, 512)
    assert [(k, key) for k, key, _ in db.puts] == [("container", CID)]


@pytest.mark.parametrize(("req", "field"), [
    (pb.UpdateContainerResourcesRequest(linux=pb.LinuxContainerResources()), "container_id"),
    (pb.UpdateContainerResourcesRequest(container_id=CID), "linux"),
])
async def test_a_request_without_a_field_is_refused_naming_it(
        req: pb.UpdateContainerResourcesRequest, field: str) -> None:
    svc, containers, db, _ = service()
    with pytest.raises(InvalidArgument, match=field):
        await svc.UpdateContainerResources(req, None)
    assert containers.applied == [] and db.puts == []


async def test_out_of_range_values_are_refused_before_the_runtime() -> None:
    svc, containers, db, _ = service()
    with pytest.raises(InvalidArgument, match="cpu_shares"):
        await svc.UpdateContainerResources(update(cpu_shares=1), None)
    assert containers.applied == [] and db.puts == []


async def test_an_exited_container_cannot_be_updated() -> None:
    svc, containers, _, _ = service(EXITED)
    with pytest.raises(FailedPrecondition, match="CONTAINER_EXITED"):
        await svc.UpdateContainerResources(update(memory_limit_in_bytes=128 << 20), None)
    assert containers.applied == []


async def test_a_created_container_can_be_updated() -> None:
    svc, containers, _, _ = service(CREATED)
    await svc.UpdateContainerResources(update(cpu_quota=20000), None)
    assert containers.applied[0]["cpu"]["quota"] == 20000


@pytest.mark.parametrize("stderr", ["container does not exist", "device or resource busy"])
async def test_a_failed_runc_update_keeps_the_stored_resources(stderr: str) -> None:
    svc, containers, db, rec = service()
    containers.fail = OCIRuntimeError("runc update failed", rc=1, stderr=stderr)
    with pytest.raises(FailedPrecondition, match=CID):
        await svc.UpdateContainerResources(update(memory_limit_in_bytes=32 << 20), None)
    assert rec.config.linux.resources.memory_limit_in_bytes == 64 << 20
    assert db.puts == []
