"""The remotecommand protocol pieces (crishim/streaming/remotecommand.py): how an exec's
outcome is reported on the error channel per protocol version, which streams a session
uses, and the decoding of the resize stream a client sends."""

from __future__ import annotations

import json

from crishim.streaming.interface import ExecRequest, TerminalSize
from crishim.streaming.remotecommand import (
    effective_streams,
    encode_status,
    resize_events,
    status_exit,
    status_internal,
    status_success,
)


class Chunks:
    """A ByteSource giving the chunks as the network split them."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def read(self, n: int = 65536) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


async def sizes(*chunks: bytes) -> list[TerminalSize]:
    return [s async for s in resize_events(Chunks(*chunks))]


def test_v4_reports_json_status_and_the_exit_code() -> None:
    ok = json.loads(encode_status(status_success(), True))
    assert ok["status"] == "Success"
    failed = json.loads(encode_status(status_exit(7), True))
    assert failed["status"] == "Failure" and failed["reason"] == "NonZeroExitCode"
    # kubectl and client-go read the exit code from this cause.
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]


def test_before_v4_only_a_failure_is_reported_as_text() -> None:
    assert encode_status(status_success(), False) == b""
    assert encode_status(status_exit(3), False) == \
        b"command terminated with non-zero exit code: exit status 3"
    internal = encode_status(status_internal("runc exec failed"), False)
    assert internal.startswith(b"Internal error occurred:") and b"runc exec failed" in internal


def test_a_tty_has_no_separate_stderr() -> None:
    req = ExecRequest(container_id="c", cmd=["sh"], tty=True, stdin=True, stdout=True,
                      stderr=True)
    assert effective_streams(req) == (True, True, False)
    req = ExecRequest(container_id="c", cmd=["sh"], tty=False, stdin=False, stdout=True,
                      stderr=True)
    assert effective_streams(req) == (False, True, True)


async def test_resize_objects_split_and_joined_anyhow() -> None:
    got = await sizes(b'{"Width":80,"Hei', b'ght":24}{"Width":100,"Height":30}\n',
                      b' {"Width":1,"Height":2}')
    assert got == [TerminalSize(80, 24), TerminalSize(100, 30), TerminalSize(1, 2)]


async def test_what_is_not_a_size_is_skipped() -> None:
    got = await sizes(b'[1, 2]', b'"text"', b'{"Width":"wide","Height":3}',
                      b'{"Width":5,"Height":6}')
    assert got == [TerminalSize(5, 6)]


async def test_garbage_ends_the_resize_stream() -> None:
    # Not a partial object after 4 KiB: nothing more is read from this client.
    assert await sizes(b"x" * 5000, b'{"Width":5,"Height":6}') == []
