"""Kill a container that runs without a monitor (the pause) and delete it."""

from __future__ import annotations

import os
import signal

from crishim.log import get_logger
from crishim.runtime import pidwatch
from crishim.runtime.runc import OCIRuntime

log = get_logger(__name__)

# How long a SIGKILLed process may take to be reported dead before the delete is forced.
KILL_WAIT = 10.0
# runc/crun states in which the container's process exists and must be killed.
_ALIVE = ("created", "running", "paused")


async def kill_and_delete(runtime: OCIRuntime, cid: str, pidfd: int | None = None,
                          all_procs: bool = False) -> None:
    """SIGKILL, wait (bounded) for the death, delete; idempotent. With `pidfd` (owned by
    the caller) the signal goes to exactly that process; without, runc kills (it checks
    the process start time) and a pidfd opened from runc state's pid is only waited on:
    were that pid reused meanwhile, the wait would just run out. (`runc delete --force`
    on a live container sleeps 100 ms before it even checks whether the process died.)"""
    own: int | None = None
    try:
        if pidfd is not None:
            if not pidwatch.exited(pidfd):
                pidwatch.send_signal(pidfd, signal.SIGKILL)
        else:
            state = await runtime.state(cid)
            if state is None:
                return  # no such container: nothing to kill or delete
            if state.get("status") in _ALIVE:
                own = pidfd = pidwatch.open_pidfd(int(state.get("pid") or 0))
                await runtime.kill(cid, signal.SIGKILL, all_procs=all_procs)
        if pidfd is not None:
            if await pidwatch.wait_exit(pidfd, KILL_WAIT):
                pidwatch.reap(pidfd)
            else:
                log.warning("process did not die after SIGKILL; forcing delete", id=cid)
    finally:
        if own is not None:
            os.close(own)
    await runtime.delete(cid, force=True)
