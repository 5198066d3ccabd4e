"""Port forwarding (portforward.k8s.io) over SPDY and WebSocket.

SPDY: for every forwarded connection the client opens a pair of streams that share a
`requestID` header: `streamType: error` and `streamType: data`, both with a `port` header.
Each complete pair gets its own connection into the pod; many pairs run concurrently on
one SPDY connection. Failures are reported on the pair's error stream.

WebSocket: the ports are fixed up front (the CRI request, or `?port=` query parameters);
port i uses channel 2i for data and 2i+1 for errors, and the first message we send on
each channel starts with the port number as 2 little-endian bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Coroutine
from typing import Any

from crishim.log import get_logger
from crishim.streaming.interface import ByteSink, ByteSource, ExecBackend, PortForwardRequest
from crishim.streaming.pipe import Pipe, SafeSink, StreamWriterSink, copy
from crishim.streaming.spdy import SpdyConnection, SpdyStream
from crishim.streaming.websocket import OP_BINARY, WebSocket, WebSocketError

log = get_logger(__name__)

PROTOCOL = "portforward.k8s.io"
SPDY_PROTOCOLS = [PROTOCOL]
WS_PROTOCOLS = ["v4.channel.k8s.io", PROTOCOL]
STREAM_CREATION_TIMEOUT = 30.0
WS_CHUNK = 32 * 1024


def validate_stream(stream: SpdyStream) -> str | None:
    """Reject (reset) a stream whose headers cannot make a port-forward pair."""
    port = stream.header("port")
    if not port:
        return '"port" header is required'
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"unable to parse {port!r} as a port"
    kind = stream.header("streamtype")
    if kind not in ("error", "data"):
        return f"invalid stream type {kind!r}" if kind else '"streamType" header is required'
    return None


def _request_id(stream: SpdyStream) -> str:
    rid = stream.header("requestid")
    if rid:
        return rid
    # Old clients send no requestID: their error and data streams have consecutive ids.
    return str(stream.id if stream.header("streamtype") == "error" else stream.id - 2)


async def splice(backend_reader: asyncio.StreamReader, backend_writer: asyncio.StreamWriter,
                 client_in: ByteSource, client_out: ByteSink) -> None:
    """Copy both ways until the pod side ends (or the client aborts).

    Client EOF half-closes the pod socket, so a request/response exchange still gets its
    response; pod EOF ends the forwarded connection.
    """

    async def upstream() -> None:
        await copy(client_in, StreamWriterSink(backend_writer).write)
        await StreamWriterSink(backend_writer).close()
        await asyncio.Event().wait()  # keep going until downstream ends

    up = asyncio.create_task(upstream())
    try:
        down = asyncio.create_task(copy(backend_reader, client_out.write))
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in (up, down):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(up, down, return_exceptions=True)
        backend_writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(backend_writer.wait_closed(), 2)


# ---------------------------------------------------------------- SPDY


class _Pair:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.data: SpdyStream | None = None
        self.error: SpdyStream | None = None
        self.complete = asyncio.Event()


async def serve_spdy(conn: SpdyConnection, req: PortForwardRequest, backend: ExecBackend,
                     stream_timeout: float = STREAM_CREATION_TIMEOUT) -> None:
    conn.validator = validate_stream
    reader = asyncio.create_task(conn.serve())
    pairs: dict[str, _Pair] = {}
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def monitor(pair: _Pair) -> None:
        try:
            await asyncio.wait_for(pair.complete.wait(), stream_timeout)
        except TimeoutError:
            msg = f"timed out waiting for streams of request {pair.request_id}"
            log.warning("port-forward stream pair incomplete", request=pair.request_id)
            if pair.error is not None:
                await SafeSink(pair.error).write(msg.encode())
                await SafeSink(pair.error).close()
            if pair.data is not None:
                await pair.data.reset()
        finally:
            pairs.pop(pair.request_id, None)

    try:
        while (stream := await conn.accept()) is not None:
            rid = _request_id(stream)
            pair = pairs.get(rid)
            if pair is None:
                pair = pairs[rid] = _Pair(rid)
                spawn(monitor(pair))
            kind = stream.header("streamtype")
            if getattr(pair, kind) is not None:
                msg = f"error processing stream for request {rid}: {kind} stream already assigned"
                if pair.error is not None:
                    await SafeSink(pair.error).write(msg.encode())
                await stream.reset()
                continue
            setattr(pair, kind, stream)
            if pair.data is not None and pair.error is not None:
                pair.complete.set()
                spawn(_forward_pair(req.pod_id, backend, pair.data, pair.error))
    finally:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await conn.shutdown()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


async def _forward_pair(pod_id: str, backend: ExecBackend, data: SpdyStream,
                        error: SpdyStream) -> None:
    port = int(data.header("port"))
    err_sink = SafeSink(error)
    try:
        r, w = await backend.port_forward(pod_id, port)
        await splice(r, w, data, data)
    except (ConnectionError, OSError) as exc:
        # EPIPE/ECONNRESET end this connection only; anything else asks the client to
        # give up on the whole session (kubelet's closeConnection hint).
        fatal = not isinstance(exc, BrokenPipeError | ConnectionResetError)
        msg = f"error forwarding port {port} to pod {pod_id}: {exc}"
        log.info("port-forward connection failed", pod=pod_id, port=port, error=str(exc))
        body = {"closeConnection": True, "message": msg} if fatal else {"message": msg}
        await err_sink.write(json.dumps(body).encode() + b"\n")
    except Exception as exc:
        log.exception("port-forward failed", pod=pod_id, port=port)
        body = {"closeConnection": True, "message": f"error forwarding port {port}: {exc}"}
        await err_sink.write(json.dumps(body).encode() + b"\n")
    finally:
        await SafeSink(data).close()
        await err_sink.close()


# ---------------------------------------------------------------- WebSocket


class _WsSink:
    def __init__(self, ws: WebSocket, channel: int) -> None:
        self.ws = ws
        self.channel = channel

    async def write(self, data: bytes) -> None:
        for i in range(0, len(data), WS_CHUNK):
            await self.ws.send(bytes([self.channel]) + data[i:i + WS_CHUNK], OP_BINARY)

    async def close(self) -> None:
        pass


def ports_from_query(query: dict[str, list[str]]) -> list[int]:
    ports = []
    for value in query.get("port", []):
        for part in value.split(","):
            if not part.strip().isdigit() or not 0 < int(part) < 65536:
                raise ValueError(f"invalid port {part!r}")
            ports.append(int(part))
    return ports


async def serve_websocket(ws: WebSocket, ports: list[int], pod_id: str,
                          backend: ExecBackend) -> None:
    pipes = [Pipe() for _ in ports]

    async def read_loop() -> None:
        try:
            while (msg := await ws.recv()) is not None:
                data = msg[1]
                if not data:
                    continue
                channel = data[0]
                index, is_error = divmod(channel, 2)
                if index < len(pipes) and not is_error:
                    await pipes[index].feed(data[1:])
        finally:
            for p in pipes:
                p.feed_eof()

    async def one(index: int, port: int) -> None:
        data = SafeSink(_WsSink(ws, 2 * index))
        error = SafeSink(_WsSink(ws, 2 * index + 1))
        prefix = struct.pack("<H", port)
        await data.write(prefix)
        await error.write(prefix)
        try:
            r, w = await backend.port_forward(pod_id, port)
            await splice(r, w, pipes[index], data)
        except (ConnectionError, OSError) as exc:
            await error.write(f"error forwarding port {port} to pod {pod_id}: {exc}".encode())
        finally:
            pipes[index].abort()

    reader = asyncio.create_task(read_loop())
    workers = [asyncio.create_task(one(i, p)) for i, p in enumerate(ports)]
    try:
        # Run until every port is done, or the client leaves first.
        gone: asyncio.Future[Any] = asyncio.ensure_future(ws.peer_gone.wait())
        all_done: asyncio.Future[Any] = asyncio.gather(*workers, return_exceptions=True)
        await asyncio.wait({gone, all_done}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
    except (WebSocketError, OSError) as exc:
        log.debug("websocket port-forward ended", error=str(exc))
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await ws.shutdown()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
