"""Notice a process's death without being its parent or running a monitor: pidfds.

`os.pidfd_open(pid)` (Linux >= 5.3) gives an fd that refers to that one process (never to a
later process reusing the pid) and becomes readable when it has exited. The fd goes to the
event loop (`loop.add_reader`): no thread, no polling. Used for the pod's pause process,
which runs under the OCI runtime alone (no conmon): it has no output and nobody needs its
exit code, only the fact that it died.

A watched process that is our own child (crishim running as PID 1 or as a subreaper) is
reaped through its pidfd (`waitid(P_PIDFD)`), which waits for that one process only; the
pids asyncio's child watcher waits for are never touched (no `waitpid(-1)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from crishim.log import get_logger
from crishim.observe import tracing
from crishim.runtime.exitfiles import run_callback
from crishim.runtime.fdwait import wait_readable

log = get_logger(__name__)

# callback(key): the watched process has exited.
PidCallback = Callable[[str], Awaitable[None] | None]


def open_pidfd(pid: int) -> int | None:
    """A pidfd (close-on-exec) for `pid`, or None when there is no such process."""
    if pid <= 0:
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has exited (a zombie counts as exited)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def send_signal(pidfd: int, sig: int) -> bool:
    """Signal the process of `pidfd`; False when it has already exited."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True


def reap(pidfd: int) -> None:
    """Collect the exit status of the pidfd's process if it is our child (a no-op
    otherwise, and when it has not exited)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)


async def wait_exit(pidfd: int, timeout: float) -> bool:  # noqa: ASYNC109 - a plain bound
    """Wait up to `timeout` seconds for the process of `pidfd` to exit; True if it did.
    The caller keeps (and closes) the fd."""
    return exited(pidfd) or await wait_readable(pidfd, timeout)


@dataclass
class _Watch:
    pid: int
    fd: int
    callback: PidCallback
    reap: bool
    loop: asyncio.AbstractEventLoop


class PidWatcher:
    """Call a callback once when a watched process exits; one watch per key."""

    def __init__(self) -> None:
        self._watches: dict[str, _Watch] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._watches

    def watch(self, key: str, pid: int, callback: PidCallback, *, reap: bool = True,
              pidfd: int | None = None) -> bool:
        """Call `callback(key)` once when process `pid` exits (replacing an earlier watch
        of `key`). False, and no watch, when there is no such process any more: the
        caller handles the exit itself. With `reap`, a process that is our own child is
        reaped once it exited; pass False for children someone else waits for.
        `pidfd`: a pidfd of `pid` the caller already holds (e.g. from `take`); the
        watcher owns it from now on. A process that has already exited is then
        reported on the next loop iteration."""
        self.unwatch(key)
        fd = open_pidfd(pid) if pidfd is None else pidfd
        if fd is None:
            return False
        loop = asyncio.get_running_loop()
        w = _Watch(pid=pid, fd=fd, callback=callback, reap=reap, loop=loop)
        self._watches[key] = w
        # The exit is no part of the call that started the watch.
        tracing.untraced(loop.add_reader, fd, self._on_exit, key, w)
        return True

    def unwatch(self, key: str) -> None:
        """Stop watching `key` (no callback); a no-op for an unknown key."""
        w = self._watches.pop(key, None)
        if w is not None:
            self._release(w)

    def take(self, key: str) -> int | None:
        """Stop watching `key` and hand its pidfd to the caller, who must close it; None
        when `key` is not watched. For a caller that wants to signal and wait for that
        exact process itself."""
        w = self._watches.pop(key, None)
        if w is None:
            return None
        w.loop.remove_reader(w.fd)
        return w.fd

    def close(self) -> None:
        """Forget every watch (no callbacks) and cancel callbacks still running."""
        for key in list(self._watches):
            self.unwatch(key)
        for task in list(self._tasks):
            task.cancel()

    @staticmethod
    def _release(w: _Watch) -> None:
        w.loop.remove_reader(w.fd)
        os.close(w.fd)

    def _on_exit(self, key: str, w: _Watch) -> None:
        if self._watches.get(key) is not w:  # unwatched or replaced meanwhile
            return
        del self._watches[key]
        if w.reap:
            reap(w.fd)
        self._release(w)
        run_callback(lambda: w.callback(key), self._tasks, key=key, pid=w.pid)
