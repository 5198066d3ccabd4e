"""Container RPCs: Create/Start/Stop/Remove, List, Status, ReopenContainerLog, ExecSync."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import restore
from crishim.cri.base import Context
from crishim.cri.execreply import exec_sync_reply
from crishim.cri.listreply import ListReplyCache
from crishim.errors import FailedPrecondition
from crishim.node.daemon import Daemon


class ContainerRPCs:
    daemon: Daemon
    container_list: ListReplyCache

    async def CreateContainer(self, request: pb.CreateContainerRequest,
                              context: Context) -> pb.CreateContainerResponse:
        self.daemon.checks.create_container(request)
        if restore.is_archive_path(request.config.image.image):
            reason = await self.daemon.criu.unusable()
            if reason:
                raise FailedPrecondition(
                    f"restore of {request.config.image.image}: CRIU cannot run on this "
                    f"node: {reason}")
        rec = await self.daemon.containers.create_container(
            request.pod_sandbox_id, request.config, request.sandbox_config)
        return pb.CreateContainerResponse(container_id=rec.id)

    async def StartContainer(self, request: pb.StartContainerRequest,
                             context: Context) -> pb.StartContainerResponse:
        await self.daemon.containers.start_container(request.container_id)
        return pb.StartContainerResponse()

    async def StopContainer(self, request: pb.StopContainerRequest,
                            context: Context) -> pb.StopContainerResponse:
        await self.daemon.containers.stop_container(request.container_id, max(0, request.timeout))
        return pb.StopContainerResponse()

    async def RemoveContainer(self, request: pb.RemoveContainerRequest,
                              context: Context) -> pb.RemoveContainerResponse:
        await self.daemon.containers.remove_container(request.container_id)
        return pb.RemoveContainerResponse()

    async def ListContainers(self, request: pb.ListContainersRequest,
                             context: Context) -> bytes:
        return self.answer_list_containers(request.SerializeToString(deterministic=True),
                                           request)

    def answer_list_containers(self, raw: bytes,
                               request: pb.ListContainersRequest | None = None) -> bytes:
        return self.container_list.reply(
            raw, self.daemon.containers.list_version(), request,
            pb.ListContainersRequest.FromString, self._join_containers)

    def _join_containers(self, request: pb.ListContainersRequest) -> tuple[bytes, bool]:
        flt = request.filter if request.HasField("filter") else None
        reply = b"".join(c.list_item() for c in self.daemon.containers.list_containers(flt))
        return reply, flt is None or not (flt.id or flt.pod_sandbox_id or flt.label_selector)

    async def ContainerStatus(self, request: pb.ContainerStatusRequest,
                              context: Context) -> pb.ContainerStatusResponse:
        mgr = self.daemon.containers
        rec = mgr.get(request.container_id)
        info = await mgr.verbose_info(rec) if request.verbose else {}
        return pb.ContainerStatusResponse(status=mgr.status_proto(rec), info=info)

    def answer_container_status(self, raw: bytes) -> bytes | None:
        """A status read from memory, answered where it is read; a verbose one (it reads
        the bundle) and an unknown id (its error) are the handler's."""
        request = pb.ContainerStatusRequest.FromString(raw)
        mgr = self.daemon.containers
        rec = None if request.verbose else mgr.find(request.container_id)
        if rec is None:
            return None
        return pb.ContainerStatusResponse(status=mgr.status_proto(rec)).SerializeToString()

    async def ReopenContainerLog(self, request: pb.ReopenContainerLogRequest,
                                 context: Context) -> pb.ReopenContainerLogResponse:
        await self.daemon.containers.reopen_log(request.container_id)
        return pb.ReopenContainerLogResponse()

    async def ExecSync(self, request: pb.ExecSyncRequest,
                       context: Context) -> bytearray:
        res = await self.daemon.containers.exec_sync(request.container_id, list(request.cmd),
                                               float(request.timeout))
        # Serialized in the output's own buffer: up to 16 MiB, held once.
        return exec_sync_reply(res.stdout, res.stderr, res.exit_code)
