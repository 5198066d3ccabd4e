"""A clock that moves only when the test says so (crishim.image.progress.Clock): a timeout
measured on it cannot fire because the machine is loaded, nor fail to fire because it is
fast."""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.now + seconds, fut)
        self._sleepers.append(entry)
        try:
            await fut
        finally:
            self._sleepers.remove(entry)

    async def advance(self, seconds: float) -> None:
        """Move time on, wake every sleeper now due, and let what they do next run (a few
        turns of the event loop; no real time passes)."""
        self.now += seconds
        for due, fut in list(self._sleepers):
            if due <= self.now and not fut.done():
                fut.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
