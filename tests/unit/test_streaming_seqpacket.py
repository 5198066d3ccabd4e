"""Connecting to conmon's attach socket: a full backlog or a listener not yet listening is
retried, and what comes back is really connected."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crishim.streaming import seqpacket


def _listener(path: str, listen: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    if listen:
        s.listen(1)
    return s


def _fill_backlog(path: str) -> list[socket.socket]:
    """Clients queued on `path` until the next connect finds the backlog full."""
    queued = []
    while True:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.setblocking(False)
        try:
            c.connect(path)
        except BlockingIOError:
            c.close()
            return queued
        queued.append(c)
        assert len(queued) < 100


@pytest.fixture
def sock_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "attach")


async def test_a_full_backlog_is_waited_out_and_the_socket_is_connected(sock_path: str) -> None:
    server = _listener(sock_path)
    queued = _fill_backlog(sock_path)
    try:
        async def drain_later() -> list[socket.socket]:
            await asyncio.sleep(0.1)
            return [server.accept()[0] for _ in queued]  # already queued: no wait

        drained = asyncio.create_task(drain_later())
        client = await seqpacket.connect(sock_path, wait=5)
        accepted = [*await drained, server.accept()[0]]
        try:
            client.send(b"hello")
            assert accepted[-1].recv(16) == b"hello"  # queued last: ours
        finally:
            client.close()
            for s in accepted:
                s.close()
    finally:
        for c in queued:
            c.close()
        server.close()


async def test_a_listener_not_yet_listening_is_waited_for(sock_path: str) -> None:
    server = _listener(sock_path, listen=False)
    try:
        async def listen_later() -> None:
            await asyncio.sleep(0.05)
            server.listen(1)

        later = asyncio.create_task(listen_later())
        client = await seqpacket.connect(sock_path, wait=5)
        await later
        peer = server.accept()[0]
        client.send(b"x")
        assert peer.recv(4) == b"x"
        client.close()
        peer.close()
    finally:
        server.close()


async def test_gives_up_after_wait(sock_path: str) -> None:
    server = _listener(sock_path)
    queued = _fill_backlog(sock_path)
    try:
        start = time.monotonic()
        with pytest.raises(BlockingIOError):
            await seqpacket.connect(sock_path, wait=0.2)
        assert time.monotonic() - start < 2
    finally:
        for c in queued:
            c.close()
        server.close()


async def test_a_missing_socket_fails_at_once(sock_path: str) -> None:
    start = time.monotonic()
    with pytest.raises(FileNotFoundError):
        await seqpacket.connect(sock_path, wait=5)
    assert time.monotonic() - start < 1
