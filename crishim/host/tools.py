"""Versions of the host parts crishim drives, for Status(verbose) and `crictl info`."""

from __future__ import annotations

import asyncio
import contextlib
import shutil


async def tool_version(path: str, *args: str) -> str:
    """First line of `<path> --version`, or a short reason when it cannot run."""
    exe = shutil.which(path)
    if exe is None:
        return "not found"
    try:
        proc = await asyncio.create_subprocess_exec(
            exe, *(args or ("--version",)), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
    except OSError as exc:
        return f"error: {exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=5)
    except TimeoutError:
        # A hung tool must not outlive the Status call that asked for its version.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return "error: no answer to --version within 5s"
    lines = out.decode(errors="replace").strip().splitlines()
    return lines[0] if lines else ""
