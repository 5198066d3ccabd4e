"""Hostile HTTP/2 clients against a real crishim, on both gRPC servers: the daemon
stays up, Version answers at once after each attack, the native server answers each
malformed frame as RFC 9113 says, and what clients make it hold stays within its
configured bound (RSS of the daemon's process, measured while the attack holds it)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.rpc import frames as fr
from tests.e2e import h2raw
from tests.e2e.daemon import Daemon, running_daemon

MIB = 1024 * 1024
# Small limits, so that the bounded maximum is reached in seconds.
CONNECTIONS, STREAMS, WINDOW, BUFFERED = 24, 32, 128 * 1024, 8 * MIB
LIMITS = (f"grpc_max_connections = {CONNECTIONS}\ngrpc_max_concurrent_streams = {STREAMS}\n"
          f"grpc_connection_window = {WINDOW}\ngrpc_max_buffered = {BUFFERED}\n")


@pytest.fixture(scope="module", params=["native", "grpcio"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    with running_daemon(f'grpc_server = "{request.param}"\n' + LIMITS) as d:
        yield d


def _native(d: Daemon) -> bool:
    return 'grpc_server = "native"' in open(d.config_file).read()


def _answers(d: Daemon) -> float:
    """Version's latency on a new connection, which must be under 2 s."""
    start = time.monotonic()
    assert d.runtime().Version(pb.VersionRequest(), timeout=2).runtime_name == "crishim"
    return time.monotonic() - start


@pytest.mark.parametrize("name", [n for n in h2raw.FRAME_CASES
                                  if "request ended" not in n])  # those need a slow call
def test_a_malformed_frame_gets_the_rfc_s_error(daemon: Daemon, name: str) -> None:
    answer = h2raw.malformed(daemon.socket, name)
    if _native(daemon):
        assert answer == h2raw.FRAME_CASES[name][1:]
    assert _answers(daemon) < 2
    assert daemon.proc is not None and daemon.proc.poll() is None


@pytest.mark.parametrize("attack", ["failing_calls_unread", "rapid_reset", "empty_frames",
                                    "continuation_flood", "hpack_bomb",
                                    "zero_length_headers", "streams_past_the_limit"])
def test_an_attack_leaves_version_answering(daemon: Daemon, attack: str) -> None:
    out = getattr(h2raw, attack)(daemon.socket)
    try:
        assert _answers(daemon) < 2
        if _native(daemon) and attack == "failing_calls_unread":
            assert "stopped reading: True" in out.answer
        if _native(daemon) and attack == "streams_past_the_limit":
            assert out.answer.startswith(f"{10_000 - STREAMS} refused")
    finally:
        out.close()


@pytest.mark.parametrize("kind", [fr.PING, fr.SETTINGS])
def test_control_frames_left_unread(daemon: Daemon, kind: int) -> None:
    out = h2raw.control_flood_unread(daemon.socket, kind)
    try:
        if _native(daemon):
            assert str(("goaway", fr.ENHANCE_YOUR_CALM)) in out.answer \
                or "stopped reading: True" in out.answer, out.answer
        assert _answers(daemon) < 2
    finally:
        out.close()


def test_the_bounded_maximum_of_connections_and_streams_stays_within_its_memory_bound(
        daemon: Daemon) -> None:
    """Every connection the limit allows, each with every stream it allows, each stream's
    request never ending: the daemon's RSS grows by no more than the request bytes the
    limits allow (grpc_max_buffered + connections x (64 KiB + window)) and the streams'
    and connections' own objects; idle connections past the limit take no more."""
    assert daemon.proc is not None
    time.sleep(0.5)
    before = h2raw.rss(daemon.proc.pid)
    out = h2raw.never_ending_bodies(daemon.socket, calls=CONNECTIONS * STREAMS,
                                    body=32_000, per_connection=STREAMS)
    idle = h2raw.idle_connections(daemon.socket, n=200)
    try:
        time.sleep(0.5)
        grown = h2raw.rss(daemon.proc.pid) - before
        bound = BUFFERED + CONNECTIONS * (65535 + WINDOW)
        objects = CONNECTIONS * STREAMS * 2048 + CONNECTIONS * 64 * 1024
        if _native(daemon):
            assert grown <= bound + objects, (out.answer, grown / MIB)
        assert _answers(daemon) < 2
    finally:
        out.close()
        idle.close()
    print(f"{daemon.config_file}: {out.answer}; RSS +{grown / MIB:.1f} MiB")
