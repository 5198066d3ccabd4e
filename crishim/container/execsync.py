"""ExecSync: run a command in a running container with `runc exec` and collect its output.

stdout and stderr are each capped at 16 MiB, and together at what fits in one 16 MiB gRPC
reply (the kubelet's limit); the rest is read and thrown away so the process never
blocks on a full pipe. On timeout the exec'd process is killed (crishim.runtime.execproc) and
DeadlineExceeded raised.

The time limit is the command's: it counts from when the runtime has started the process,
not from the call, so a runtime slow to set up (`runc exec` takes over a second on a
loaded or emulated host) does not fail a kubelet's 1 s exec probe whose command is quick.
The runtime's setup gets `START_LIMIT` on its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from crishim.errors import DeadlineExceeded
from crishim.proc import spawn
from crishim.runtime.execproc import ExecProcess, run_exec
from crishim.runtime.runc import OCIRuntime

MAX_OUTPUT = 16 * 1024 * 1024
# The whole ExecSyncResponse must fit in one gRPC message (16 MiB for the kubelet and our
# server), so both streams together get what is left after the message overhead.
REPLY_BUDGET = 16 * 1024 * 1024 - 1024
# How long the runtime may take to start the exec'd process before the call gives up.
START_LIMIT = 30.0
# How often a runtime that is still setting up is checked for the started process.
START_POLL = 0.02


def fit_lengths(n_out: int, n_err: int, budget: int = REPLY_BUDGET) -> tuple[int, int]:
    """How much of each stream fits, so that the two together are <= budget: each stream
    is guaranteed half, and a stream that needs less leaves the rest to the other."""
    if n_out + n_err <= budget:
        return n_out, n_err
    half = budget // 2
    if n_err < half:
        return budget - n_err, n_err
    if n_out < half:
        return n_out, budget - n_out
    return half, budget - half


def fit_reply(out: bytes, err: bytes, budget: int = REPLY_BUDGET) -> tuple[bytes, bytes]:
    """`out` and `err` trimmed by fit_lengths."""
    k_out, k_err = fit_lengths(len(out), len(err), budget)
    return out[:k_out], err[:k_err]


@dataclass
class ExecResult:
    # Buffers, not bytes: the reply is built in stdout's own memory (cri/execreply.py).
    stdout: bytearray
    stderr: bytearray
    exit_code: int


class _Output:
    """One stream's output as read, up to `limit` bytes, in one buffer that is the
    reply's: trimmed in place, never copied (a buffer converted to bytes would hold the
    output twice, and a trim a third time). A large buffer grows in place (realloc)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()

    async def drain(self, stream: asyncio.StreamReader) -> None:
        # What is past the limit is read and thrown away: the process never blocks.
        while chunk := await stream.read(65536):
            room = self.limit - len(self.buf)
            if room > 0:
                self.buf += chunk if len(chunk) <= room else chunk[:room]

    def take(self, n: int) -> bytearray:
        """The first `n` bytes, the buffer itself."""
        buf, self.buf = self.buf, bytearray()
        del buf[n:]
        return buf


def exec_process(spec_process: dict[str, Any], cmd: list[str], tty: bool = False
                 ) -> dict[str, Any]:
    """The container's process spec with `cmd` as args (same user, env, caps, cwd)."""
    proc = {k: v for k, v in spec_process.items() if k not in ("consoleSize",)}
    proc["args"] = list(cmd)
    proc["terminal"] = tty
    return proc


async def exec_sync(runtime: OCIRuntime, cid: str, process: dict[str, Any], work_dir: str,
                    limit_s: float) -> ExecResult:
    """Run `process` in container `cid`; `limit_s` <= 0 means no time limit."""
    async with run_exec(runtime, cid, process, work_dir, stdin=spawn.DEVNULL,
                        stdout=spawn.PIPE, stderr=spawn.PIPE) as ex:
        assert ex.stdout is not None and ex.stderr is not None
        out, err = _Output(MAX_OUTPUT), _Output(MAX_OUTPUT)
        collect = asyncio.gather(out.drain(ex.stdout), err.drain(ex.stderr), ex.proc.wait())
        # Leaving the block early kills the process (run_exec's teardown).
        _, _, rc = await _within_limit(collect, ex, process["args"], limit_s)
    # The runtime exits with the exec'd process's status (128+n for a signal).
    n_out, n_err = fit_lengths(len(out.buf), len(err.buf))
    return ExecResult(out.take(n_out), err.take(n_err), rc)


async def _within_limit(collect: asyncio.Future[tuple[None, None, int]], ex: ExecProcess,
                        args: list[str], limit_s: float) -> tuple[None, None, int]:
    """`collect`'s result, once the command has run for at most `limit_s` from its start."""
    if limit_s <= 0:
        return await collect
    spawned_wall, spawned = time.time(), time.monotonic()
    deadline = spawned + limit_s
    try:
        while True:
            done, _ = await asyncio.wait({collect}, timeout=max(0.0, deadline - time.monotonic()))
            if done:
                return collect.result()
            started = ex.started_at()
            if started is not None:
                # The runtime's setup time does not count against the command.
                deadline = spawned + max(0.0, started - spawned_wall) + limit_s
                if deadline <= time.monotonic():
                    raise DeadlineExceeded(f"command {args!r} timed out after {limit_s:g}s; "
                                           "the process was killed")
            elif time.monotonic() - spawned >= START_LIMIT:
                raise DeadlineExceeded(f"the runtime did not start command {args!r} within "
                                       f"{START_LIMIT:g}s; it was killed")
            else:
                deadline = time.monotonic() + START_POLL
    finally:
        if not collect.done():
            collect.cancel()
            # A cancelled gather ends holding a CancelledError (or a child's error) that
            # nobody awaits any more: retrieve it, or asyncio logs "exception was never
            # retrieved" with a traceback for every timed-out probe.
            collect.add_done_callback(_retrieve)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
