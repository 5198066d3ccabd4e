"""Read-only attach sessions share one connection to conmon: however many sessions come
and go, conmon (here the other end of a socketpair) sees one connection, which stays
read until conmon closes it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from crishim.errors import FailedPrecondition
from crishim.streaming.attachhub import AttachHub


class _Conmon:
    """The far ends of the connections the hub made."""

    def __init__(self) -> None:
        self.ends: list[socket.socket] = []

    async def connect(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self.ends.append(theirs)
        return ours

    def closed(self, end: socket.socket) -> bool:
        end.settimeout(5)
        return end.recv(16) == b""

    def open(self, end: socket.socket) -> bool:
        """Still read: what conmon sends is taken (a dead socket's would fill up)."""
        end.setblocking(False)
        try:
            end.recv(16)
            return False  # closed (b"") or something sent to conmon
        except BlockingIOError:
            return True


async def test_sessions_share_one_connection_and_all_get_the_output() -> None:
    hub, conmon = AttachHub(), _Conmon()
    async with hub.session("c1", conmon.connect) as a, \
            hub.session("c1", conmon.connect) as b:
        assert len(conmon.ends) == 1
        conmon.ends[0].send(b"\x02hello")
        assert await a.get() == b"\x02hello"
        assert await b.get() == b"\x02hello"
    assert conmon.open(conmon.ends[0])
    async with hub.session("c1", conmon.connect) as c:
        conmon.ends[0].send(b"\x02again")
        assert await c.get() == b"\x02again"
    assert len(conmon.ends) == 1


async def test_abandoned_sessions_leave_no_connection() -> None:
    hub, conmon = AttachHub(), _Conmon()

    async def leave(delay: float) -> None:
        async with hub.session("c2", conmon.connect) as packets:
            await asyncio.wait_for(packets.get(), delay)

    results = await asyncio.gather(*(leave(0.01 * (i % 5)) for i in range(50)),
                                   return_exceptions=True)
    assert all(isinstance(r, TimeoutError) for r in results)
    end = conmon.ends[0]
    end.setblocking(False)
    for _ in range(2000):  # nobody listens now: more than a socket holds, read and dropped
        await asyncio.get_running_loop().sock_sendall(end, b"\x02" + b"x" * 1024)
    assert len(conmon.ends) == 1
    assert conmon.open(conmon.ends[0])
    conmon.ends[0].close()  # the container ended: conmon closes, and so does the hub


async def test_a_slow_session_that_leaves_does_not_stall_the_others() -> None:
    hub, conmon = AttachHub(), _Conmon()
    async with hub.session("c3", conmon.connect) as fast:
        async with hub.session("c3", conmon.connect):
            for i in range(80):  # more than a queue holds: the reader waits on the slow one
                conmon.ends[0].send(b"\x02%d" % i)
            for _ in range(10):
                await fast.get()
        # The slow session left: the rest reaches the fast one.
        got = [await asyncio.wait_for(fast.get(), 5) for _ in range(70)]
        assert got[-1] == b"\x0279"


async def test_conmon_closing_ends_every_session_and_the_next_connects_anew() -> None:
    hub, conmon = AttachHub(), _Conmon()
    async with hub.session("c4", conmon.connect) as a:
        conmon.ends[0].close()
        assert await asyncio.wait_for(a.get(), 5) is None
        async with hub.session("c4", conmon.connect) as b:
            assert len(conmon.ends) == 2
            conmon.ends[1].send(b"\x03err")
            assert await b.get() == b"\x03err"


async def test_a_failed_connect_fails_the_session_and_is_not_kept() -> None:
    hub, conmon = AttachHub(), _Conmon()

    async def refuse() -> socket.socket:
        raise FailedPrecondition("conmon is not running")

    with pytest.raises(FailedPrecondition):
        async with hub.session("c5", refuse):
            pass
    async with hub.session("c5", conmon.connect):
        assert len(conmon.ends) == 1
