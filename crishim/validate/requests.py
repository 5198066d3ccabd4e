"""The one entry to the checks: a method per CRI request that carries a config, called
by its servicer before a manager sees the request. Below it the managers trust what
passed."""

from __future__ import annotations

from dataclasses import dataclass, field

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.oci import spec as oci_spec
from crishim.oci.resources import ResourceMapper
from crishim.validate.container import validate_container_config
from crishim.validate.resources import check_for
from crishim.validate.sandbox import validate_cgroup_parent, validate_config


@dataclass(frozen=True)
class RequestChecks:
    """The checks with what they need of the node: its resource mapping (cgroup
    controllers, CPUs, memory nodes, the operator's policy), cgroup driver, whether its
    kernel makes recursive read-only mounts and the capabilities the daemon holds (read
    once: /proc is not read on the loop per request, and the set never grows)."""

    resources: ResourceMapper
    cgroup_driver: str = "cgroupfs"
    rro: bool = True
    capabilities: frozenset[str] = field(
        default_factory=lambda: frozenset(oci_spec.all_capabilities()))

    def run_pod_sandbox(self, request: pb.RunPodSandboxRequest) -> None:
        config = request.config
        validate_config(config)
        validate_cgroup_parent(self.cgroup_driver, config.linux.cgroup_parent)
        for res in (config.linux.resources, config.linux.overhead):
            check_for(self.resources, res)

    def create_container(self, request: pb.CreateContainerRequest) -> None:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        validate_container_config(request.config, self.resources, self.rro,
                                  self.capabilities)

    def restore_pod(self, request: pb.RestorePodRequest,
                    configs: list[pb.ContainerConfig]) -> None:
        """RestorePod's pod and containers, as RunPodSandbox and CreateContainer check
        theirs (`configs`: the request's, each image its archive's path)."""
        self.run_pod_sandbox(pb.RunPodSandboxRequest(config=request.config,
                                                     runtime_handler=request.runtime_handler))
        for config in configs:
            validate_container_config(config, self.resources, self.rro, self.capabilities)

    def update_container_resources(self, request: pb.UpdateContainerResourcesRequest
                                   ) -> None:
        if not request.container_id:
            raise InvalidArgument("container_id is required")
        if not request.HasField("linux"):
            raise InvalidArgument("linux resources are required (windows is not supported)")
        check_for(self.resources, request.linux)

    def update_pod_sandbox_resources(self, request: pb.UpdatePodSandboxResourcesRequest
                                     ) -> None:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        for res in (request.resources, request.overhead):
            check_for(self.resources, res)
            self.resources.linux(res)  # refuses a missing controller when the operator asked so
