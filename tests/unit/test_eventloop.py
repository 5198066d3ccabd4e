"""The daemon's loop watches its children by pidfd: no thread per spawned process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crishim.proc import eventloop

CHILD = """
import asyncio, threading
from crishim.proc import eventloop
assert eventloop.watch_children_by_pidfd()

async def main() -> None:
    before = threading.active_count()
    proc = await asyncio.create_subprocess_exec("sh", "-c", "sleep 0.2; exit 3")
    during = threading.active_count()
    assert await proc.wait() == 3
    print(before, during)

asyncio.run(main())
"""


@pytest.mark.skipif(sys.version_info >= (3, 12) or not eventloop.pidfd_works(),
                    reason="Python 3.12 watches by pidfd itself; or no pidfd here")
def test_children_are_watched_without_a_thread_each() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[0] == out[1]  # the child is waited for, and no thread was started for it
