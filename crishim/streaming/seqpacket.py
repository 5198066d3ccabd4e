"""Connecting to a SOCK_SEQPACKET unix socket (conmon's attach socket) from the loop.

A unix connect to a listener whose backlog is full fails at once with EAGAIN; it is not
"in progress" as for TCP, yet asyncio's `sock_connect` takes it so, waits for the socket
to be writable (an unconnected one always is) and hands back a socket that never
connected: the attach ends at once with no output and no error. conmon's backlog is
short, so a burst of kubectl attaches finds it full. Here a full backlog, and a refusal
while the listener is being set up, are retried with a fresh socket until `wait` ends.
"""

from __future__ import annotations

import asyncio
import socket
import time

CONNECT_WAIT = 5.0
_FIRST_DELAY = 0.005
_MAX_DELAY = 0.1


async def connect(path: str, wait: float = CONNECT_WAIT) -> socket.socket:
    """A non-blocking SOCK_SEQPACKET socket connected to `path`; the last OSError once
    `wait` seconds of retries are over (others at once)."""
    deadline = time.monotonic() + wait
    delay = _FIRST_DELAY
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            # Never blocks: a unix connect completes or fails at once.
            sock.connect(path)
            return sock
        except (BlockingIOError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() + delay > deadline:
                raise
        except BaseException:
            sock.close()
            raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY)
