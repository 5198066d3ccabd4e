"""Child processes started off the event loop, and awaited on it.

Starting a process holds the starting thread until the child has called exec (vfork),
and on Python 3.11 the interpreter lock with it. A child forked at nice 0 (host/priority.py)
behind the runc, conmon and CNI processes of pods that are starting waited for a CPU for
tens of milliseconds, and every RPC with it. Here the start runs on a starter thread at the
daemon's priority and the child reaches its program through `nice` (see _starter); the
child's exit (pidfd) and its pipes are awaited on the loop.
`Child` offers the part of asyncio.subprocess.Process that crishim's callers use.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from crishim.host import priority

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
CHUNK = 65536

# coreutils' nice brings a child from the daemon's raised priority back to 0.
NICE = shutil.which("nice", path=os.defpath + ":/usr/local/bin")

# A few threads suffice: each is busy only until its child has called exec. They run at
# the daemon's priority without the reset-on-fork flag: the child must get a CPU as soon
# as the daemon would, since the interpreter lock stays held until it has called exec
# (Python 3.11). It then execs `nice` with the opposite increment, which execs the
# program at nice 0.
_starter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="spawn",
                              initializer=priority.follow_main_thread)


def _argv_at_nice_zero(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    """`argv`, behind `nice` when this (starter) thread runs at a raised priority. The
    program is looked up first, so a missing one is still FileNotFoundError."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    program = argv[0] if os.path.dirname(argv[0]) else shutil.which(argv[0], path=path)
    if program is None or not os.path.exists(program):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    if not os.access(program, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice >= 0 or NICE is None:
        return [program, *argv[1:]]
    return [NICE, "-n", str(-nice), program, *argv[1:]]


class Child:
    """A started process: `pid`, `returncode` once reaped, `wait`, `communicate`, `kill`."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None
        self._exit: asyncio.Future[int] | None = None

    async def wait(self) -> int:
        """The exit code (-N for signal N), once the process has ended; reaps it."""
        if self._exit is None:
            self._exit = _watch_exit(self)
        # Shielded: a caller's timeout leaves the watch in place for the next wait().
        return await asyncio.shield(self._exit)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        """Write `input` to stdin and close it, read stdout and stderr to their end, and
        wait for the exit: as asyncio.subprocess.Process.communicate."""
        p = self._popen
        out, err, _ = await asyncio.gather(_read_all(p.stdout), _read_all(p.stderr),
                                           _write_all(p.stdin, input or b""))
        await self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _watch_exit(child: Child) -> asyncio.Future[int]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    pidfd = os.pidfd_open(child.pid)

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(child.pid, 0)  # it has ended: this does not block
            child.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere: its status is lost (as asyncio says)
            child.returncode = 255
        # Popen must not poll (and reap) a pid we reaped and the kernel may reuse.
        child._popen.returncode = child.returncode
        done.set_result(child.returncode)

    loop.add_reader(pidfd, exited)
    return done


def _settle(ready: asyncio.Future[None]) -> None:
    # The loop calls this again while the fd stays ready and the waiter has not run yet.
    if not ready.done():
        ready.set_result(None)


async def _ready(fd: int, write: bool) -> None:
    """Until `fd` is readable (or, with `write`, writable)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    (loop.add_writer if write else loop.add_reader)(fd, _settle, ready)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _read_all(pipe: IO[bytes] | None) -> bytes:
    if pipe is None:
        return b""
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                await _ready(fd, write=False)
                continue
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        pipe.close()


async def _write_all(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                await _ready(fd, write=True)
            except BrokenPipeError:  # the child does not read it all: as asyncio does
                return
    finally:
        with contextlib.suppress(BrokenPipeError):
            pipe.close()


async def start(argv: Sequence[str], *, stdin: int = DEVNULL, stdout: int = DEVNULL,
                stderr: int = DEVNULL, env: Mapping[str, str] | None = None,
                cwd: str | None = None, pass_fds: Sequence[int] = (),
                start_new_session: bool = False) -> Child:
    """Start `argv` on a starter thread (OSError as subprocess.Popen raises it)."""
    started = asyncio.get_running_loop().run_in_executor(
        _starter, lambda: subprocess.Popen(
            _argv_at_nice_zero(argv, env), stdin=stdin, stdout=stdout, stderr=stderr,
            env=env, cwd=cwd, pass_fds=tuple(pass_fds),
            start_new_session=start_new_session))
    try:
        popen = await asyncio.shield(started)
    except asyncio.CancelledError:
        # Nobody will wait for it: end it (subprocess reaps an abandoned Popen later).
        started.add_done_callback(_kill_abandoned)
        raise
    return Child(popen)


def _kill_abandoned(started: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if not started.cancelled() and started.exception() is None:
        started.result().kill()
