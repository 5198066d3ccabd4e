"""CheckpointContainer, CheckpointPod and RestorePod.

The request is checked first (INVALID_ARGUMENT), then what it names (NOT_FOUND), then
whether CRIU can run on this node, probed on the first such call and remembered: where
it cannot, FAILED_PRECONDITION with the reason (`criu check`'s own output, or no criu on
PATH). Where it can, CheckpointContainer writes the archive (container/checkpoint.py),
CheckpointPod a directory of them (container/podckpt.py), and RestorePod makes the pod
and its containers from one (cri/podrestore.py).
"""

from __future__ import annotations

import asyncio
import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import podckpt
from crishim.cri import podrestore
from crishim.cri.base import Context
from crishim.errors import FailedPrecondition, InvalidArgument, NotFound
from crishim.node.daemon import Daemon
from crishim.store.container import RUNNING
from crishim.validate import checkpoint as check


class CheckpointRPCs:
    daemon: Daemon

    async def _criu_usable(self, what: str) -> None:
        reason = await self.daemon.criu.unusable()
        if reason:
            raise FailedPrecondition(f"{what}: CRIU cannot run on this node: {reason}")

    async def CheckpointContainer(self, request: pb.CheckpointContainerRequest,
                                  context: Context) -> pb.CheckpointContainerResponse:
        check.checkpoint_container(request)
        rec = self.daemon.containers.get(request.container_id)
        await self._criu_usable(f"checkpoint of container {rec.id}")
        await self.daemon.containers.checkpoint_container(rec.id, request.location,
                                                          float(request.timeout))
        return pb.CheckpointContainerResponse()

    async def CheckpointPod(self, request: pb.CheckpointPodRequest,
                            context: Context) -> pb.CheckpointPodResponse:
        check.checkpoint_pod(request)
        sb = self.daemon.sandboxes.get(request.pod_sandbox_id)
        for cid in request.container_ids:
            rec = self.daemon.containers.get(cid)
            if rec.pod_id != sb.id:
                raise InvalidArgument(f"container {rec.id} is in pod {rec.pod_id}, not "
                                      f"in pod {sb.id}")
        await self._criu_usable(f"checkpoint of pod {sb.id}")
        ctrs = self.daemon.containers
        # The named containers, or none named: all the pod's running ones.
        recs = [ctrs.get(c) for c in request.container_ids] or [
            r for r in ctrs.for_pod(sb.id) if r.state == RUNNING]
        await podckpt.checkpoint_pod(sb, [(r, ctrs.runtime_for(r)) for r in recs],
                                     ctrs.records.lock, ctrs.checkpoint_dir,
                                     request.output_path)
        return pb.CheckpointPodResponse()

    async def RestorePod(self, request: pb.RestorePodRequest,
                         context: Context) -> pb.RestorePodResponse:
        check.restore_pod(request)
        self.daemon.runtimes.resolve_name(request.runtime_handler)
        path = request.checkpoint_path
        if not await asyncio.to_thread(os.path.exists, path):
            raise NotFound(f"checkpoint_path {path} does not exist")
        await self._criu_usable(f"restore of pod {request.config.metadata.name} from {path}")
        archives = await asyncio.to_thread(podckpt.read_pod_dump, path)
        podckpt.match(path, archives, [c.metadata.name for c in request.container_configs])
        configs = []
        for c in request.container_configs:
            restored = pb.ContainerConfig()
            restored.CopyFrom(c)
            restored.image.image = archives[c.metadata.name]  # the archive's base image
            configs.append(restored)
        self.daemon.checks.restore_pod(request, configs)
        return await podrestore.restore_pod(self.daemon, request, configs)
