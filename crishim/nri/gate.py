"""Events beside a plugin's synchronization: a new plugin misses nothing between its
snapshot and its first event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class SyncGate:
    """Events run side by side; a synchronization waits for those in flight and keeps
    new ones out until it is done (the reference's plugin sync lock)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._events = 0
        self._syncing = False

    @contextlib.asynccontextmanager
    async def event(self) -> AsyncIterator[None]:
        if self._syncing:
            async with self._cond:
                await self._cond.wait_for(lambda: not self._syncing)
        self._events += 1
        try:
            yield
        finally:
            self._events -= 1
            if self._events == 0 and self._syncing:
                async with self._cond:
                    self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def sync(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._syncing)
            self._syncing = True
            await self._cond.wait_for(lambda: self._events == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._syncing = False
                self._cond.notify_all()
