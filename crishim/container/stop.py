"""StopContainer's escalation for a launched container: the stop signal, the grace period,
then SIGKILL to every process, and the wait for the exit, also when conmon is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

from crishim.container.exit import ContainerExits
from crishim.container.registry import ContainerRegistry
from crishim.errors import Internal
from crishim.runtime import conmon
from crishim.runtime.runc import RuntimeRegistry
from crishim.store.container import EXITED, RUNNING, Container

# How long StopContainer waits for the exit after SIGKILL before giving up.
KILL_WAIT = 30.0


class ContainerStopper:
    def __init__(self, runtimes: RuntimeRegistry, records: ContainerRegistry,
                 exits: ContainerExits) -> None:
        self.runtimes = runtimes
        self.records = records
        self.exits = exits

    async def stop(self, rec: Container, grace: float) -> None:
        """Stop signal, wait `grace` s, then SIGKILL; returns once `rec` is EXITED."""
        runtime = self.runtimes.get(rec.runtime_handler)
        ev = self.records.exited(rec.id)
        if grace > 0 and rec.state == RUNNING:
            await runtime.kill(rec.id, rec.stop_signal)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), grace)
        if rec.state != EXITED:
            self.exits.killing.add(rec.id)
            try:
                await runtime.kill(rec.id, signal.SIGKILL, all_procs=True)
                if not conmon.conmon_alive(rec.persist_dir):
                    await self._exit_without_monitor(rec, ev)
                try:
                    await asyncio.wait_for(ev.wait(), KILL_WAIT)
                except TimeoutError:
                    await self.exits.check_exit(rec)
                    if rec.state != EXITED:
                        raise Internal(f"container {rec.id} did not exit {KILL_WAIT:g}s "
                                       "after SIGKILL") from None
            finally:
                self.exits.killing.discard(rec.id)

    async def _exit_without_monitor(self, rec: Container, ev: asyncio.Event) -> None:
        """conmon is gone. Usually it wrote the exit file and left as the SIGKILLed process
        died (a quick death beats our look at conmon): read the file now. Without one
        (conmon itself died) ask runc, polling briefly while the kernel ends the process;
        the caller's wait covers the rest."""
        delay = 0.002
        deadline = time.monotonic() + KILL_WAIT
        while rec.state != EXITED and not ev.is_set() and time.monotonic() < deadline:
            await self.exits.check_exit(rec)
            if rec.state == EXITED:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
