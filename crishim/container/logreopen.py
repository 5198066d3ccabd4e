"""ReopenContainerLog's wait: conmon's ctl fifo has no reply, so once conmon is asked to
reopen the log, the new file is polled for. The kubelet (and critest) look at it as soon
as the call returns.

conmon reopens by creating `<log>.tmp` (truncating, following a link) and renaming it
over `<log>`: that name is first made a fresh regular file of ours, whatever a pod left
there (host/logfiles.py).
"""

from __future__ import annotations

import asyncio
import os
import time

from crishim.errors import FailedPrecondition, Internal
from crishim.host import logfiles
from crishim.runtime import conmon
from crishim.store.container import Container

# How long ReopenContainerLog waits for conmon to recreate the log file.
REOPEN_WAIT = 5.0


async def reopen_log(rec: Container) -> None:
    """Have conmon reopen `rec`'s log file and wait until the file exists again."""
    pod_dir, relative = logfiles.split(rec.log_path, rec.config.log_path)
    if rec.log_path:
        await asyncio.to_thread(logfiles.prepare_reopen, pod_dir, relative)
    try:
        await conmon.reopen_log(rec.bundle)
    except BaseException:
        if rec.log_path:
            await asyncio.to_thread(logfiles.discard_tmp, pod_dir, relative)
        raise
    if rec.log_path and not await _wait_for_file(rec.log_path, REOPEN_WAIT):
        await asyncio.to_thread(logfiles.discard_tmp, pod_dir, relative)
        if not conmon.conmon_alive(rec.persist_dir):
            raise FailedPrecondition(f"the monitor of container {rec.id} is not running; "
                                     "its log cannot be reopened")
        raise Internal(f"conmon did not reopen {rec.log_path} within {REOPEN_WAIT:g}s")


async def _wait_for_file(path: str, limit: float) -> bool:
    """Poll until `path` exists; False after `limit` s."""
    deadline = time.monotonic() + limit
    delay = 0.002
    while not await asyncio.to_thread(os.path.exists, path):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True
