"""Blocking work a call leaves behind (deleting a removed object's files), run on a
worker thread once the call's reply is out.

A handler's reply is written in the same step of the event loop as the handler returns,
so work scheduled with `call_soon` starts after it: a thread started earlier would
compete with the reply for the GIL and a CPU. The reply wakes the client, often on the
CPU this work then runs on. The work's thread is made from the loop's, which passes on
no raised priority (proc/priority.py), and it is a batch thread (SCHED_BATCH): it never
preempts the client it wakes next to, which would otherwise wait up to milliseconds
behind it for the reply it already has. One thread does it all, in order. Nothing waits
for this work; what a crash interrupts, the start-up sweeps finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from crishim.log import get_logger
from crishim.proc import priority

log = get_logger(__name__)

_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="after-reply",
                             initializer=priority.batch_thread)


class AfterReply:
    def __init__(self) -> None:
        # The loop keeps only weak references to futures: these keep them until they end.
        self._pending: set[asyncio.Future[None]] = set()

    def run(self, what: str, fn: Callable[..., None], *args: str) -> None:
        """`fn(*args)` on the worker thread, after the current loop step; `what` names it
        in the log if it fails."""
        loop = asyncio.get_running_loop()
        loop.call_soon(self._start, loop, what, fn, args)

    def _start(self, loop: asyncio.AbstractEventLoop, what: str, fn: Callable[..., None],
               args: tuple[str, ...]) -> None:
        fut = loop.run_in_executor(_worker, fn, *args)
        self._pending.add(fut)

        def done(f: asyncio.Future[None]) -> None:
            self._pending.discard(f)
            if not f.cancelled() and f.exception() is not None:
                log.warning("background work failed", work=what, error=str(f.exception()))

        fut.add_done_callback(done)

    async def settle(self) -> None:
        """Wait until everything asked for so far has run (tests)."""
        await asyncio.sleep(0)  # what `run` scheduled in this step has started
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
