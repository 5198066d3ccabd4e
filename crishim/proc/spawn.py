"""Child processes started off the event loop, and awaited on it.

Starting a process holds the starting thread until the child has called exec (vfork).
With subprocess.Popen it also holds the interpreter lock for that long, and behind the
runc, conmon and CNI processes of pods that are starting the child can wait tens of
milliseconds for a CPU: every RPC would wait with it. Here the start runs on a starter thread
through glibc's posix_spawn without the lock (proc/posixspawn.py). When the daemon runs
raised (proc/priority.py) the child still begins at nice 0: the starter threads have the
kernel's reset-on-fork flag. The child's exit (pidfd) and its pipes are awaited on the
loop; waitpid, where the kernel frees it, runs on a reaper thread.
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

from crishim.host import modes
from crishim.proc import posixspawn, priority

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
CHUNK = 65536

# A few threads suffice: each waits only until its child has called exec. They run at
# the daemon's priority (proc/priority.py), with reset-on-fork: the child begins at nice
# 0 and execs its program directly.
_libc = posixspawn.PosixSpawn.load()


def _starter_thread() -> None:
    priority.starter_thread()
    modes.child_thread()  # children get umask 022, the daemon keeps 077 (host/modes.py)


_starter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="spawn",
                              initializer=_starter_thread)
# Reaping is not free: inside waitpid the kernel frees the process, and for the CNI
# bridge plugin that is tens of milliseconds of CPU each while pods start. Off the loop,
# then, at nice 0 (threads made from the loop's thread do not keep a raised priority).
_reaper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reap")


def _resolved(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    """`argv` with its program looked up on PATH, as Popen would: a missing one is
    FileNotFoundError, one that may not be run PermissionError."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    program = argv[0] if os.path.dirname(argv[0]) else shutil.which(argv[0], path=path)
    if program is None or not os.path.exists(program):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    if not os.access(program, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    return [program, *argv[1:]]


class Child:
    """A started process: `pid`, `returncode` once reaped, `wait`, `communicate`, `kill`.
    `stdin`, `stdout` and `stderr` are our ends of its pipes (None where not piped); as
    Popen's, they close when collected if nothing closed them."""

    def __init__(self, pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None,
                 stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
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
        out, err, _ = await asyncio.gather(_read_all(self.stdout), _read_all(self.stderr),
                                           _write_all(self.stdin, input or b""))
        await self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _reap(pid: int) -> int:
    try:
        _, status = os.waitpid(pid, 0)  # it has ended: no waiting, only the freeing
    except ChildProcessError:  # reaped elsewhere: its status is lost (as asyncio says)
        return 255
    return os.waitstatus_to_exitcode(status)


def _watch_exit(child: Child) -> asyncio.Future[int]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    pidfd = os.pidfd_open(child.pid)

    def reaped(status: asyncio.Future[int]) -> None:
        child.returncode = status.result()
        done.set_result(child.returncode)

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        loop.run_in_executor(_reaper, _reap, child.pid).add_done_callback(reaped)

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
        pipe.close()


async def start(argv: Sequence[str], *, stdin: int = DEVNULL, stdout: int = DEVNULL,
                stderr: int = DEVNULL, env: Mapping[str, str] | None = None,
                cwd: str | None = None, pass_fds: Sequence[int] = (),
                start_new_session: bool = False) -> Child:
    """Start `argv` on a starter thread; OSError as subprocess.Popen raises it. `stdin`,
    `stdout` and `stderr` are PIPE, DEVNULL or an fd of the caller's (a terminal, say: it
    stays the caller's to close); `pass_fds` stay open in the child under their numbers,
    every other fd of the daemon is closed there."""
    ours: list[int | None] = []
    theirs: list[int | None] = []  # the pipe ends made here for the child
    child: list[int | None] = []
    try:
        for i, how in enumerate((stdin, stdout, stderr)):
            if how == PIPE:
                r, w = os.pipe()
                ours.append(w if i == 0 else r)
                theirs.append(r if i == 0 else w)
            elif how == DEVNULL:
                ours.append(None)
                theirs.append(None)
            elif how >= 0:
                ours.append(None)
                theirs.append(None)
                child.append(how)
                continue
            else:
                raise ValueError(f"stdio {how}: PIPE, DEVNULL or an fd")
            child.append(theirs[-1])
        stdio = posixspawn.Stdio(*child)
        environ = dict(os.environ if env is None else env)
        started = asyncio.get_running_loop().run_in_executor(_starter, lambda: _spawn(
            argv, environ, stdio, cwd, pass_fds, start_new_session))
        try:
            pid = await asyncio.shield(started)
        except asyncio.CancelledError:
            # Nobody will wait for it: end and reap it once it has started.
            started.add_done_callback(_kill_abandoned)
            raise
    except BaseException:
        for fd in ours:
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in theirs:  # the child has its copies
            if fd is not None:
                os.close(fd)
    # File objects, as Popen's: a pipe nobody read to its end still closes when collected.
    return Child(pid, *(None if fd is None else os.fdopen(fd, "rb" if i else "wb", 0)
                        for i, fd in enumerate(ours)))


def _spawn(argv: Sequence[str], env: Mapping[str, str], stdio: posixspawn.Stdio,
           cwd: str | None, pass_fds: Sequence[int], new_session: bool) -> int:
    args = _resolved(argv, env)
    return _libc.spawn(args[0], args, env, stdio, cwd=cwd, pass_fds=pass_fds,
                       new_session=new_session)


def _kill_abandoned(started: asyncio.Future[int]) -> None:
    if started.cancelled() or started.exception() is not None:
        return
    pid = started.result()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reaper.submit(_reap, pid)
