"""The daemon's garbage collector: what it scans while pods start.

A full (oldest-generation) collection walks every object the process tracks. Most of
them are made at start-up and live as long as the daemon: modules, the gRPC and protobuf
runtimes, the recovered stores. While a hundred pods start, walking them holds the event
loop for tens of milliseconds, and every RPC waits that long. Freezing the heap once
start-up is done moves those objects out of the collector's sight; what comes later
(pods, containers, replies) is still collected.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect what start-up left behind, then exempt the survivors from later
    collections; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
