"""Exec and attach sessions (the Kubernetes "remotecommand" protocols) over SPDY and WebSocket.

SPDY (what kubectl/crictl use by default): the client opens one stream per channel with a
`streamType` header (error, stdin, stdout, stderr, resize). We wait for the streams the
request needs, run the command, then report the outcome on the error stream: from v4 on as
a JSON metav1.Status, before that as plain text and only on failure.

WebSocket: one connection, every message prefixed with a channel byte (0 stdin, 1 stdout,
2 stderr, 3 error, 4 resize). v5 adds channel 255 from the client: [255, n] = channel n is
closed (stdin EOF). base64 variants carry the channel as an ASCII digit and base64 text.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from crishim.log import get_logger
from crishim.streaming.interface import (
    AttachRequest,
    ByteSource,
    ExecBackend,
    ExecRequest,
    TerminalSize,
)
from crishim.streaming.pipe import Pipe, SafeSink
from crishim.streaming.spdy import SpdyConnection, SpdyStream
from crishim.streaming.websocket import OP_BINARY, OP_TEXT, WebSocket, WebSocketError

log = get_logger(__name__)

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
V3 = "v3.channel.k8s.io"
V2 = "v2.channel.k8s.io"
V1 = "channel.k8s.io"
# SPDY: v5 behaves like v4 (its close signal is a websocket feature).
SPDY_PROTOCOLS = [V5, V4, V3, V2, V1]
WS_V4_BASE64 = "v4.base64.channel.k8s.io"
WS_V1_BASE64 = "base64.channel.k8s.io"
WS_PROTOCOLS = [V5, V4, WS_V4_BASE64, V1, WS_V1_BASE64]

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
WS_CLOSE_SIGNAL = 255
WS_CHUNK = 32 * 1024
STREAM_CREATION_TIMEOUT = 30.0

Request = ExecRequest | AttachRequest


# ---------------------------------------------------------------- status


def status_success() -> dict[str, Any]:
    return {"metadata": {}, "status": "Success"}


def status_exit(code: int) -> dict[str, Any]:
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def status_internal(error: str) -> dict[str, Any]:
    msg = f"error executing command in container: {error}"
    return {"metadata": {}, "status": "Failure", "message": f"Internal error occurred: {msg}",
            "reason": "InternalError", "details": {"causes": [{"message": msg}]}, "code": 500}


def encode_status(status: dict[str, Any], json_status: bool) -> bytes:
    """The error-channel payload: JSON (v4+) or the message text on failure (v1-v3)."""
    if json_status:
        return json.dumps(status, separators=(",", ":")).encode()
    if status["status"] == "Success":
        return b""
    return str(status["message"]).encode()


# ---------------------------------------------------------------- running


def effective_streams(req: Request) -> tuple[bool, bool, bool]:
    """(stdin, stdout, stderr) as the session uses them: a tty has no separate stderr."""
    return req.stdin, req.stdout, req.stderr and not req.tty


async def resize_events(src: ByteSource) -> AsyncIterator[TerminalSize]:
    """Decode a stream of concatenated JSON {"Width":..,"Height":..} objects."""
    decoder = json.JSONDecoder()
    buf = ""
    while True:
        chunk = await src.read(4096)
        if not chunk:
            return
        buf += chunk.decode(errors="replace")
        while True:
            buf = buf.lstrip()
            if not buf:
                break
            try:
                obj, end = decoder.raw_decode(buf)
            except json.JSONDecodeError:
                if len(buf) > 4096:
                    return  # garbage, not a partial object
                break
            buf = buf[end:]
            if isinstance(obj, dict):
                with contextlib.suppress(TypeError, ValueError):
                    yield TerminalSize(int(obj.get("Width", 0)), int(obj.get("Height", 0)))


async def _queue_events(queue: asyncio.Queue[TerminalSize | None]) -> AsyncIterator[TerminalSize]:
    while (size := await queue.get()) is not None:
        yield size


async def run_session(req: Request, backend: ExecBackend, stdin: ByteSource | None,
                      stdout: SafeSink | None, stderr: SafeSink | None,
                      resize: AsyncIterator[TerminalSize] | None,
                      client_gone: asyncio.Event) -> dict[str, Any]:
    """Run the exec/attach; return the Status to report. Client gone = cancel (kill)."""
    if isinstance(req, ExecRequest):
        work: asyncio.Task[Any] = asyncio.create_task(
            backend.exec(req.container_id, req.cmd, req.tty, stdin, stdout, stderr, resize))
    else:
        work = asyncio.create_task(
            backend.attach(req.container_id, req.tty, stdin, stdout, stderr, resize))
    gone = asyncio.create_task(client_gone.wait())
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            # The client went away (or we are shutting down): stop the process.
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            log.info("streaming client went away; session stopped",
                     container=req.container_id)
    if work.cancelled():
        return status_internal("client went away")
    exc = work.exception()
    if exc is not None:
        log.warning("streaming session failed", container=req.container_id, error=str(exc))
        return status_internal(str(exc))
    code = work.result() if isinstance(req, ExecRequest) else 0
    if code:
        return status_exit(int(code))
    return status_success()


# ---------------------------------------------------------------- SPDY


async def serve_spdy(conn: SpdyConnection, protocol: str, req: Request,
                     backend: ExecBackend,
                     stream_timeout: float = STREAM_CREATION_TIMEOUT) -> None:
    """Drive one exec/attach over an upgraded SPDY connection until it is done."""
    reader = asyncio.create_task(conn.serve())
    try:
        await _spdy_session(conn, protocol, req, backend, stream_timeout)
    finally:
        await conn.shutdown()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


async def _spdy_session(conn: SpdyConnection, protocol: str, req: Request,
                        backend: ExecBackend, stream_timeout: float) -> None:
    want_in, want_out, want_err = effective_streams(req)
    resizing = req.tty and protocol not in (V2, V1)
    expected = 1 + want_in + want_out + want_err + resizing
    streams: dict[str, SpdyStream] = {}
    try:
        async with asyncio.timeout(stream_timeout):
            while len(streams) < expected:
                stream = await conn.accept()
                if stream is None:
                    return  # client left before the session started
                kind = stream.header("streamtype")
                if kind not in ("error", "stdin", "stdout", "stderr", "resize") or \
                        kind in streams:
                    log.debug("unexpected spdy stream", stream_type=kind)
                    await stream.reset()
                    continue
                streams[kind] = stream
    except TimeoutError:
        log.warning("timed out waiting for client to create streams",
                    have=sorted(streams), expected=expected)
        return
    error = streams.get("error")
    # stdin and resize are never half-closed from our side: spdystream (crictl, kubectl)
    # answers our FIN with one of its own and then stops delivering what the user types.
    stdout = SafeSink(streams["stdout"]) if "stdout" in streams else None
    stderr = SafeSink(streams["stderr"]) if "stderr" in streams else None
    resize = resize_events(streams["resize"]) if "resize" in streams else None
    status = await run_session(req, backend, streams.get("stdin"), stdout, stderr, resize,
                               conn.closed)
    if conn.closed.is_set():
        return
    for sink in (stdout, stderr):
        if sink is not None:
            await sink.close()
    if error is not None:
        payload = encode_status(status, json_status=protocol in (V5, V4))
        err_sink = SafeSink(error)
        await err_sink.write(payload)
        await err_sink.close()


# ---------------------------------------------------------------- WebSocket


class WsChannelSink:
    def __init__(self, ws: WebSocket, channel: int, b64: bool) -> None:
        self.ws = ws
        self.channel = channel
        self.b64 = b64

    async def write(self, data: bytes) -> None:
        for i in range(0, max(len(data), 1), WS_CHUNK):
            await self.ws_send(data[i:i + WS_CHUNK])

    async def ws_send(self, chunk: bytes) -> None:
        if self.b64:
            await self.ws.send(str(self.channel).encode() + base64.b64encode(chunk), OP_TEXT)
        else:
            await self.ws.send(bytes([self.channel]) + chunk, OP_BINARY)

    async def close(self) -> None:
        pass  # the end of the session closes the websocket


def decode_ws_message(opcode: int, data: bytes) -> tuple[int, bytes] | None:
    if not data:
        return None
    if opcode == OP_TEXT:
        try:
            return int(chr(data[0])), base64.b64decode(data[1:])
        except ValueError:
            return None
    return data[0], data[1:]


async def serve_websocket(ws: WebSocket, protocol: str, req: Request,
                          backend: ExecBackend) -> None:
    b64 = "base64" in protocol
    want_in, want_out, want_err = effective_streams(req)
    stdin = Pipe() if want_in else None
    sizes: asyncio.Queue[TerminalSize | None] = asyncio.Queue(maxsize=16)

    async def read_loop() -> None:
        resize_buf = Pipe()
        decoder = asyncio.create_task(_pump_sizes(resize_buf, sizes))
        try:
            while (msg := await ws.recv()) is not None:
                decoded = decode_ws_message(*msg)
                if decoded is None:
                    continue
                channel, payload = decoded
                if channel == STDIN and stdin is not None:
                    await stdin.feed(payload)
                elif channel == RESIZE:
                    await resize_buf.feed(payload)
                elif channel == WS_CLOSE_SIGNAL and protocol == V5 and payload:
                    if payload[0] == STDIN and stdin is not None:
                        stdin.feed_eof()
                    elif payload[0] == RESIZE:
                        resize_buf.feed_eof()
        finally:
            if stdin is not None:
                stdin.feed_eof()
            resize_buf.feed_eof()
            with contextlib.suppress(BaseException):
                await decoder

    reader = asyncio.create_task(read_loop())
    try:
        stdout = SafeSink(WsChannelSink(ws, STDOUT, b64)) if want_out else None
        stderr = SafeSink(WsChannelSink(ws, STDERR, b64)) if want_err else None
        errors = SafeSink(WsChannelSink(ws, ERROR, b64))
        # An empty message on the lowest writable channel tells the client we are ready.
        ready = STDOUT if want_out else STDERR if want_err else ERROR
        await WsChannelSink(ws, ready, b64).write(b"")
        resize = _queue_events(sizes) if req.tty else None
        status = await run_session(req, backend, stdin, stdout, stderr, resize, ws.peer_gone)
        if not ws.peer_gone.is_set():
            payload = encode_status(status, json_status=protocol in (V5, V4, WS_V4_BASE64))
            if payload:
                await errors.write(payload)
    except (WebSocketError, OSError) as exc:
        log.debug("websocket session ended", error=str(exc))
    finally:
        await ws.shutdown()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


async def _pump_sizes(src: Pipe, queue: asyncio.Queue[TerminalSize | None]) -> None:
    try:
        async for size in resize_events(src):
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()  # only the latest size matters
            queue.put_nowait(size)
    finally:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)
