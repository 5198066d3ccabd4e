"""UpdateContainerResources and UpdatePodSandboxResources.

Check the request (validate/), call the manager, turn a failed `runc update` into the CRI's error.
The container manager merges, applies and persists a container update; a pod update is
recorded on the sandbox by the sandbox manager (the pod-level cgroup belongs to the
kubelet, which resizes it itself).
"""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.errors import FailedPrecondition
from crishim.log import get_logger
from crishim.node.daemon import Daemon
from crishim.runtime.runc import OCIRuntimeError
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

log = get_logger(__name__)


class ResourceRPCs:
    daemon: Daemon

    async def UpdateContainerResources(self, request: pb.UpdateContainerResourcesRequest,
                                       context: Context) -> pb.UpdateContainerResourcesResponse:
        self.daemon.checks.update_container_resources(request)
        mgr = self.daemon.containers
        rec: Container = mgr.get(request.container_id)
        try:
            await mgr.update_resources(rec, request.linux)
        except OCIRuntimeError as exc:
            if exc.not_exist() or exc.not_running():
                raise FailedPrecondition(f"container {rec.id} stopped while its resources "
                                         f"were being updated: {exc}") from None
            # e.g. EBUSY: a memory limit below what the container uses right now.
            raise FailedPrecondition(f"runc update of container {rec.id} failed: {exc}; "
                                     "the stored resources are unchanged") from None
        res = rec.config.linux.resources
        log.info("container resources updated", id=rec.id, memory=res.memory_limit_in_bytes,
                 cpu_quota=res.cpu_quota, cpu_period=res.cpu_period, cpu_shares=res.cpu_shares)
        return pb.UpdateContainerResourcesResponse()

    async def UpdatePodSandboxResources(self, request: pb.UpdatePodSandboxResourcesRequest,
                                        context: Context
                                        ) -> pb.UpdatePodSandboxResourcesResponse:
        self.daemon.checks.update_pod_sandbox_resources(request)
        mgr = self.daemon.sandboxes
        sb: Sandbox = mgr.get(request.pod_sandbox_id)
        await mgr.update_resources(sb, request.resources, request.overhead)
        log.info("pod resources recorded", id=sb.id,
                 memory=request.resources.memory_limit_in_bytes,
                 cpu_quota=request.resources.cpu_quota, cpu_shares=request.resources.cpu_shares)
        return pb.UpdatePodSandboxResourcesResponse()
