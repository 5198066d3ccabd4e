"""Versions of the host parts crishim drives, for Status(verbose) and `crictl info`."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field


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
        # A hung tool must not hold up the daemon's start for long.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return "error: no answer to --version within 5s"
    lines = out.decode(errors="replace").strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class ToolVersions:
    """Tool name → the first line of its `--version` (or why it has none), as found at
    start; Status(verbose) reports them without running anything."""

    versions: Mapping[str, str] = field(default_factory=dict)


async def probe(tools: Mapping[str, str]) -> ToolVersions:
    """Tool name → path: each asked for its version once, concurrently."""
    found = await asyncio.gather(*(tool_version(path) for path in tools.values()))
    return ToolVersions(dict(zip(tools, found, strict=True)))
