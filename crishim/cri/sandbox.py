"""RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus, ListPodSandbox."""

from __future__ import annotations

import time

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.cri.listreply import ListReplyCache
from crishim.errors import InvalidArgument
from crishim.node.daemon import Daemon
from crishim.store.sandbox import Sandbox


class SandboxRPCs:
    daemon: Daemon
    sandbox_list: ListReplyCache

    async def RunPodSandbox(self, request: pb.RunPodSandboxRequest,
                            context: Context) -> pb.RunPodSandboxResponse:
        self.daemon.checks.run_pod_sandbox(request)
        sid = await self.daemon.sandboxes.run_sandbox(request.config, request.runtime_handler)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    async def StopPodSandbox(self, request: pb.StopPodSandboxRequest,
                             context: Context) -> pb.StopPodSandboxResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        await self.daemon.sandboxes.stop_sandbox(request.pod_sandbox_id)
        return pb.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: pb.RemovePodSandboxRequest,
                               context: Context) -> pb.RemovePodSandboxResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        await self.daemon.sandboxes.remove_sandbox(request.pod_sandbox_id)
        return pb.RemovePodSandboxResponse()

    async def PodSandboxStatus(self, request: pb.PodSandboxStatusRequest,
                               context: Context) -> pb.PodSandboxStatusResponse:
        mgr = self.daemon.sandboxes
        sb = mgr.get(request.pod_sandbox_id)
        info = await mgr.verbose_info(sb) if request.verbose else {}
        return self._pod_sandbox_status(sb, info)

    def answer_pod_sandbox_status(self, raw: bytes) -> bytes | None:
        """A pod worker's status read, from memory, answered where it is read; a verbose
        one (it reads the bundle) and an unknown id (its error) are the handler's."""
        request = pb.PodSandboxStatusRequest.FromString(raw)
        sb = None if request.verbose else self.daemon.sandboxes.find(request.pod_sandbox_id)
        return None if sb is None else self._pod_sandbox_status(sb, {}).SerializeToString()

    def _pod_sandbox_status(self, sb: Sandbox, info: dict[str, str]
                            ) -> pb.PodSandboxStatusResponse:
        reply = pb.PodSandboxStatusResponse(status=sb.status_proto(), info=info)
        if self.daemon.events.subscriber_count:
            # The pod's container statuses as of `timestamp` serve the kubelet's evented
            # PLEG, the client that subscribes to GetContainerEvents. Any other kubelet
            # ignores both and asks for the containers itself (so does an evented one that
            # gets timestamp 0): without a subscriber they are left out, as CRI-O leaves
            # them out without pod events, and the pod workers' status reads build no
            # status per container.
            reply.containers_statuses.extend(
                self.daemon.sandboxes.statuses_of_containers(sb.id))
            reply.timestamp = time.time_ns()
        return reply

    async def ListPodSandbox(self, request: pb.ListPodSandboxRequest,
                             context: Context) -> bytes:
        return self.answer_list_pod_sandbox(request.SerializeToString(deterministic=True),
                                            request)

    def answer_list_pod_sandbox(self, raw: bytes,
                                request: pb.ListPodSandboxRequest | None = None) -> bytes:
        return self.sandbox_list.reply(raw, self.daemon.sandboxes.list_version(), request,
                                       pb.ListPodSandboxRequest.FromString, self._join_pods)

    def _join_pods(self, request: pb.ListPodSandboxRequest) -> tuple[bytes, bool]:
        flt = request.filter if request.HasField("filter") else None
        reply = b"".join(sb.list_item() for sb in self.daemon.sandboxes.list_sandboxes(flt))
        return reply, flt is None or not (flt.id or flt.label_selector)
