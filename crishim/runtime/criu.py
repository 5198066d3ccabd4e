"""Whether CRIU can checkpoint here: `criu check`, run once, when a checkpoint RPC first
asks (never at start: most nodes never checkpoint, and the check takes a while).

The OCI runtimes checkpoint and restore through CRIU (`runc checkpoint` runs the `criu`
on PATH), so a node where it is missing, or where `criu check` fails (a kernel without
what CRIU needs, or a vDSO layout it does not know), cannot take a checkpoint: the
reason is what the RPCs answer, with CRIU's own words.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil

from crishim.log import get_logger
from crishim.proc import spawn

log = get_logger(__name__)

CRIU = "criu"
CHECK_TIMEOUT = 60.0
# What of CRIU's output a reason quotes: its last lines carry the verdict.
_MAX_REASON = 2000


class CriuProbe:
    """`unusable()` answers "" when CRIU can run here, else why not; the first call runs
    `criu check` (concurrent first callers share it) and every later one is answered
    from memory."""

    def __init__(self, path: str = CRIU) -> None:
        self._path = path
        self._reason: str | None = None
        self._lock = asyncio.Lock()

    async def unusable(self) -> str:
        if self._reason is None:
            async with self._lock:
                if self._reason is None:
                    self._reason = await self._check()
                    log.info("CRIU probed", usable=not self._reason, reason=self._reason)
        return self._reason

    async def _check(self) -> str:
        exe = await asyncio.to_thread(shutil.which, self._path)
        if exe is None:
            return f"{self._path} not found in PATH (checkpoints need CRIU)"
        try:
            proc = await spawn.start([exe, "check"], stdout=spawn.PIPE, stderr=spawn.PIPE)
        except OSError as exc:
            return f"{exe} check cannot run: {exc}"
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CHECK_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return f"{exe} check gave no answer within {CHECK_TIMEOUT:.0f}s"
        if proc.returncode == 0:
            return ""
        text = "\n".join(t for t in (err.decode(errors="replace").strip(),
                                     out.decode(errors="replace").strip()) if t)
        return (f"{exe} check failed (exit {proc.returncode}): "
                f"{text[-_MAX_REASON:] or 'no output'}")
