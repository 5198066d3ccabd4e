"""Blocking work a call leaves behind (deleting a removed object's files), run on a
worker thread once the call's reply is out.

A handler's reply is written in the same step of the event loop as the handler returns,
so work scheduled with `call_soon` starts after it: a thread started earlier would
compete with the reply for the GIL and a CPU. Nothing waits for this work; what a crash
interrupts, the start-up sweeps finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from crishim.log import get_logger

log = get_logger(__name__)


class AfterReply:
    def __init__(self) -> None:
        # The loop keeps only weak references to tasks: these keep them until they end.
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, what: str, fn: Callable[..., None], *args: str) -> None:
        """`fn(*args)` on a worker thread, after the current loop step; `what` names it
        in the log if it fails."""
        loop = asyncio.get_running_loop()
        loop.call_soon(self._start, loop, what, fn, args)

    def _start(self, loop: asyncio.AbstractEventLoop, what: str, fn: Callable[..., None],
               args: tuple[str, ...]) -> None:
        task = loop.create_task(asyncio.to_thread(fn, *args))
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("background work failed", work=what, error=str(t.exception()))

        task.add_done_callback(done)

    async def settle(self) -> None:
        """Wait until everything asked for so far has run (tests)."""
        await asyncio.sleep(0)  # what `run` scheduled in this step has started
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
