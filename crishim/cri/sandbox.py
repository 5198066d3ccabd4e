"""RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus, ListPodSandbox."""

from __future__ import annotations

import time

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.cri.listreply import ListReplyCache
from crishim.daemon import Daemon
from crishim.errors import InvalidArgument


class SandboxRPCs:
    daemon: Daemon
    sandbox_list: ListReplyCache

    async def RunPodSandbox(self, request: pb.RunPodSandboxRequest,
                            context: Context) -> pb.RunPodSandboxResponse:
        sid = await self.daemon.sandboxes.run(request.config, request.runtime_handler)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    async def StopPodSandbox(self, request: pb.StopPodSandboxRequest,
                             context: Context) -> pb.StopPodSandboxResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        await self.daemon.sandboxes.stop(request.pod_sandbox_id)
        return pb.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: pb.RemovePodSandboxRequest,
                               context: Context) -> pb.RemovePodSandboxResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        await self.daemon.sandboxes.remove(request.pod_sandbox_id)
        return pb.RemovePodSandboxResponse()

    async def PodSandboxStatus(self, request: pb.PodSandboxStatusRequest,
                               context: Context) -> pb.PodSandboxStatusResponse:
        mgr = self.daemon.sandboxes
        sb = mgr.get(request.pod_sandbox_id)
        info = await mgr.verbose_info(sb) if request.verbose else {}
        return pb.PodSandboxStatusResponse(
            status=sb.status_proto(), info=info,
            containers_statuses=mgr.statuses_of_containers(sb.id), timestamp=time.time_ns())

    async def ListPodSandbox(self, request: pb.ListPodSandboxRequest,
                             context: Context) -> bytes:
        return self.answer_list_pod_sandbox(request.SerializeToString(deterministic=True),
                                            request)

    def answer_list_pod_sandbox(self, raw: bytes,
                                request: pb.ListPodSandboxRequest | None = None) -> bytes:
        return self.sandbox_list.reply(raw, self.daemon.pods.list_version(), request,
                                       pb.ListPodSandboxRequest.FromString, self._join_pods)

    def _join_pods(self, request: pb.ListPodSandboxRequest) -> tuple[bytes, bool]:
        flt = request.filter if request.HasField("filter") else None
        reply = b"".join(sb.list_item() for sb in self.daemon.sandboxes.list(flt))
        return reply, flt is None or not (flt.id or flt.label_selector)
