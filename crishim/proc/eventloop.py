"""How the daemon's event loop watches its child processes.

Python 3.11's default child watcher starts a thread per subprocess and waits, on the
event loop, until that thread runs. A pod start spawns about ten processes (runc, CNI
plugins, conmon); while pods start the worker threads hold the GIL and each of those
waits lasts milliseconds, during which no RPC is answered. A pidfd per child (Linux 5.3)
is watched by the loop itself; Python 3.12 does this on its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings


def pidfd_works() -> bool:
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    os.close(fd)
    return True


def watch_children_by_pidfd() -> bool:
    """Use a pidfd child watcher where Python would start a thread per child; True when
    one was installed."""
    if sys.version_info >= (3, 12) or not pidfd_works():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True
