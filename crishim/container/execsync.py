"""ExecSync: run a command in a running container with `runc exec` and collect its output.

stdout and stderr are each capped at 16 MiB, and together at what fits in one 16 MiB gRPC
reply (the kubelet's limit); the rest is read and thrown away so the process never
blocks on a full pipe. On timeout the exec'd process is killed (crishim.oci.execproc) and
DeadlineExceeded raised.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from crishim.errors import DeadlineExceeded
from crishim.oci.execproc import run_exec
from crishim.oci.runc import OCIRuntime

MAX_OUTPUT = 16 * 1024 * 1024
# The whole ExecSyncResponse must fit in one gRPC message (16 MiB for the kubelet and our
# server), so both streams together get what is left after the message overhead.
REPLY_BUDGET = 16 * 1024 * 1024 - 1024


def fit_reply(out: bytes, err: bytes, budget: int = REPLY_BUDGET) -> tuple[bytes, bytes]:
    """Trim so len(out) + len(err) <= budget: each stream is guaranteed half, and a
    stream that needs less leaves the rest to the other."""
    if len(out) + len(err) <= budget:
        return out, err
    half = budget // 2
    if len(err) < half:
        return out[:budget - len(err)], err
    if len(out) < half:
        return out, err[:budget - len(out)]
    return out[:half], err[:budget - half]


@dataclass
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int


async def _drain(stream: asyncio.StreamReader, limit: int) -> bytes:
    buf = bytearray()
    while chunk := await stream.read(65536):
        room = limit - len(buf)
        if room > 0:
            buf += chunk[:room]
    return bytes(buf)


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
    async with run_exec(runtime, cid, process, work_dir, stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE) as ex:
        assert ex.proc.stdout is not None and ex.proc.stderr is not None
        collect = asyncio.gather(_drain(ex.proc.stdout, MAX_OUTPUT),
                                 _drain(ex.proc.stderr, MAX_OUTPUT), ex.proc.wait())
        try:
            out, err, rc = await asyncio.wait_for(collect, limit_s if limit_s > 0 else None)
        except TimeoutError:
            # Leaving the block kills the process (run_exec's teardown).
            raise DeadlineExceeded(f"command {process['args']!r} timed out after "
                                   f"{limit_s:g}s; the process was killed") from None
    # The runtime exits with the exec'd process's status (128+n for a signal).
    out, err = fit_reply(out, err)
    return ExecResult(out, err, rc)
