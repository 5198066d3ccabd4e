"""ttRPC framing, client and server (crishim/nri/ttrpc.py), against bytes a real Go
plugin (nri-template, containerd/nri v0.12.0) sent, captured by a socket recorder
between it and crishim's NRI socket (tests/unit/data/nri-template-*.bin)."""

from __future__ import annotations

import asyncio
import os
import struct

import pytest

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.ttrpc import ttrpc_pb2
from crishim.nri import ttrpc

DATA = os.path.join(os.path.dirname(__file__), "data")


def _mux_payloads(name: str) -> list[tuple[int, bytes]]:
    with open(os.path.join(DATA, name), "rb") as fh:
        raw = fh.read()
    out, i = [], 0
    while i < len(raw):
        cid, n = struct.unpack(">II", raw[i:i + 8])
        out.append((cid, raw[i + 8:i + 8 + n]))
        i += 8 + n
    return out


class _Pipe:
    """A reader fed with bytes, for read_message and the server."""

    def __init__(self, data: bytes = b"") -> None:
        self.r = asyncio.StreamReader()
        if data:
            self.r.feed_data(data)

    async def readexactly(self, n: int) -> bytes:
        return await self.r.readexactly(n)


async def test_go_register_request_parses() -> None:
    cid, payload = _mux_payloads("nri-template-from-plugin.bin")[0]
    assert cid == 2  # the runtime's service connection
    pipe = _Pipe(payload)
    hdr, body = await ttrpc.read_message(pipe)
    assert (hdr.length, hdr.stream_id, hdr.type, hdr.flags) == (len(payload) - 10, 1,
                                                                 ttrpc.TYPE_REQUEST, 0)
    assert body is not None
    req = ttrpc_pb2.Request.FromString(body)
    assert (req.service, req.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
    # The stub's registration timeout (5 s) travels as the deadline.
    assert 4_000_000_000 < req.timeout_nano <= 5_000_000_000
    reg = nri.RegisterPluginRequest.FromString(req.payload)
    assert (reg.plugin_name, reg.plugin_idx, reg.NRI_version) == ("nri-template", "10",
                                                                  "v0.12.0")


async def test_go_replies_have_no_status_when_ok() -> None:
    replies = [p for cid, p in _mux_payloads("nri-template-from-plugin.bin") if cid == 1]
    pipe = _Pipe(b"".join(replies))
    hdr, body = await ttrpc.read_message(pipe)
    assert (hdr.stream_id, hdr.type) == (1, ttrpc.TYPE_RESPONSE)
    assert body is not None
    resp = ttrpc_pb2.Response.FromString(body)
    assert not resp.HasField("status")
    events = nri.ConfigureResponse.FromString(resp.payload).events
    # nri-template subscribes to every event but the pod updates and validation.
    assert events & (1 << (nri.CREATE_CONTAINER - 1))
    assert not events & (1 << (nri.VALIDATE_CONTAINER_ADJUSTMENT - 1))
    hdr, body = await ttrpc.read_message(pipe)
    assert (hdr.stream_id, hdr.type, body) == (3, ttrpc.TYPE_RESPONSE, b"")


async def test_server_answers_like_the_go_server() -> None:
    """Our reply to the captured RegisterPlugin is the bytes a Go ttRPC server sends for an
    OK Empty reply: header (length 0 + stream 1, response) and no status field."""
    _, payload = _mux_payloads("nri-template-from-plugin.bin")[0]
    got: list[bytes] = []

    async def register(msg: object) -> nri.Empty:
        assert isinstance(msg, nri.RegisterPluginRequest)
        return nri.Empty()

    server = ttrpc.Server({"nri.pkg.api.v1alpha1.Runtime": {
        "RegisterPlugin": ttrpc.Method(nri.RegisterPluginRequest, register)}})
    pipe = _Pipe(payload)
    serve = asyncio.create_task(server.serve(pipe, got.append))
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.01)
    pipe.r.feed_eof()
    await serve
    assert got == [struct.pack(">IIBB", 0, 1, ttrpc.TYPE_RESPONSE, 0)]


async def test_client_server_roundtrip_and_status() -> None:
    a, b = _Pipe(), _Pipe()  # a: client -> server, b: server -> client

    async def configure(msg: object) -> nri.ConfigureResponse:
        assert isinstance(msg, nri.ConfigureRequest)
        if msg.config == "refuse":
            raise ttrpc.TTRPCError(ttrpc.FAILED_PRECONDITION, "no thanks")
        return nri.ConfigureResponse(events=7)

    server = ttrpc.Server({"svc": {"Configure": ttrpc.Method(nri.ConfigureRequest,
                                                             configure)}})
    serve = asyncio.create_task(server.serve(a, b.r.feed_data))
    client = ttrpc.Client(b, a.r.feed_data)
    run = asyncio.create_task(client.run())
    rpl = await client.call("svc", "Configure", nri.ConfigureRequest(), nri.ConfigureResponse,
                            1.0)
    assert rpl.events == 7
    with pytest.raises(ttrpc.TTRPCError) as err:
        await client.call("svc", "Configure", nri.ConfigureRequest(config="refuse"),
                          nri.ConfigureResponse, 1.0)
    assert (err.value.code, err.value.message) == (ttrpc.FAILED_PRECONDITION, "no thanks")
    with pytest.raises(ttrpc.TTRPCError) as err:
        await client.call("svc", "Nope", nri.Empty(), nri.Empty, 1.0)
    assert err.value.code == ttrpc.UNIMPLEMENTED
    with pytest.raises(ttrpc.TTRPCError) as err:
        await client.call("other", "Configure", nri.Empty(), nri.Empty, 1.0)
    assert err.value.code == ttrpc.UNIMPLEMENTED
    a.r.feed_eof()
    await serve
    b.r.feed_eof()
    await run
    assert client.closed
    with pytest.raises(ttrpc.ConnectionClosed):
        await client.call("svc", "Configure", nri.ConfigureRequest(), nri.ConfigureResponse,
                          1.0)


async def test_client_deadline_and_stream_ids() -> None:
    sent: list[bytes] = []
    peer = _Pipe()
    client = ttrpc.Client(peer, sent.append)
    run = asyncio.create_task(client.run())
    with pytest.raises(ttrpc.TTRPCError) as err:
        await client.call("svc", "M", nri.Empty(), nri.Empty, 0.05)
    assert err.value.code == ttrpc.DEADLINE_EXCEEDED
    with pytest.raises(ttrpc.TTRPCError):
        await client.call("svc", "M", nri.Empty(), nri.Empty, 0.01)
    ids = [struct.unpack(">IIBB", m[:10])[1] for m in sent]
    assert ids == [1, 3]  # odd, increasing
    req = ttrpc_pb2.Request.FromString(sent[0][10:])
    assert req.timeout_nano == 50_000_000
    # A late reply to a forgotten call is dropped.
    peer.r.feed_data(ttrpc.frame(1, ttrpc.TYPE_RESPONSE, 0, b""))
    peer.r.feed_eof()
    await run


async def test_oversized_and_bad_stream_ids_answered() -> None:
    got: list[bytes] = []
    server = ttrpc.Server({})
    big = ttrpc.MAX_MESSAGE + 1
    data = (struct.pack(">IIBB", big, 1, ttrpc.TYPE_REQUEST, 0) + b"\0" * big
            + ttrpc.frame(2, ttrpc.TYPE_REQUEST, 0, b""))
    pipe = _Pipe(data)
    pipe.r.feed_eof()
    await server.serve(pipe, got.append)
    codes = [ttrpc_pb2.Response.FromString(m[10:]).status.code for m in got]
    assert codes == [ttrpc.RESOURCE_EXHAUSTED, ttrpc.INVALID_ARGUMENT]


async def test_request_too_big_fails_locally() -> None:
    client = ttrpc.Client(_Pipe(), lambda _: None)
    big = nri.ConfigureRequest(config="x" * (ttrpc.MAX_MESSAGE + 1))
    with pytest.raises(ttrpc.TTRPCError) as err:
        await client.call("svc", "Configure", big, nri.ConfigureResponse, 1.0)
    assert err.value.code == ttrpc.RESOURCE_EXHAUSTED
