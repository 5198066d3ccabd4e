"""Pull progress watchdog: a pull whose registry stops sending bytes is cancelled.

    watchdog = PullWatchdog(ref, timeout)        one per pull
    feed = ProgressFeed(watchdog)                what downloads report to (a layer download
                                                 shared by several pulls feeds them all)
    with feed.transfer("layer sha256:…", host, size) as t:
        ... t.advance(len(chunk)) for every chunk that arrives ...
    async with watchdog.guard():                 around the whole pull
        ...

The watchdog reads time from a Clock (tests pass one they move by hand).

The clock runs only while the pull waits on the network: it restarts whenever any byte
of any of the pull's transfers arrives, and when a transfer starts after a moment with
none in flight (waiting for a download slot, unpacking, or backing off before a retry is
not the registry's fault). When it reaches `timeout`, the pull is cancelled and answered
with PullStalled, naming what it was waiting for.

A pull that runs longer than PROGRESS_EVERY logs its progress at that interval: bytes
received, layers done, the rate since the last line and the downloads in flight; an
interval without a byte says so as a warning naming the downloads it waits for (long
before the timeout cancels it). Every byte also counts in crishim_image_pull_bytes_total
as it arrives, so the pull's rate shows in the metrics while it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Protocol

from crishim.errors import Unavailable
from crishim.log import get_logger
from crishim.observe import metrics

log = get_logger(__name__)

CONFIG_KEY = "registry.image_pull_progress_timeout"
PROGRESS_EVERY = 5.0  # seconds between two progress lines of a long pull


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """time.monotonic and asyncio.sleep."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


MONOTONIC = MonotonicClock()


class PullStalled(Unavailable):
    """No bytes arrived from the registry for image_pull_progress_timeout seconds. The
    registry is what failed, and a later pull may well work (as UNAVAILABLE)."""


class Transfer:
    """One download in flight (a manifest, a config or a layer blob)."""

    def __init__(self, feed: ProgressFeed, what: str, host: str, size: int) -> None:
        self._feed = feed
        self.what = what
        self.host = host  # updated to the endpoint (mirror or upstream) being asked
        self.size = size
        self.received = 0

    def advance(self, n: int) -> None:
        """`n` bytes arrived (0: a response's headers did)."""
        self.received += n
        for w in self._feed.watchdogs:
            w.last = w.clock.monotonic()
            w.received += n
        metrics.add_image_pull_bytes(n)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Waiting for local work (the unpack thread has a full queue): not a stall."""
        self._feed.end(self)
        try:
            yield
        finally:
            self._feed.begin(self)

    def describe(self) -> str:
        got = f"{self.received} of {self.size}" if self.size >= 0 else str(self.received)
        return f"{self.what} from {self.host} ({got} bytes received)"


class ProgressFeed:
    """Transfers of one pull, or of one layer download several pulls wait for."""

    def __init__(self, *watchdogs: PullWatchdog) -> None:
        self.watchdogs: list[PullWatchdog] = list(watchdogs)
        self._active: dict[int, Transfer] = {}

    def watch(self, watchdog: PullWatchdog) -> None:
        """Another pull waits for this feed's transfers too."""
        if watchdog in self.watchdogs:
            return
        self.watchdogs.append(watchdog)
        for t in self._active.values():
            watchdog.begin(t)

    @contextmanager
    def transfer(self, what: str, host: str, size: int = -1) -> Iterator[Transfer]:
        t = Transfer(self, what, host, size)
        self.begin(t)
        try:
            yield t
        finally:
            self.end(t)

    def begin(self, t: Transfer) -> None:
        self._active[id(t)] = t
        for w in self.watchdogs:
            w.begin(t)

    def end(self, t: Transfer) -> None:
        self._active.pop(id(t), None)
        for w in self.watchdogs:
            w.end(t)


class PullWatchdog:
    def __init__(self, image: str, timeout: float, clock: Clock = MONOTONIC) -> None:
        self.image = image
        self.timeout = timeout
        self.clock = clock
        self.last = clock.monotonic()  # last byte, or start of activity after idle
        self._active: dict[int, Transfer] = {}
        self.stalled = ""  # the error message, once the watchdog fired
        self.started = self.last
        self.received = 0  # bytes of this pull's transfers so far
        self.layers = 0  # of the image, once its manifest is read
        self.layers_done = 0

    def begin(self, t: Transfer) -> None:
        if not self._active:
            self.last = self.clock.monotonic()
        self._active[id(t)] = t

    def end(self, t: Transfer) -> None:
        self._active.pop(id(t), None)

    @asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Run the body, logging its progress; cancel it and raise PullStalled if it
        stops making progress."""
        reporter = asyncio.create_task(self._report())
        try:
            if self.timeout <= 0:
                yield
            else:
                async with self._watchdog():
                    yield
        finally:
            reporter.cancel()

    async def _report(self) -> None:
        last_bytes, last_time = 0, self.started
        while True:
            await self.clock.sleep(PROGRESS_EVERY)
            now = self.clock.monotonic()
            kv = {"image": self.image, "seconds": round(now - self.started, 1),
                  "received_bytes": self.received,
                  "layers_done": f"{self.layers_done}/{self.layers}",
                  "bytes_per_second": round((self.received - last_bytes)
                                            / max(now - last_time, 1e-3))}
            if self._active and self.received == last_bytes:
                log.warning("image pull receives nothing", **kv,
                            waiting_for=self._waiting_for())
            else:
                log.info("image pull in progress", **kv, downloading=self._waiting_for())
            last_bytes, last_time = self.received, now

    @asynccontextmanager
    async def _watchdog(self) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(None) as deadline:
                watcher = asyncio.create_task(self._watch(deadline))
                try:
                    yield
                finally:
                    watcher.cancel()
        except TimeoutError:
            if not self.stalled:
                raise
            raise PullStalled(self.stalled) from None
        except Exception as exc:
            # Cleanup after the cancel may have failed in its own way; the stall is the
            # cause the client needs to hear about.
            if not self.stalled or isinstance(exc, PullStalled):
                raise
            raise PullStalled(self.stalled) from None

    async def _watch(self, deadline: asyncio.Timeout) -> None:
        while True:
            due = self.last + self.timeout
            now = self.clock.monotonic()
            if now < due:
                await self.clock.sleep(due - now)
                continue
            if not self._active:  # idle: the next transfer restarts the clock
                await self.clock.sleep(self.timeout)
                continue
            self.stalled = self._message()
            log.warning("image pull stalled, cancelling it", image=self.image,
                        timeout=self.timeout, waiting_for=self._waiting_for())
            deadline.reschedule(asyncio.get_running_loop().time())
            return

    def _waiting_for(self) -> str:
        items = sorted(self._active.values(), key=lambda t: t.what)
        text = "; ".join(t.describe() for t in items[:3])
        if len(items) > 3:
            text += f"; and {len(items) - 3} more"
        return text

    def _message(self) -> str:
        hosts = sorted({t.host for t in self._active.values()})
        return (f"pull of image {self.image} stalled: no bytes from registry "
                f"{', '.join(hosts)} for {self.timeout:g}s while waiting for "
                f"{self._waiting_for()}; the pull was cancelled and left nothing behind "
                f"(raise {CONFIG_KEY} for slow registries; 0 disables this)")
