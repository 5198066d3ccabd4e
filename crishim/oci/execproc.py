"""`<runtime> exec`: one more process in a running container, and its teardown.

The runtime runs in the foreground as the exec'd process's parent, so its exit status is
the command's. Teardown (`ExecProcess.terminate`, also run when `run_exec`'s block ends
early: a timeout, a client gone, an error) SIGKILLs the exec'd process, found through
the runtime's --pid-file, and lets the runtime reap it; only a runtime that has not
exited `REAP_WAIT` seconds later is killed too. Killing the runtime together with the
process would orphan the process to the container's init, which rarely reaps: a zombie
the container's `ps` keeps showing.
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
from crishim.oci.runc import OCIRuntime, read_pid_file

log = get_logger(__name__)

# How long the runtime gets to reap its killed process before it is killed too.
REAP_WAIT = 5.0
# How long a killed runtime may take to go.
KILL_WAIT = 10.0

# What a subprocess stdio argument may be: PIPE, DEVNULL, an fd or a file.
Stdio = int | IO[Any] | None


class ExecProcess:
    """A running `<runtime> exec`: `proc` is the runtime process (its stdio is the exec'd
    process's, or the pty the runtime copies to the container's terminal)."""

    def __init__(self, proc: asyncio.subprocess.Process, pid_file: str) -> None:
        self.proc = proc
        self.pid_file = pid_file

    def started_at(self) -> float | None:
        """When the runtime had started the exec'd process (wall clock: the pid file's
        mtime, as the runtime writes it once the process runs); None before that."""
        try:
            return os.stat(self.pid_file).st_mtime
        except OSError:
            return None

    async def terminate(self) -> None:
        """Kill the exec'd process and wait for the runtime to exit; idempotent."""
        if self.proc.returncode is not None:
            return
        pid = read_pid_file(self.pid_file)
        log.info("killing exec'd process", pid=pid)
        if pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), REAP_WAIT)
                return
        # No pid yet (the runtime is still setting up) or the runtime hangs.
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), KILL_WAIT)


@contextlib.asynccontextmanager
async def run_exec(runtime: OCIRuntime, cid: str, process: dict[str, Any], work_dir: str, *,
                   stdin: Stdio, stdout: Stdio, stderr: Stdio) -> AsyncIterator[ExecProcess]:
    """Run `process` (an OCI process spec) in container `cid` for the block's duration;
    the process is torn down if it still runs when the block ends. The process spec and
    the pid file live in `work_dir` until then."""
    os.makedirs(work_dir, mode=0o700, exist_ok=True)
    fd, process_file = tempfile.mkstemp(prefix="exec-", suffix=".json", dir=work_dir)
    pid_file = process_file[:-len(".json")] + ".pid"
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(process, fh)
        proc = await asyncio.create_subprocess_exec(
            *runtime.exec_args(cid, process_file, pid_file), stdin=stdin, stdout=stdout,
            stderr=stderr, start_new_session=True)
        ex = ExecProcess(proc, pid_file)
        try:
            yield ex
        finally:
            # Shielded: a second cancellation must not cut the kill-and-reap short.
            await asyncio.shield(ex.terminate())
    finally:
        for path in (process_file, pid_file):
            with contextlib.suppress(OSError):
                os.unlink(path)
