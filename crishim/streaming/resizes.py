"""Terminal resizes of attached containers, written to conmon one at a time and only the
latest.

conmon reads its control fifo into one buffer and misparses lines that arrive together
(a burst of resizes from many attach clients reached it as sizes like 1x24): each
container's resizes are therefore written in turn, `gap` seconds apart, and a size that a
newer one replaced while waiting is never written. Whatever a client sends, conmon sees
at most one resize per gap per container, and the last size always lands.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from crishim.streaming.interface import TerminalSize

# Between two resizes of one container: short against a person resizing a window.
RESIZE_GAP = 0.05

Write = Callable[[str, int, int], Awaitable[None]]  # (bundle, height, width)


class TerminalResizes:
    def __init__(self, write: Write, gap: float = RESIZE_GAP) -> None:
        self._write = write
        self._gap = gap
        self._latest: dict[str, TerminalSize] = {}
        self._writers: dict[str, asyncio.Task[None]] = {}

    def resize(self, bundle: str, size: TerminalSize) -> None:
        """Ask for `size` on the terminal of the container at `bundle` (not waited for)."""
        self._latest[bundle] = size
        if bundle not in self._writers:
            self._writers[bundle] = asyncio.create_task(self._drain(bundle))

    async def _drain(self, bundle: str) -> None:
        try:
            while (size := self._latest.pop(bundle, None)) is not None:
                # A container that is gone or stopping has no terminal to resize.
                with contextlib.suppress(Exception):
                    await self._write(bundle, size.height, size.width)
                await asyncio.sleep(self._gap)
        finally:
            # No await between the empty pop and this: a resize() in between cannot be
            # left without a writer.
            del self._writers[bundle]

    async def wait_idle(self) -> None:
        """Until every asked-for size has been written (for tests and shutdown)."""
        while self._writers:
            await asyncio.gather(*self._writers.values(), return_exceptions=True)
