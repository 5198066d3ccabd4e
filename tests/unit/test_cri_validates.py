"""RunPodSandbox and CreateContainer check a request before a manager sees it: with the
managers faked (they accept anything), a request the checks refuse still ends as
INVALID_ARGUMENT naming the field, and the manager is never called. A servicer that
forgot its validation would hand the request on and answer OK. Both call their
validator the same way, once, with the whole request (a recording fake shows it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.container import ContainerRPCs
from crishim.cri.sandbox import SandboxRPCs
from crishim.errors import InvalidArgument, Kind
from crishim.oci.resources import ResourceMapper
from crishim.validate.requests import RequestChecks

TOO_LITTLE_MEMORY = pb.LinuxContainerResources(memory_limit_in_bytes=1)


class FakeManagers:
    """Takes every pod and container it is given, and remembers them."""

    def __init__(self) -> None:
        self.pods: list[pb.PodSandboxConfig] = []
        self.containers: list[pb.ContainerConfig] = []

    async def run_sandbox(self, config: pb.PodSandboxConfig, handler: str) -> str:
        self.pods.append(config)
        return "p" * 64

    async def create_container(self, sid: str, config: pb.ContainerConfig,
                               sandbox_config: pb.PodSandboxConfig) -> Any:
        self.containers.append(config)
        return SimpleNamespace(id="c" * 64)


class RecordingChecks:
    """A validator that passes everything and remembers what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def run_pod_sandbox(self, request: pb.RunPodSandboxRequest) -> None:
        self.calls.append(("run_pod_sandbox", request))

    def create_container(self, request: pb.CreateContainerRequest) -> None:
        self.calls.append(("create_container", request))


def servicers(checks: Any = None) -> tuple[SandboxRPCs, ContainerRPCs, FakeManagers]:
    managers = FakeManagers()
    daemon: Any = SimpleNamespace(sandboxes=managers, containers=managers,
                                  checks=checks or RequestChecks(ResourceMapper()))
    pods, containers = SandboxRPCs(), ContainerRPCs()
    pods.daemon = containers.daemon = daemon
    return pods, containers, managers


def pod(**linux: Any) -> pb.RunPodSandboxRequest:
    return pb.RunPodSandboxRequest(config=pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", uid="u1", namespace="default"),
        linux=pb.LinuxPodSandboxConfig(**linux)))


def container(**fields: Any) -> pb.CreateContainerRequest:
    fields.setdefault("metadata", pb.ContainerMetadata(name="app"))
    fields.setdefault("image", pb.ImageSpec(image="busybox:latest"))
    config = pb.ContainerConfig(**fields)
    return pb.CreateContainerRequest(pod_sandbox_id="p" * 64, config=config,
                                     sandbox_config=pod().config)


async def test_valid_requests_reach_the_managers() -> None:
    pods, containers, managers = servicers()
    await pods.RunPodSandbox(pod(), None)
    await containers.CreateContainer(container(), None)
    assert len(managers.pods) == 1 and len(managers.containers) == 1


async def test_each_request_reaches_its_validator_once() -> None:
    checks = RecordingChecks()
    pods, containers, _ = servicers(checks)
    run, create = pod(), container()
    await pods.RunPodSandbox(run, None)
    await containers.CreateContainer(create, None)
    assert checks.calls == [("run_pod_sandbox", run), ("create_container", create)]


@pytest.mark.parametrize(("req", "field"), [
    (pod(resources=TOO_LITTLE_MEMORY), "memory_limit_in_bytes"),
    (pod(overhead=TOO_LITTLE_MEMORY), "memory_limit_in_bytes"),
    (pb.RunPodSandboxRequest(config=pb.PodSandboxConfig()), "metadata"),
    (pod(sysctls={"kernel.panic": "1"}), "kernel.panic"),
    (pod(cgroup_parent="../escape"), "cgroup_parent"),
], ids=["resources", "overhead", "no-metadata", "node-sysctl", "cgroup-parent"])
async def test_run_pod_sandbox_refuses_what_validation_refuses(
        req: pb.RunPodSandboxRequest, field: str) -> None:
    pods, _, managers = servicers()
    with pytest.raises(InvalidArgument, match=field) as err:
        await pods.RunPodSandbox(req, None)
    assert err.value.code == Kind.INVALID_ARGUMENT
    assert managers.pods == []


@pytest.mark.parametrize(("req", "field"), [
    (container(mounts=[pb.Mount(container_path="data", host_path="/srv/data")]),
     "container_path"),
    (container(working_dir="srv"), "working_dir"),
    (container(linux=pb.LinuxContainerConfig(resources=TOO_LITTLE_MEMORY)),
     "memory_limit_in_bytes"),
    (pb.CreateContainerRequest(config=container().config), "pod_sandbox_id"),
    (container(metadata=pb.ContainerMetadata()), "metadata.name"),
    (container(image=pb.ImageSpec()), "image.image"),
], ids=["relative-mount", "relative-working-dir", "resources", "no-pod", "no-name", "no-image"])
async def test_create_container_refuses_what_validation_refuses(
        req: pb.CreateContainerRequest, field: str) -> None:
    _, containers, managers = servicers()
    with pytest.raises(InvalidArgument, match=field) as err:
        await containers.CreateContainer(req, None)
    assert err.value.code == Kind.INVALID_ARGUMENT
    assert managers.containers == []
