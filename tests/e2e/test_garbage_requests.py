"""10,000 requests whose bytes are not their message, through a real daemon's socket, on
both gRPC servers: each is answered INTERNAL "cannot parse the request as
runtime.v1.<Msg>", the daemon still answers Version at once, and its log holds no
traceback and no line per request (one warning a minute at most)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from urllib.parse import unquote

import hpack
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.rpc import frames as fr
from tests.e2e import h2raw
from tests.e2e.daemon import Daemon, running_daemon

N, BATCH = 10_000, 100
REFUSED_STREAM = 7
# (method path, request type): unary and streaming calls of both services, some of which
# would change things if their request were taken for a message.
METHODS = [("/runtime.v1.RuntimeService/Version", "VersionRequest"),
           ("/runtime.v1.RuntimeService/RunPodSandbox", "RunPodSandboxRequest"),
           ("/runtime.v1.RuntimeService/ContainerStatus", "ContainerStatusRequest"),
           ("/runtime.v1.RuntimeService/GetContainerEvents", "GetEventsRequest"),
           ("/runtime.v1.ImageService/PullImage", "PullImageRequest")]
# Bytes no message parses: a tag's varint never ends; a wire type that does not exist; a
# length past the end.
GARBAGE = [b"\xff" * 12, b"\x07\x01", b"\x0a\x40abc"]


@pytest.fixture(scope="module", params=["native", "grpcio"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    with running_daemon(f'grpc_server = "{request.param}"\n') as d:
        yield d


def _send_garbage(path: str, n: int) -> Counter[tuple[str, str]]:
    """`n` unparsable requests on one connection, BATCH at a time; how many ended with
    each (grpc-status, grpc-message). A stream the server refused (REFUSED_STREAM: grpcio
    may free a finished stream's slot only a little later) is sent again, as a client
    retries it."""
    decoder = hpack.Decoder()
    seen: Counter[tuple[str, str]] = Counter()
    pending = list(range(n))
    with h2raw.Raw(path, timeout=10) as c:
        sid = 1
        while pending:
            batch, pending = pending[:BATCH], pending[BATCH:]
            calls, open_ = [], {}
            for i in batch:
                method, _ = METHODS[i % len(METHODS)]
                calls.append(c.call(sid, method, GARBAGE[i % len(GARBAGE)]))
                open_[sid] = i
                sid += 2
            c.send(b"".join(calls))
            while open_:
                kind, flags, stream, payload = c.read_frame(10)
                if kind == fr.SETTINGS and not flags & fr.ACK:
                    c.send(fr.frame(fr.SETTINGS, fr.ACK, 0))
                elif kind == fr.PING and not flags & fr.ACK:
                    c.send(fr.frame(fr.PING, fr.ACK, 0, payload))
                elif kind == fr.HEADERS:
                    fields = dict(decoder.decode(fr.strip_padding(flags, payload)))
                    if flags & fr.END_STREAM:
                        seen[(fields.get("grpc-status", ""),
                              unquote(fields.get("grpc-message", "")))] += 1
                        open_.pop(stream, None)
                elif kind == fr.RST_STREAM:
                    code = int.from_bytes(payload, "big")
                    i = open_.pop(stream)
                    if code == REFUSED_STREAM:
                        pending.append(i)
                    else:
                        seen[("rst", str(code))] += 1
    return seen


def test_ten_thousand_garbage_requests_leave_no_traceback(daemon: Daemon) -> None:
    start = time.monotonic()
    seen = _send_garbage(daemon.socket, N)
    took = time.monotonic() - start
    assert sum(seen.values()) == N
    wrong = {k: v for k, v in seen.items() if k[0] != "13"}
    assert not wrong, wrong
    messages = {m.split(":")[0] for _, m in seen}
    assert messages == {f"cannot parse the request as runtime.v1.{name}"
                        for _, name in METHODS}
    assert took < 60, f"{N} garbage requests took {took:.1f}s"

    before = time.monotonic()
    assert daemon.runtime().Version(pb.VersionRequest(), timeout=2).runtime_name == "crishim"
    assert time.monotonic() - before < 2
    assert daemon.proc is not None and daemon.proc.poll() is None
    logs = daemon.logs()
    assert "Traceback" not in logs
    assert logs.count("cannot parse the request") <= 2
    # Nothing was taken for a request: no pod, no pull.
    assert not daemon.runtime().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=5).items
