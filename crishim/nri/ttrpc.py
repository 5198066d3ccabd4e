"""ttRPC on the event loop: the small RPC protocol NRI's services speak.

A message is a 10-byte header (payload length u32, stream id u32, type u8, flags u8, all
big-endian) and a protobuf payload of at most 4 MiB. A call is one stream: the client
sends a `Request` (service, method, payload, timeout) on a new odd stream id, the server
answers with a `Response` (a google.rpc.Status-shaped status, or the reply's payload) on
the same id. NRI uses unary calls only, so streaming (data messages) is refused as the
reference server refuses data for a stream it does not know.

Both ends read from anything with `readexactly` and write through a callable that takes
one whole message: header and payload go out in one write, as the reference flushes
them, so that over NRI's multiplexer a message is one mux frame.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

from crishim.api.ttrpc import ttrpc_pb2
from crishim.log import get_logger

log = get_logger(__name__)

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size  # 10
MAX_MESSAGE = 4 << 20

TYPE_REQUEST = 0x1
TYPE_RESPONSE = 0x2
TYPE_DATA = 0x3

FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4

# Status codes on the wire (google.rpc.Code numbering, which ttRPC uses).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

M = TypeVar("M", bound=Message)


class Reader(Protocol):
    async def readexactly(self, n: int) -> bytes: ...


Writer = Callable[[bytes], None]


class TTRPCError(Exception):
    """A call's non-OK status, or a local failure given the status it maps to."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"ttrpc status {self.code}: {self.message}"


class ProtocolError(Exception):
    """The peer broke the framing; the connection cannot be used any more."""


class ConnectionClosed(TTRPCError):
    def __init__(self, message: str = "ttrpc: connection closed") -> None:
        super().__init__(UNAVAILABLE, message)


def frame(stream_id: int, mtype: int, flags: int, payload: bytes) -> bytes:
    """One message: header and payload."""
    return HEADER.pack(len(payload), stream_id, mtype, flags) + payload


@dataclass(frozen=True)
class Header:
    length: int
    stream_id: int
    type: int
    flags: int


async def read_message(reader: Reader) -> tuple[Header, bytes | None]:
    """The next message; its payload is None when it exceeds MAX_MESSAGE (the payload is
    read and dropped, so the stream stays in step, as the reference does)."""
    length, sid, mtype, flags = HEADER.unpack(await reader.readexactly(HEADER_LEN))
    hdr = Header(length, sid, mtype, flags)
    if length > MAX_MESSAGE:
        left = length
        while left:
            chunk = min(left, 1 << 20)
            await reader.readexactly(chunk)
            left -= chunk
        return hdr, None
    return hdr, (await reader.readexactly(length) if length else b"")


def _status(code: int, message: str) -> ttrpc_pb2.Status:
    return ttrpc_pb2.Status(code=code, message=message)


class Client:
    """Calls a peer's ttRPC services over one connection. `run()` reads the replies; a
    reply wakes its caller by stream id. A call's deadline travels in the request and
    bounds the wait here; a call that times out is forgotten (a late reply is dropped)."""

    def __init__(self, reader: Reader, write: Writer,
                 on_close: Callable[[BaseException | None], None] | None = None) -> None:
        self._reader = reader
        self._write = write
        self._on_close = on_close
        self._next_id = 1
        self._waiting: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._closed: BaseException | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def run(self) -> None:
        err: BaseException | None = None
        try:
            while True:
                hdr, payload = await read_message(self._reader)
                if hdr.type != TYPE_RESPONSE:
                    continue  # no streams from a server in NRI
                fut = self._waiting.pop(hdr.stream_id, None)
                if fut is None or fut.done():
                    continue
                if payload is None:
                    fut.set_exception(TTRPCError(
                        RESOURCE_EXHAUSTED, f"reply of {hdr.length} bytes exceeds the "
                                            f"maximum message size of {MAX_MESSAGE}"))
                    continue
                resp = ttrpc_pb2.Response()
                try:
                    resp.ParseFromString(payload)
                except DecodeError as exc:
                    raise ProtocolError(f"undecodable ttrpc response: {exc}") from None
                fut.set_result(resp)
        except asyncio.IncompleteReadError:
            err = None
        except asyncio.CancelledError:
            err = None
            raise
        except (ProtocolError, OSError, ConnectionError) as exc:
            err = exc
        finally:
            self.close(err)

    def close(self, err: BaseException | None = None) -> None:
        if self._closed is not None:
            return
        self._closed = err or ConnectionClosed()
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(
                    f"ttrpc: connection closed ({err})" if err else "ttrpc: connection closed"))
        if self._on_close is not None:
            self._on_close(err)

    async def call(self, service: str, method: str, request: Message, reply: type[M],
                   limit: float) -> M:
        """Call service/method; raises TTRPCError (DEADLINE_EXCEEDED after `limit`
        seconds, UNAVAILABLE once the connection is gone, the peer's status otherwise)."""
        if self._closed is not None:
            raise ConnectionClosed()
        t0 = time.perf_counter()
        req = ttrpc_pb2.Request(service=service, method=method,
                                payload=request.SerializeToString(),
                                timeout_nano=int(limit * 1e9))
        data = req.SerializeToString()
        if len(data) > MAX_MESSAGE:
            raise TTRPCError(RESOURCE_EXHAUSTED,
                             f"message length {len(data)} exceeds maximum message size of "
                             f"{MAX_MESSAGE}")
        sid = self._next_id
        self._next_id += 2
        fut: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._waiting[sid] = fut
        try:
            self._write(frame(sid, TYPE_REQUEST, 0, data))
            t1 = time.perf_counter()
            # In this task (wait_for would run the wait as a task of its own): the reply
            # resumes the caller in the loop step that reads it.
            async with asyncio.timeout(limit):
                resp = await fut
            t2 = time.perf_counter()
        except TimeoutError:
            raise TTRPCError(DEADLINE_EXCEEDED,
                             f"{service}/{method}: no reply within {limit:g}s") from None
        finally:
            self._waiting.pop(sid, None)
        if resp.HasField("status") and resp.status.code != OK:
            raise TTRPCError(resp.status.code, resp.status.message)
        out = reply()
        try:
            out.ParseFromString(resp.payload)
        except DecodeError as exc:
            raise TTRPCError(INTERNAL, f"{service}/{method}: undecodable reply: {exc}") \
                from None
        # The wait (the peer's answer, as this loop sees it) apart from this side's
        # encoding and decoding: what a slow call is made of.
        log.debug("ttrpc call", method=method, bytes=len(data),
                  encode_ms=round((t1 - t0) * 1000, 3), wait_ms=round((t2 - t1) * 1000, 3),
                  decode_ms=round((time.perf_counter() - t2) * 1000, 3))
        return out


Handler = Callable[[Message], Awaitable[Message]]


@dataclass(frozen=True)
class Method:
    request: type[Message]
    handler: Handler


class Server:
    """Serves a method table ({service: {method: Method}}) over one connection: each
    request runs as its own task and is answered on its stream id; an unknown service or
    method is UNIMPLEMENTED, an undecodable request INVALID_ARGUMENT, a TTRPCError its
    own status and any other exception UNKNOWN with its message."""

    def __init__(self, services: Mapping[str, Mapping[str, Method]]) -> None:
        self._services = services
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: Reader, write: Writer) -> None:
        """Until the peer closes (returns) or breaks the framing (ProtocolError)."""
        last_id = 0
        try:
            while True:
                try:
                    hdr, payload = await read_message(reader)
                except asyncio.IncompleteReadError:
                    return
                sid = hdr.stream_id
                if payload is None:
                    self._reply(write, sid, _status(
                        RESOURCE_EXHAUSTED, f"message length {hdr.length} exceed maximum "
                                            f"message size of {MAX_MESSAGE}"))
                    continue
                if sid % 2 != 1:
                    self._reply(write, sid, _status(
                        INVALID_ARGUMENT, "StreamID must be odd for client initiated streams"))
                    continue
                if hdr.type == TYPE_DATA:
                    self._reply(write, sid, _status(INVALID_ARGUMENT,
                                                    "StreamID is no longer active"))
                    continue
                if hdr.type != TYPE_REQUEST:
                    raise ProtocolError(f"unexpected ttrpc message type {hdr.type}")
                if sid <= last_id:
                    self._reply(write, sid, _status(
                        INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"))
                    continue
                last_id = sid
                req = ttrpc_pb2.Request()
                try:
                    req.ParseFromString(payload)
                except DecodeError as exc:
                    self._reply(write, sid, _status(INVALID_ARGUMENT,
                                                    f"unmarshal request error: {exc}"))
                    continue
                task = asyncio.create_task(self._handle(write, sid, req))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for t in list(self._tasks):
                t.cancel()

    async def _handle(self, write: Writer, sid: int, req: ttrpc_pb2.Request) -> None:
        method = self._services.get(req.service, {}).get(req.method)
        if req.service not in self._services:
            self._reply(write, sid, _status(UNIMPLEMENTED, f"service {req.service}"))
            return
        if method is None:
            self._reply(write, sid, _status(UNIMPLEMENTED, f"method {req.method}"))
            return
        msg = method.request()
        try:
            msg.ParseFromString(req.payload)
        except DecodeError as exc:
            self._reply(write, sid, _status(INTERNAL,
                                            f"ttrpc: error unmarshalling payload: {exc}"))
            return
        try:
            # In this task (not wait_for's own): a handler's error is answered in the
            # same step it is raised, before anything it woke up can run.
            async with asyncio.timeout(req.timeout_nano / 1e9 if req.timeout_nano > 0
                                       else None):
                out = await method.handler(msg)
        except TimeoutError:
            self._reply(write, sid, _status(DEADLINE_EXCEEDED, "deadline exceeded"))
            return
        except TTRPCError as exc:
            self._reply(write, sid, _status(exc.code, exc.message))
            return
        except Exception as exc:  # the peer gets the message, as Go's handlers' errors
            log.warning("ttrpc handler failed", service=req.service, method=req.method,
                        error=str(exc))
            self._reply(write, sid, _status(UNKNOWN, str(exc)))
            return
        self._reply(write, sid, None, out.SerializeToString())

    @staticmethod
    def _reply(write: Writer, sid: int, status: ttrpc_pb2.Status | None,
               payload: bytes = b"") -> None:
        # An OK reply has no status field at all, as the reference's encodes it.
        resp = ttrpc_pb2.Response(payload=payload)
        if status is not None:
            resp.status.CopyFrom(status)
        try:
            write(frame(sid, TYPE_RESPONSE, 0, resp.SerializeToString()))
        except (OSError, ConnectionError) as exc:
            log.debug("ttrpc reply not sent", error=str(exc))
