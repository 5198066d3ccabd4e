"""A request whose bytes are not its message, on both gRPC servers (crishim's own and
grpcio's aio server, as the daemon builds them from a servicer): INTERNAL "cannot parse
the request as runtime.v1.<Msg>", the servicer never called, no traceback, and one
warning line however many come in a minute."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import ServicerBase, Unparsed
from crishim.cri.handlers import add_service, rpc_methods
from crishim.rpc.server import Server

VERSION = "/runtime.v1.RuntimeService/Version"
EVENTS = "/runtime.v1.RuntimeService/GetContainerEvents"
GARBAGE = b"\xff\xff\xff\xff"


class _Runtime(ServicerBase):
    SERVICE = "RuntimeService"

    def __init__(self) -> None:
        self.calls = 0

    async def Version(self, request: pb.VersionRequest, context: Any) -> pb.VersionResponse:
        self.calls += 1
        return pb.VersionResponse(runtime_name="crishim")

    async def GetContainerEvents(self, request: pb.GetEventsRequest,
                                 context: Any) -> AsyncIterator[pb.ContainerEventResponse]:
        self.calls += 1
        yield pb.ContainerEventResponse(container_id="c1")


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(params=["native", "grpcio"])
async def served(tmp_path: object, request: pytest.FixtureRequest,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[grpc.aio.Channel,
                                                                         _Runtime]]:
    monkeypatch.setattr(Unparsed, "_last", -Unparsed.QUIET)
    monkeypatch.setattr(Unparsed, "_unlogged", 0)
    servicer = _Runtime()
    sock = os.path.join(str(tmp_path), "cri.sock")
    server: grpc.aio.Server | Server
    if request.param == "native":
        server = Server(rpc_methods("RuntimeService", servicer), 4 << 20)
        await server.start(sock)
    else:
        server = grpc.aio.server()
        add_service(server, "RuntimeService", servicer)
        server.add_insecure_port("unix:" + sock)
        await server.start()
    channel = grpc.aio.insecure_channel("unix:" + sock)
    try:
        yield channel, servicer
    finally:
        await channel.close()
        await server.stop(1)


async def test_an_unparsable_unary_request_is_internal_with_one_warning(
        served: tuple[grpc.aio.Channel, _Runtime], caplog: pytest.LogCaptureFixture) -> None:
    channel, servicer = served
    call = channel.unary_unary(VERSION, request_serializer=_identity,
                               response_deserializer=_identity)
    caplog.set_level(logging.DEBUG, logger="crishim")
    for _ in range(50):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(GARBAGE, timeout=5)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert err.value.details() == ("cannot parse the request as "
                                       "runtime.v1.VersionRequest: wire format was corrupt")
    assert servicer.calls == 0
    assert await call(b"", timeout=5) == pb.VersionResponse(
        runtime_name="crishim").SerializeToString()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text
    assert vars(warnings[0])["kv"]["error"].startswith(
        "cannot parse the request as runtime.v1.VersionRequest")


async def test_an_unparsable_streaming_request_is_internal(
        served: tuple[grpc.aio.Channel, _Runtime], caplog: pytest.LogCaptureFixture) -> None:
    channel, servicer = served
    call = channel.unary_stream(EVENTS, request_serializer=_identity,
                                response_deserializer=_identity)
    caplog.set_level(logging.DEBUG, logger="crishim")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call(GARBAGE, timeout=5):
            pass
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details().startswith(
        "cannot parse the request as runtime.v1.GetEventsRequest: ")
    assert servicer.calls == 0
    assert not any(r.exc_info for r in caplog.records)


def test_the_quiet_minute_counts_what_it_did_not_log(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    monkeypatch.setattr("crishim.cri.base.time.monotonic", lambda: now[0])
    monkeypatch.setattr(Unparsed, "_last", -Unparsed.QUIET)
    monkeypatch.setattr(Unparsed, "_unlogged", 0)
    caplog.set_level(logging.DEBUG, logger="crishim")
    for _ in range(10):
        Unparsed("cannot parse").refuse("Version")
    now[0] += Unparsed.QUIET
    Unparsed("cannot parse").refuse("Version")
    assert [vars(r)["kv"]["unlogged_since_last"] for r in caplog.records] == [0, 9]
