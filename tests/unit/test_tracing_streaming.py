"""A streaming session (Exec, Attach, PortForward served on the streaming server) is a
span under the trace of the call that handed out its URL, and nothing while tracing is
off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crishim.config import StreamingConfig
from crishim.observe import tracing
from crishim.streaming.client import exec_spdy, exec_websocket
from crishim.streaming.interface import ExecRequest
from crishim.streaming.server import StreamingServer
from tests.fakes.streaming import FakeBackend


@pytest.fixture
async def server() -> AsyncIterator[StreamingServer]:
    srv = StreamingServer(StreamingConfig(address="127.0.0.1", port=0, idle_timeout=30),
                          FakeBackend(), stream_creation_timeout=5)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.mark.parametrize("client", [exec_spdy, exec_websocket])
async def test_the_session_is_a_child_of_the_exec_call(
        spans: InMemorySpanExporter, server: StreamingServer, client: object) -> None:
    with tracing.span("/runtime.v1.RuntimeService/Exec"):
        url = server.url_for(ExecRequest("c1", ["sh", "-c", "echo hi"]))
    res = await asyncio.wait_for(client(url), 10)  # type: ignore[operator]
    assert res.stdout == b"hi\n"
    assert tracing.flush()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    call, session = by_name["/runtime.v1.RuntimeService/Exec"], by_name["streaming exec"]
    assert session.parent is not None
    assert session.parent.span_id == call.context.span_id
    assert session.context.trace_id == call.context.trace_id
    assert session.attributes["cri.container_id"] == "c1"
    assert session.end_time >= call.end_time  # the session outlives the call


async def test_off_no_context_is_kept(server: StreamingServer) -> None:
    assert not tracing.enabled()
    assert tracing.carry() is None
    assert tracing.resumed(None, "x") is tracing.NOOP
    url = server.url_for(ExecRequest("c1", ["true"]))
    res = await asyncio.wait_for(exec_spdy(url), 10)
    assert res.exit_code == 0
