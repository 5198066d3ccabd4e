"""CheckpointContainer, CheckpointPod and RestorePod.

The request is checked first (INVALID_ARGUMENT), then what it names (NOT_FOUND), then
whether CRIU can run on this node, probed on the first such call and remembered: where
it cannot, FAILED_PRECONDITION with the reason (`criu check`'s own output, or no criu on
PATH). Where it can, CheckpointContainer writes the archive (container/checkpoint.py);
the pod checkpoints are not built yet and answer UNIMPLEMENTED saying so.
"""

from __future__ import annotations

import asyncio
import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.errors import FailedPrecondition, InvalidArgument, NotFound, Unimplemented
from crishim.node.daemon import Daemon
from crishim.validate import checkpoint as check


class CheckpointRPCs:
    daemon: Daemon

    async def _criu_usable(self, what: str) -> None:
        reason = await self.daemon.criu.unusable()
        if reason:
            raise FailedPrecondition(f"{what}: CRIU cannot run on this node: {reason}")

    async def _criu(self, what: str) -> None:
        await self._criu_usable(what)
        raise Unimplemented(f"{what}: checkpoints with CRIU are not implemented by crishim "
                            "yet")

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
        await self._criu(f"checkpoint of pod {sb.id}")
        return pb.CheckpointPodResponse()

    async def RestorePod(self, request: pb.RestorePodRequest,
                         context: Context) -> pb.RestorePodResponse:
        check.restore_pod(request)
        self.daemon.runtimes.resolve_name(request.runtime_handler)
        if not await asyncio.to_thread(os.path.exists, request.checkpoint_path):
            raise NotFound(f"checkpoint_path {request.checkpoint_path} does not exist")
        await self._criu(f"restore of pod {request.config.metadata.name} from "
                         f"{request.checkpoint_path}")
        return pb.RestorePodResponse()
