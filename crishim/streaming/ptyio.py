"""Async I/O on raw file descriptors (pty masters, pipes) for exec sessions.

The fds are set non-blocking and driven by the event loop's reader/writer callbacks, so
no thread is parked per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import struct
import termios
from collections.abc import AsyncIterator

from crishim.streaming.interface import ByteSink, ByteSource, TerminalSize

EOT = b"\x04"  # what a terminal sends for end-of-input


def set_winsize(fd: int, size: TerminalSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.height, size.width, 0, 0))


def get_winsize(fd: int) -> TerminalSize:
    h, w, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return TerminalSize(w, h)


def set_nonblocking(fd: int) -> None:
    os.set_blocking(fd, False)


async def _wait(fd: int, write: bool) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if write:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def read_fd(fd: int, n: int = 65536) -> bytes:
    """Up to n bytes; b"" at EOF (a pty master reports EIO once the slave side is gone)."""
    while True:
        try:
            return os.read(fd, n)
        except BlockingIOError:
            await _wait(fd, write=False)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise


async def write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
            view = view[n:]
        except BlockingIOError:
            await _wait(fd, write=True)


async def pump_out(fd: int, sink: ByteSink | None) -> None:
    """fd → sink until EOF; output nobody asked for is read and dropped (never blocks)."""
    while data := await read_fd(fd):
        if sink is not None:
            await sink.write(data)
    if sink is not None:
        await sink.close()


async def pump_in(src: ByteSource, fd: int, tty: bool) -> None:
    """src → fd. At EOF a pipe is closed; a terminal gets EOT (closing would hang up)."""
    try:
        while data := await src.read(32 * 1024):
            await write_fd(fd, data)
        if tty:
            await write_fd(fd, EOT)
    except OSError:
        pass  # the process closed its stdin
    finally:
        if not tty:
            with contextlib.suppress(OSError):
                os.close(fd)


async def apply_resizes(fd: int, sizes: AsyncIterator[TerminalSize]) -> None:
    async for size in sizes:
        if size.width > 0 and size.height > 0:
            with contextlib.suppress(OSError):
                set_winsize(fd, size)
