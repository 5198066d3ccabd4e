"""Attach sessions without stdin share one connection to the container's conmon.

conmon (2.1) lets go of an attach client's socket only once both directions are done,
and it learns that its writes are done only from a write that fails: the socket of a
client that left stays open in conmon until the container next prints, one fd per
abandoned attach, without bound for a quiet container. Sessions that only read get the
same packets, so they share one connection, and it stays open (read, its packets
dropped) after the last session left, until conmon closes it when the container ends:
however many sessions come and go, conmon holds one live socket for them, never a dead
one. A session with stdin keeps a connection of its own: its half-close is what tells
conmon the container's stdin has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

# Packets a slow session may have queued before the shared reader waits for it (as
# conmon waits for a slow client on a connection of its own): 2 MiB at most.
QUEUE_PACKETS = 64
# What a packet is at most (conmon's buffer and the pipe byte).
PACKET = 32 * 1024 + 1


class _Shared:
    """One connection and the queues of the sessions reading it; None ends a queue."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queues: set[asyncio.Queue[bytes | None]] = set()
        self.reader: asyncio.Task[None] | None = None

    async def read(self, on_end: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            with contextlib.suppress(OSError):
                while packet := await loop.sock_recv(self.sock, PACKET):
                    for queue in list(self.queues):
                        await queue.put(packet)
        finally:
            on_end()  # later sessions connect anew
            for queue in list(self.queues):
                if queue.full():
                    queue.get_nowait()  # the oldest packet makes room for the end
                queue.put_nowait(None)
            if not self.queues:
                self.sock.close()


class AttachHub:
    """The shared connections by container."""

    def __init__(self) -> None:
        self._shared: dict[str, asyncio.Future[_Shared]] = {}

    @contextlib.asynccontextmanager
    async def session(self, key: str, connect: Callable[[], Awaitable[socket.socket]]
                      ) -> AsyncIterator[asyncio.Queue[bytes | None]]:
        """A queue of the packets conmon sends for `key` while the block runs; None once
        conmon closed the connection. `connect` makes the connection for the first."""
        shared = await self._join(key, connect)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_PACKETS)
        shared.queues.add(queue)
        if shared.reader is None:
            shared.reader = asyncio.create_task(shared.read(lambda: self._forget(key, shared)))
        try:
            yield queue
        finally:
            shared.queues.discard(queue)
            while not queue.empty():
                queue.get_nowait()  # a reader waiting to put into it goes on
            # The last to leave a connection conmon closed closes ours; an open one
            # stays, read, for the sessions to come (see the module's docstring).
            if not shared.queues and shared.reader.done():
                shared.sock.close()


    async def _join(self, key: str, connect: Callable[[], Awaitable[socket.socket]]
                    ) -> _Shared:
        pending = self._shared.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._shared[key] = pending
            try:
                pending.set_result(_Shared(await connect()))
            except BaseException as exc:
                del self._shared[key]
                if isinstance(exc, asyncio.CancelledError):
                    pending.cancel()
                else:
                    pending.set_exception(exc)
                    pending.exception()  # retrieved: the joiners re-raise it
                raise
        return await asyncio.shield(pending)

    def _forget(self, key: str, shared: _Shared) -> None:
        pending = self._shared.get(key)
        if pending is not None and pending.done() and not pending.cancelled() \
                and pending.exception() is None and pending.result() is shared:
            del self._shared[key]
