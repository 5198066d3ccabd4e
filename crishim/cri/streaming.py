"""Exec, Attach and PortForward: validate, register with the streaming server, return a URL.

The session itself happens on the streaming server (crishim.streaming) once the client
connects to the URL; the messages here match what the kubelet's streaming server says.
"""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.node.daemon import Daemon
from crishim.store.sandbox import READY
from crishim.streaming.backend import running_container
from crishim.streaming.interface import AttachRequest, ExecRequest, PortForwardRequest


def _check_streams(container_id: str, tty: bool, stdin: bool, stdout: bool,
                   stderr: bool) -> None:
    if not container_id:
        raise InvalidArgument("missing required container_id")
    if tty and stderr:
        # With a tty stdout and stderr are one stream: multiplexing is not supported.
        raise InvalidArgument("tty and stderr cannot both be true")
    if not (stdin or stdout or stderr):
        raise InvalidArgument("one of stdin, stdout, or stderr must be set")


class StreamingRPCs:
    daemon: Daemon

    async def Exec(self, request: pb.ExecRequest, context: Context) -> pb.ExecResponse:
        _check_streams(request.container_id, request.tty, request.stdin, request.stdout,
                       request.stderr)
        if not request.cmd:
            raise InvalidArgument("exec needs a command (cmd is empty)")
        rec = running_container(self.daemon.containers, request.container_id)
        url = self.daemon.streaming.url_for(ExecRequest(
            rec.id, list(request.cmd), tty=request.tty, stdin=request.stdin,
            stdout=request.stdout, stderr=request.stderr))
        return pb.ExecResponse(url=url)

    async def Attach(self, request: pb.AttachRequest, context: Context) -> pb.AttachResponse:
        _check_streams(request.container_id, request.tty, request.stdin, request.stdout,
                       request.stderr)
        rec = running_container(self.daemon.containers, request.container_id)
        url = self.daemon.streaming.url_for(AttachRequest(
            rec.id, tty=request.tty, stdin=request.stdin, stdout=request.stdout,
            stderr=request.stderr))
        return pb.AttachResponse(url=url)

    async def PortForward(self, request: pb.PortForwardRequest,
                          context: Context) -> pb.PortForwardResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("missing required pod_sandbox_id")
        for port in request.port:
            if not 0 < port < 65536:
                raise InvalidArgument(f"port {port} is out of range (1-65535)")
        sb = self.daemon.sandboxes.get(request.pod_sandbox_id)
        if sb.state != READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready")
        url = self.daemon.streaming.url_for(PortForwardRequest(sb.id, list(request.port)))
        return pb.PortForwardResponse(url=url)
