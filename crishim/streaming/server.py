"""The streaming HTTP server: /exec/<token>, /attach/<token>, /portforward/<token>.

The CRI RPCs register a request with `url_for` and return the URL; the client connects
once, upgrading to SPDY/3.1 or websocket (port-forward also takes SPDY/3.1 tunnelled in a
websocket, as client-go ≥ 1.31 sends it). Unknown, replayed or expired tokens get 404 and
nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

from crishim.config import StreamingConfig
from crishim.log import get_logger
from crishim.observe import tracing
from crishim.streaming import portforward, remotecommand
from crishim.streaming.http1 import BadRequest, Request, read_request, response
from crishim.streaming.interface import (
    AttachRequest,
    ExecBackend,
    ExecRequest,
    PortForwardRequest,
    StreamRequest,
)
from crishim.streaming.spdy import SpdyConnection
from crishim.streaming.tokens import TOKEN_TTL, TokenStore
from crishim.streaming.tunnel import MessageReader, MessageWriter, tunnel_protocols, tunnelled
from crishim.streaming.websocket import WebSocket, accept_key

log = get_logger(__name__)

KINDS: dict[str, type] = {"exec": ExecRequest, "attach": AttachRequest,
                          "portforward": PortForwardRequest}


def negotiate(client: list[str], server: list[str]) -> str | None:
    """The first protocol in the client's order of preference that we speak."""
    for proto in client:
        if proto in server:
            return proto
    return None


def _describe(request: StreamRequest) -> dict[str, object]:
    if isinstance(request, PortForwardRequest):
        return {"kind": "portforward", "pod": request.pod_id}
    kind = "exec" if isinstance(request, ExecRequest) else "attach"
    return {"kind": kind, "container": request.container_id, "tty": request.tty}


def _span_attrs(request: StreamRequest) -> dict[str, object]:
    if isinstance(request, PortForwardRequest):
        return {"cri.pod_sandbox_id": request.pod_id}
    return {"cri.container_id": request.container_id, "streaming.tty": request.tty}


class StreamingServer:
    def __init__(self, cfg: StreamingConfig, backend: ExecBackend,
                 token_ttl: float = TOKEN_TTL,
                 stream_creation_timeout: float = 30.0) -> None:
        self.cfg = cfg
        self.backend = backend
        # Each request with the trace context of the call that asked for it (tracing on).
        self.tokens: TokenStore[tuple[StreamRequest, object | None]] = \
            TokenStore(ttl=token_ttl)
        self.stream_creation_timeout = stream_creation_timeout
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.port = 0
        self.scheme = "https" if cfg.tls_cert else "http"

    async def start(self) -> None:
        ctx: ssl.SSLContext | None = None
        if self.cfg.tls_cert:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key or None)
        self._server = await asyncio.start_server(self._on_connection, self.cfg.address,
                                                  self.cfg.port, ssl=ctx, limit=64 * 1024)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("streaming server listening", url=self.base_url)

    @property
    def base_url(self) -> str:
        host = self.cfg.address
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"

    def url_for(self, request: StreamRequest) -> str:
        kind = next(k for k, cls in KINDS.items() if isinstance(request, cls))
        return f"{self.base_url}/{kind}/{self.tokens.put((request, tracing.carry()))}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, OSError) as exc:
            log.debug("streaming connection ended", error=str(exc))
        except asyncio.CancelledError:
            # Server stop: end quietly (asyncio's stream callback logs cancelled handlers).
            pass
        except Exception:
            log.exception("streaming connection failed")
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), 2)

    async def _reply(self, writer: asyncio.StreamWriter, status: int, body: str,
                     headers: list[tuple[str, str]] | None = None) -> None:
        writer.write(response(status, headers, body + "\n"))
        await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = await read_request(reader)
        except BadRequest as exc:
            await self._reply(writer, 400, str(exc))
            return
        parts = req.path.strip("/").split("/")
        if len(parts) != 2 or parts[0] not in KINDS:
            await self._reply(writer, 404, "not found")
            return
        if req.method not in ("GET", "POST"):
            await self._reply(writer, 405, f"method {req.method} is not allowed")
            return
        kind, token = parts
        taken = self.tokens.take(token)
        if taken is None or not isinstance(taken[0], KINDS[kind]):
            # Unknown, used or expired: nothing runs.
            await self._reply(writer, 404, "unknown or expired streaming token")
            return
        request, parent = taken
        # The session's span continues the Exec/Attach/PortForward call's trace.
        with tracing.resumed(parent, f"streaming {kind}", **_span_attrs(request)):
            upgrade = req.header_list("upgrade")
            if any(u.lower() == "websocket" for u in upgrade) and \
                    req.has_token("connection", "upgrade"):
                await self._websocket(req, request, reader, writer)
            elif any(u.lower().startswith("spdy/3.1") for u in upgrade):
                await self._spdy(req, request, reader, writer)
            else:
                await self._reply(writer, 400,
                                  "streaming needs an upgrade to SPDY/3.1 or websocket")

    async def _spdy(self, req: Request, request: StreamRequest, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        is_pf = isinstance(request, PortForwardRequest)
        server_protocols = (portforward.SPDY_PROTOCOLS if is_pf
                            else remotecommand.SPDY_PROTOCOLS)
        client = req.header_list("x-stream-protocol-version")
        if not client:
            # Clients that predate negotiation speak the oldest protocol.
            chosen = portforward.PROTOCOL if is_pf else remotecommand.V1
        else:
            found = negotiate(client, server_protocols)
            if found is None:
                await self._reply(
                    writer, 403,
                    f"unable to upgrade: unable to negotiate protocol: client supports "
                    f"{client}, server accepts {server_protocols}",
                    [("X-Accepted-Stream-Protocol-Versions", p) for p in server_protocols])
                return
            chosen = found
        headers = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]
        if client:
            headers.append(("X-Stream-Protocol-Version", chosen))
        writer.write(response(101, headers))
        await writer.drain()
        await self._spdy_session(SpdyConnection(reader, writer, self.cfg.idle_timeout),
                                 "spdy", chosen, request)

    async def _spdy_session(self, conn: SpdyConnection, transport: str, protocol: str,
                            request: StreamRequest) -> None:
        log.info("streaming session", transport=transport, protocol=protocol,
                 **_describe(request))
        if isinstance(request, PortForwardRequest):
            await portforward.serve_spdy(conn, request, self.backend,
                                         self.stream_creation_timeout)
        else:
            await remotecommand.serve_spdy(conn, protocol, request, self.backend,
                                           self.stream_creation_timeout)

    async def _websocket(self, req: Request, request: StreamRequest,
                         reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = req.header("sec-websocket-key")
        if not key or req.header("sec-websocket-version") != "13":
            await self._reply(writer, 400, "websocket upgrade needs Sec-WebSocket-Key and "
                                           "Sec-WebSocket-Version: 13",
                              [("Sec-WebSocket-Version", "13")])
            return
        is_pf = isinstance(request, PortForwardRequest)
        server_protocols = (portforward.WS_PROTOCOLS + tunnel_protocols(portforward.SPDY_PROTOCOLS)
                            if is_pf else remotecommand.WS_PROTOCOLS)
        client = req.header_list("sec-websocket-protocol")
        chosen = ""
        if client:
            found = negotiate(client, server_protocols)
            if found is None:
                await self._reply(writer, 400,
                                  f"unable to negotiate a websocket subprotocol: client "
                                  f"supports {client}, server accepts {server_protocols}")
                return
            chosen = found
        inner = tunnelled(chosen)
        ports: list[int] = []
        if isinstance(request, PortForwardRequest) and inner is None:
            try:
                ports = request.ports or portforward.ports_from_query(req.query)
            except ValueError as exc:
                await self._reply(writer, 400, str(exc))
                return
            if not ports:
                await self._reply(writer, 400, "port forwarding over websocket needs ports "
                                               "(in the request or ?port=)")
                return
        headers = [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                   ("Sec-WebSocket-Accept", accept_key(key))]
        if chosen:
            headers.append(("Sec-WebSocket-Protocol", chosen))
        writer.write(response(101, headers))
        await writer.drain()
        ws = WebSocket(reader, writer)
        if inner is not None:
            # SPDY inside the WebSocket: the SPDY session's own idle watchdog applies.
            conn = SpdyConnection(MessageReader(ws), MessageWriter(ws), self.cfg.idle_timeout)
            await self._spdy_session(conn, "spdy-over-websocket", inner, request)
            return
        log.info("streaming session", transport="websocket", protocol=chosen or "(none)",
                 **_describe(request))
        watchdog = asyncio.create_task(self._ws_idle(ws))
        try:
            if isinstance(request, PortForwardRequest):
                await portforward.serve_websocket(ws, ports, request.pod_id, self.backend)
            else:
                await remotecommand.serve_websocket(ws, chosen or remotecommand.V1, request,
                                                    self.backend)
        finally:
            watchdog.cancel()

    async def _ws_idle(self, ws: WebSocket) -> None:
        while True:
            remaining = ws.last_activity + self.cfg.idle_timeout - time.monotonic()
            if remaining <= 0:
                log.info("closing idle websocket", idle_timeout=self.cfg.idle_timeout)
                # Closing the transport ends recv(); the session sees the client gone.
                ws.writer.close()
                return
            await asyncio.sleep(min(remaining, 60.0))
