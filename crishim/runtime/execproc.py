"""`<runtime> exec`: one more process in a running container, and its teardown.

The runtime runs in the foreground as the exec'd process's parent, so its exit status is
the command's. Teardown (`ExecProcess.terminate`, also run when `run_exec`'s block ends
early: a timeout, a client gone, an error) SIGKILLs the exec'd process, found through
the runtime's --pid-file, and lets the runtime reap it; only a runtime that has not
exited `REAP_WAIT` seconds later is killed too. Killing the runtime together with the
process would orphan the process to the container's init, which rarely reaps: a zombie
the container's `ps` keeps showing.

A client can leave while the runtime is still starting the process: the runtime writes
the pid file only once the process runs, so teardown waits (up to `START_WAIT`) for the
pid file or the runtime's exit rather than killing the runtime blind, which would leave
the process it was about to start running in the container. A runtime that starts
nothing within that time is stopped and its children (runc's init stages, or the process
itself: runc clones them all as its own children) are killed before it is, so nothing it
made is handed to the container's init.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from typing import IO, Any

from crishim.log import get_logger
from crishim.observe import tracing
from crishim.proc import spawn
from crishim.runtime.runc import OCIRuntime, read_pid_file

log = get_logger(__name__)

# How long the runtime gets to reap its killed process before it is killed too.
REAP_WAIT = 5.0
# How long a killed runtime may take to go.
KILL_WAIT = 10.0
# How long teardown waits for a runtime still starting the process to write its pid.
START_WAIT = 10.0
# How often that wait looks at the pid file.
START_POLL = 0.01
# What one read of the command's output may return (asyncio's default buffer limit).
READ_LIMIT = 64 * 1024


class ExecProcess:
    """A running `<runtime> exec`: `proc` is the runtime process; `stdin`, `stdout` and
    `stderr` are its piped stdio as asyncio streams (None where not piped: a terminal, or
    /dev/null). The runtime's stdio is the exec'd process's, or the pty the runtime copies
    to the container's terminal."""

    def __init__(self, proc: spawn.Child, pid_file: str,
                 stdin: asyncio.StreamWriter | None = None,
                 stdout: asyncio.StreamReader | None = None,
                 stderr: asyncio.StreamReader | None = None) -> None:
        self.proc = proc
        self.pid_file = pid_file
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    def started_at(self) -> float | None:
        """When the runtime had started the exec'd process (wall clock: the pid file's
        mtime, as the runtime writes it once the process runs); None before that."""
        try:
            return os.stat(self.pid_file).st_mtime
        except OSError:
            return None

    async def terminate(self) -> None:
        """Kill the exec'd process and wait for the runtime to exit; idempotent."""
        await terminate(self.proc, self.pid_file)


async def terminate(proc: spawn.Child, pid_file: str) -> None:
    """Kill the process the runtime `proc` exec'd (its pid in `pid_file`) and wait for
    the runtime to exit; idempotent. A runtime still starting the process is given
    `START_WAIT` to start it (or fail) first."""
    if proc.returncode is not None:
        return
    pid = await _started_pid(proc, pid_file, START_WAIT)
    if proc.returncode is not None:
        return  # done, or it failed to start the process (and cleaned up after itself)
    log.info("killing exec'd process", pid=pid)
    if pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), REAP_WAIT)
            return
    # The runtime started nothing in START_WAIT, or does not reap what it started.
    await _kill_runtime_and_children(proc)


async def _started_pid(proc: spawn.Child, pid_file: str, limit: float) -> int:
    """The exec'd process's pid once the runtime wrote it; 0 if the runtime exited or
    `limit` s passed first."""
    deadline = asyncio.get_running_loop().time() + limit
    exited = asyncio.ensure_future(proc.wait())
    try:
        while (pid := read_pid_file(pid_file)) <= 0 and not exited.done():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return 0
            await asyncio.wait({exited}, timeout=min(START_POLL, left))
        return pid if not exited.done() else 0
    finally:
        if not exited.done():
            exited.cancel()


async def _kill_runtime_and_children(proc: spawn.Child) -> None:
    """SIGKILL the runtime and every child it has. It is stopped first so that it clones
    nothing more meanwhile; its children are killed while they are still its own (once
    it is gone they belong to someone else and cannot be told apart)."""
    proc.send_signal(signal.SIGSTOP)
    await asyncio.to_thread(_kill_children, proc.pid)
    proc.kill()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_WAIT)


# Rounds of looking for children: a child killed may have cloned one more in the meantime
# (runc's init stages clone their successors as the runtime's children).
_CHILD_ROUNDS = 10


def _kill_children(parent: int) -> None:
    for _ in range(_CHILD_ROUNDS):
        living = [pid for pid, state in children(parent) if state not in ("Z", "X")]
        if not living:
            return
        for pid in living:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def children(parent: int) -> list[tuple[int, str]]:
    """(pid, state letter) of each process whose parent is `parent`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone meanwhile
        # "<pid> (<comm>) <state> <ppid> ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(parent):
            found.append((int(name), fields[0]))
    return found


@contextlib.asynccontextmanager
async def run_exec(runtime: OCIRuntime, cid: str, process: dict[str, Any], work_dir: str, *,
                   stdin: int, stdout: int, stderr: int) -> AsyncIterator[ExecProcess]:
    """Run `process` (an OCI process spec) in container `cid` for the block's duration;
    the process is torn down if it still runs when the block ends. `stdin`, `stdout` and
    `stderr` are spawn.PIPE, spawn.DEVNULL or an fd (a terminal). The process spec and the
    pid file live in `work_dir` until then.

    Kubelet exec probes make this the daemon's most frequent process start: the file and
    the start both run off the event loop (proc/spawn.py), which a start from the loop's thread
    would hold until the child has called exec."""
    writing = asyncio.ensure_future(asyncio.to_thread(_write_process_file, work_dir, process))
    try:
        process_file = await asyncio.shield(writing)
    except asyncio.CancelledError:
        writing.add_done_callback(_remove_written)
        raise
    pid_file = process_file[:-len(".json")] + ".pid"
    try:
        with tracing.span(f"{runtime.name} exec", **{"oci.runtime": runtime.name,
                                                     "oci.container_id": cid}):
            starting = asyncio.ensure_future(spawn.start(
                runtime.exec_args(cid, process_file, pid_file), stdin=stdin, stdout=stdout,
                stderr=stderr, start_new_session=True))
            try:
                proc = await asyncio.shield(starting)
            except asyncio.CancelledError:
                # The caller left while the runtime was being started: once it has started,
                # it is torn down as below, never killed blind (spawn's way with an
                # abandoned start), which would orphan the process it goes on to start.
                await asyncio.shield(_tear_down_started(starting, pid_file))
                raise
            try:
                yield ExecProcess(proc, pid_file, *await _streams(proc))
            finally:
                # Shielded: a second cancellation must not cut the kill-and-reap short.
                await asyncio.shield(terminate(proc, pid_file))
    finally:
        await asyncio.shield(asyncio.to_thread(_remove, process_file, pid_file))


async def _tear_down_started(starting: asyncio.Future[spawn.Child], pid_file: str) -> None:
    try:
        proc = await starting
    except Exception:
        return  # nothing started
    try:
        await terminate(proc, pid_file)
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _remove_written(writing: asyncio.Future[str]) -> None:
    if not writing.cancelled() and writing.exception() is None:
        _remove(writing.result())


def _write_process_file(work_dir: str, process: dict[str, Any]) -> str:
    os.makedirs(work_dir, mode=0o700, exist_ok=True)
    fd, process_file = tempfile.mkstemp(prefix="exec-", suffix=".json", dir=work_dir)
    with os.fdopen(fd, "w") as fh:
        json.dump(process, fh)
    return process_file


def _remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


async def _streams(proc: spawn.Child) -> tuple[asyncio.StreamWriter | None,
                                               asyncio.StreamReader | None,
                                               asyncio.StreamReader | None]:
    """The child's pipes as asyncio streams, as asyncio.subprocess would give them."""
    return (await _writer(proc.stdin) if proc.stdin is not None else None,
            await _reader(proc.stdout) if proc.stdout is not None else None,
            await _reader(proc.stderr) if proc.stderr is not None else None)


async def _reader(pipe: IO[bytes]) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_LIMIT, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader


async def _writer(pipe: IO[bytes]) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    # The protocol's flow control is what StreamWriter.drain waits on; it reads nothing.
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)
