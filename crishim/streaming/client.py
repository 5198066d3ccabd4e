"""Client side of the streaming protocols: used by the tests and for manual debugging.

`exec_spdy` / `exec_websocket` run a remotecommand session against a streaming URL the way
kubectl/crictl do; `SpdyPortForward` (over SPDY or SPDY tunnelled in a websocket) and
`websocket_portforward` forward connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from crishim.streaming.http1 import MAX_HEAD
from crishim.streaming.spdy import SpdyConnection, SpdyStream
from crishim.streaming.tunnel import MessageReader, MessageWriter, tunnel_protocols
from crishim.streaming.websocket import OP_BINARY, WebSocket, accept_key, new_key


class UpgradeFailed(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body.strip()}")
        self.status = status
        self.body = body


async def _open(url: str, headers: Sequence[tuple[str, str]]
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, list[str]]]:
    parts = urlsplit(url)
    ctx = None
    if parts.scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    port = parts.port or (443 if ctx else 80)
    reader, writer = await asyncio.open_connection(parts.hostname, port, ssl=ctx,
                                                   limit=256 * 1024)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", *(f"{k}: {v}" for k, v in headers)]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n"))[:MAX_HEAD].decode("latin-1")
    status_line, *rest = head.split("\r\n")
    status = int(status_line.split(" ")[1])
    resp: dict[str, list[str]] = {}
    for line in rest:
        if ":" in line:
            k, _, v = line.partition(":")
            resp.setdefault(k.strip().lower(), []).append(v.strip())
    if status != 101:
        length = int(resp.get("content-length", ["0"])[0])
        body = (await reader.readexactly(length)).decode(errors="replace") if length else ""
        writer.close()
        raise UpgradeFailed(status, body)
    return reader, writer, resp


async def spdy_connect(url: str, protocols: Sequence[str], flow_control: bool = True
                       ) -> tuple[SpdyConnection, str, asyncio.Task[None]]:
    """Upgrade to SPDY/3.1; returns the connection, the negotiated protocol, its reader."""
    headers = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
               *(("X-Stream-Protocol-Version", p) for p in protocols)]
    reader, writer, resp = await _open(url, headers)
    conn = SpdyConnection(reader, writer, idle_timeout=3600, client=True,
                          grant_windows=flow_control)
    if flow_control:
        await conn.announce_flow_control()
    task = asyncio.create_task(conn.serve())
    return conn, resp.get("x-stream-protocol-version", [""])[0], task


async def websocket_connect(url: str, protocols: Sequence[str]) -> tuple[WebSocket, str]:
    key = new_key()
    headers = [("Connection", "Upgrade"), ("Upgrade", "websocket"),
               ("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", key)]
    if protocols:
        headers.append(("Sec-WebSocket-Protocol", ", ".join(protocols)))
    reader, writer, resp = await _open(url, headers)
    if resp.get("sec-websocket-accept", [""])[0] != accept_key(key):
        writer.close()
        raise UpgradeFailed(101, "bad Sec-WebSocket-Accept")
    return WebSocket(reader, writer, client=True), resp.get("sec-websocket-protocol", [""])[0]


@dataclass
class ExecResult:
    stdout: bytes = b""
    stderr: bytes = b""
    error: bytes = b""  # raw error-channel payload
    protocol: str = ""
    # chunks of stdout as they arrived (for tests that care about interleaving)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def status(self) -> dict[str, Any]:
        return json.loads(self.error) if self.error else {}

    @property
    def exit_code(self) -> int:
        st = self.status
        if not st or st.get("status") == "Success":
            return 0
        for cause in st.get("details", {}).get("causes", []):
            if cause.get("reason") == "ExitCode":
                return int(cause["message"])
        return -1


async def _drain(stream: SpdyStream, result: ExecResult, attr: str) -> None:
    buf = bytearray()  # not bytes +=: that copies everything per chunk
    while data := await stream.read():
        buf += data
        if attr == "stdout":
            result.chunks.append(data)
    setattr(result, attr, bytes(buf))


async def exec_spdy(url: str, *, stdin: bytes | None = None, stdout: bool = True,
                    stderr: bool = True, tty: bool = False,
                    resize: Sequence[tuple[int, int]] = (),
                    protocols: Sequence[str] = ("v4.channel.k8s.io",),
                    flow_control: bool = True, stdin_delay: float = 0.0) -> ExecResult:
    conn, proto, reader = await spdy_connect(url, protocols, flow_control)
    result = ExecResult(protocol=proto)
    try:
        err = await conn.open_stream({"streamType": "error"})
        await err.close()
        tasks = [asyncio.create_task(_drain(err, result, "error"))]
        if stdin is not None:
            sin = await conn.open_stream({"streamType": "stdin"})
        if stdout:
            out = await conn.open_stream({"streamType": "stdout"})
            await out.close()
            tasks.append(asyncio.create_task(_drain(out, result, "stdout")))
        if stderr and not tty:
            serr = await conn.open_stream({"streamType": "stderr"})
            await serr.close()
            tasks.append(asyncio.create_task(_drain(serr, result, "stderr")))
        if tty and proto not in ("v2.channel.k8s.io", "channel.k8s.io"):
            rs = await conn.open_stream({"streamType": "resize"})
            for w, h in resize:
                await rs.write(json.dumps({"Width": w, "Height": h}).encode())
        if stdin is not None:
            if stdin_delay:
                await asyncio.sleep(stdin_delay)
            await sin.write(stdin)
            await sin.close()
        await asyncio.gather(*tasks)
    finally:
        await conn.shutdown()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
    return result


async def exec_websocket(url: str, *, stdin: bytes | None = None,
                         resize: Sequence[tuple[int, int]] = (),
                         protocols: Sequence[str] = ("v5.channel.k8s.io",)) -> ExecResult:
    ws, proto = await websocket_connect(url, protocols)
    result = ExecResult(protocol=proto)
    try:
        for w, h in resize:
            await ws.send(b"\x04" + json.dumps({"Width": w, "Height": h}).encode())
        if stdin is not None:
            await ws.send(b"\x00" + stdin)
            if proto == "v5.channel.k8s.io":
                await ws.send(b"\xff\x00")  # v5: stdin is closed
        bufs: dict[int, bytearray] = {1: bytearray(), 2: bytearray(), 3: bytearray()}
        while (msg := await ws.recv()) is not None:
            _, data = msg
            if not data or data[0] not in bufs:
                continue
            bufs[data[0]] += data[1:]
            if data[0] == 1 and len(data) > 1:
                result.chunks.append(data[1:])
        result.stdout, result.stderr, result.error = (bytes(bufs[i]) for i in (1, 2, 3))
    finally:
        await ws.shutdown(read=True, wait=1.0)
    return result


class SpdyPortForward:
    """One SPDY connection; `dial(port)` opens a forwarded connection (data+error pair)."""

    def __init__(self, conn: SpdyConnection, reader: asyncio.Task[None]) -> None:
        self.conn = conn
        self.reader = reader
        self._next = 0

    @classmethod
    async def connect(cls, url: str, flow_control: bool = True) -> SpdyPortForward:
        conn, _, reader = await spdy_connect(url, ["portforward.k8s.io"], flow_control)
        return cls(conn, reader)

    @classmethod
    async def connect_tunnel(cls, url: str) -> SpdyPortForward:
        """The same session tunnelled through a websocket (client-go ≥ 1.31)."""
        wanted = tunnel_protocols(["portforward.k8s.io"])
        ws, chosen = await websocket_connect(url, wanted)
        if chosen not in wanted:
            await ws.shutdown(wait=0.5)
            raise UpgradeFailed(101, f"server chose subprotocol {chosen!r}, not {wanted}")
        conn = SpdyConnection(MessageReader(ws), MessageWriter(ws), idle_timeout=3600,
                              client=True)
        await conn.announce_flow_control()
        return cls(conn, asyncio.create_task(conn.serve()))

    async def dial(self, port: int) -> tuple[SpdyStream, SpdyStream]:
        """(data, error) streams for one forwarded connection."""
        rid = str(self._next)
        self._next += 1
        err = await self.conn.open_stream({"streamType": "error", "port": str(port),
                                           "requestID": rid})
        await err.close()
        data = await self.conn.open_stream({"streamType": "data", "port": str(port),
                                            "requestID": rid})
        return data, err

    async def request(self, port: int, payload: bytes) -> tuple[bytes, bytes]:
        """Send payload, half-close, read the whole answer: (data, error text)."""
        data, err = await self.dial(port)
        await data.write(payload)
        await data.close()
        out = bytearray()
        while chunk := await data.read():
            out += chunk
        errtext = bytearray()
        while chunk := await err.read():
            errtext += chunk
        return bytes(out), bytes(errtext)

    async def close(self) -> None:
        await self.conn.shutdown()
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader


async def websocket_portforward(url: str, port: int, payload: bytes,
                                protocols: Sequence[str] = ("v4.channel.k8s.io",)
                                ) -> tuple[bytes, bytes]:
    """Forward one port over websocket: send payload, collect (data, error) until close."""
    ws, _ = await websocket_connect(url, protocols)
    data, err = bytearray(), bytearray()
    seen = {0: False, 1: False}
    try:
        await ws.send(b"\x00" + payload, OP_BINARY)
        while (msg := await ws.recv()) is not None:
            raw = msg[1]
            if not raw or raw[0] > 1:
                continue
            channel, body = raw[0], raw[1:]
            if not seen[channel]:
                # The first message of each channel starts with the port (little endian).
                seen[channel] = True
                if struct.unpack("<H", body[:2])[0] != port:
                    raise AssertionError(f"port prefix {body[:2]!r} is not {port}")
                body = body[2:]
            (data if channel == 0 else err).extend(body)
    finally:
        await ws.shutdown(read=True, wait=1.0)
    return bytes(data), bytes(err)
