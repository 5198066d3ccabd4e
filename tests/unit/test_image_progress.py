"""image_pull_progress_timeout: a pull whose registry stops sending bytes is cancelled with
a clear error and leaves nothing behind; a slow pull that keeps making progress is not.

The watchdog alone first, then whole pulls through ImageManager against a small HTTP
registry on a local socket that can stall or hold back chosen blobs. Time is a FakeClock
moved by the test (or by the registry once the pull has read what it sent), so a loaded
machine can neither fire a timeout early nor keep one from firing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from crishim.config import Config
from crishim.image import progress
from crishim.image.manager import ImageManager
from crishim.image.progress import ProgressFeed, PullStalled, PullWatchdog, Transfer
from crishim.store.db import Database
from tests.e2e import imagebuild as ib
from tests.fakes.clock import FakeClock

# --- the watchdog ----------------------------------------------------------------------------


async def forever() -> None:
    """A registry that never answers; a real deadline only so that a watchdog that never
    fires fails the test instead of hanging it."""
    await asyncio.wait_for(asyncio.Event().wait(), 30)


async def test_no_bytes_for_the_timeout_cancels_with_a_clear_error() -> None:
    clock = FakeClock()
    w = PullWatchdog("registry.test/app:v1", 0.2, clock)
    feed = ProgressFeed(w)
    with pytest.raises(PullStalled) as err:
        async with w.guard():
            with feed.transfer("layer sha256:abc", "registry.test", 1000) as t:
                t.advance(10)
                await clock.advance(0.19)
                assert not w.stalled
                await clock.advance(0.02)
                await forever()
    assert clock.now == pytest.approx(0.21)
    msg = str(err.value)
    for part in ("registry.test/app:v1", "layer sha256:abc", "registry.test",
                 "10 of 1000 bytes", "0.2s", "registry.image_pull_progress_timeout"):
        assert part in msg, msg


async def test_the_real_clock_fires_too() -> None:
    w = PullWatchdog("registry.test/app:v1", 0.05)
    with pytest.raises(PullStalled):
        async with w.guard():
            with ProgressFeed(w).transfer("layer sha256:abc", "registry.test"):
                await forever()


async def test_bytes_keep_a_long_pull_alive() -> None:
    clock = FakeClock()
    w = PullWatchdog("registry.test/app:v1", 0.2, clock)
    feed = ProgressFeed(w)
    async with w.guard():
        with feed.transfer("layer sha256:abc", "registry.test") as t:
            for _ in range(10):  # 1.5 s in all, never 0.2 s without a byte
                await clock.advance(0.15)
                t.advance(1)
    assert not w.stalled


async def test_waiting_without_a_transfer_in_flight_is_not_a_stall() -> None:
    """Download slots, unpacking, retry backoff: none of it is the registry's doing."""
    clock = FakeClock()
    w = PullWatchdog("registry.test/app:v1", 0.2, clock)
    feed = ProgressFeed(w)
    async with w.guard():
        await clock.advance(0.5)  # nothing in flight
        with feed.transfer("layer sha256:abc", "registry.test") as t:
            await clock.advance(0.15)  # a new transfer gets the whole timeout
            t.advance(1)
            with t.paused():  # the unpack thread is behind
                await clock.advance(0.5)
            await clock.advance(0.15)
    assert not w.stalled


async def test_a_shared_transfer_feeds_every_pull_waiting_for_it() -> None:
    clock = FakeClock()
    a, b = PullWatchdog("a", 0.2, clock), PullWatchdog("b", 0.2, clock)
    feed = ProgressFeed(a)

    async def pull_b() -> None:
        async with b.guard():
            await forever()  # waits on the shared layer only

    async with a.guard():
        with feed.transfer("layer sha256:abc", "registry.test") as t:
            feed.watch(b)
            task = asyncio.create_task(pull_b())
            for _ in range(8):
                await clock.advance(0.15)
                t.advance(1)
            assert not task.done()
        # The transfer is over; b now waits on nothing in flight.
        await clock.advance(0.4)
        assert not task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not a.stalled and not b.stalled


async def test_a_long_pull_logs_its_progress_and_names_what_stalls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    w = PullWatchdog("registry.test/app:v1", 0)  # no timeout: progress lines only
    w.layers = 2
    feed = ProgressFeed(w)
    seen: dict[str, list[dict[str, object]]] = {}
    arrived = {m: asyncio.Event() for m in ("image pull in progress",
                                            "image pull receives nothing")}

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.setdefault(record.getMessage(), []).append(record.kv)  # type: ignore[attr-defined]
            if record.getMessage() in arrived:
                arrived[record.getMessage()].set()

    logger = logging.getLogger("crishim.image.progress")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        async with w.guard():
            with feed.transfer("layer sha256:abc", "registry.test", 1000) as t:
                t.advance(400)
                w.layers_done = 1
                await asyncio.wait_for(arrived["image pull in progress"].wait(), 10)
                # Then nothing arrives: the next line names the layer it waits for.
                await asyncio.wait_for(arrived["image pull receives nothing"].wait(), 10)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    moving = seen["image pull in progress"][0]
    assert moving["received_bytes"] == 400 and moving["layers_done"] == "1/2"
    assert "layer sha256:abc from registry.test (400 of 1000 bytes received)" in str(
        moving["downloading"])
    stuck = seen["image pull receives nothing"][0]
    assert "layer sha256:abc" in str(stuck["waiting_for"])
    assert stuck["bytes_per_second"] == 0


async def test_zero_disables_it() -> None:
    clock = FakeClock()
    w = PullWatchdog("registry.test/app:v1", 0, clock)
    feed = ProgressFeed(w)
    async with w.guard():
        with feed.transfer("layer sha256:abc", "registry.test"):
            await clock.advance(30)


# --- whole pulls against a registry that stalls ------------------------------------------

TIMEOUT = 30.0  # on the fake clock; the connections' read timeout (twice it) is real time
Behaviour = Callable[[asyncio.StreamWriter, bytes], Awaitable[None]]


def stall_after(n: int, reached: asyncio.Event,
                release: asyncio.Event | None = None) -> Behaviour:
    """Headers and `n` bytes of the body, then silence (the connection stays open; with
    `release`, the rest once it is set). `reached` is set once the `n` bytes are out."""
    async def send(w: asyncio.StreamWriter, body: bytes) -> None:
        w.write(body[:n])
        await w.drain()
        reached.set()
        await (release or asyncio.Event()).wait()
        w.write(body[n:])
        await w.drain()
    return send


def trickle(pieces: int, gap: float, clock: FakeClock, read: Callable[[], int],
            arrived: asyncio.Event) -> Behaviour:
    """The whole body in `pieces`; after each, once the pull has read it (`read()`: bytes
    received so far, `arrived` set whenever it grows), `gap` seconds pass on the clock."""
    async def send(w: asyncio.StreamWriter, body: bytes) -> None:
        step = -(-len(body) // pieces)
        for i in range(0, len(body), step):
            w.write(body[i:i + step])
            await w.drain()
            async with asyncio.timeout(30):
                while read() < min(i + step, len(body)):
                    arrived.clear()
                    await arrived.wait()
            await clock.advance(gap)
    return send


async def outwait(clock: FakeClock, *tasks: asyncio.Future[str]) -> None:
    """Let the timeout pass on the clock, again and again, until the pulls end: a byte
    the pull was still reading when the clock moved restarts its count, as it should."""
    deadline = time.monotonic() + 30
    while not all(t.done() for t in tasks):
        assert time.monotonic() < deadline, "the pulls did not end in 30s of real time"
        await clock.advance(TIMEOUT)
        await asyncio.wait(tasks, timeout=0.05)


class StallingRegistry:
    """Serves one image over plain HTTP/1.1; `behave[path suffix]` changes how a blob or
    manifest is sent (the first request matching), `silent` paths get no answer at all."""

    def __init__(self, image: ib.BuiltImage, repo: str = "t/app", tag: str = "v1") -> None:
        self.routes = {f"/v2/{repo}/manifests/{tag}": (image.manifest.media_type,
                                                       image.manifest.data)}
        for blob in (image.config, *image.layers):
            self.routes[f"/v2/{repo}/blobs/{blob.digest}"] = ("application/octet-stream",
                                                              blob.data)
        self.behave: dict[str, Behaviour] = {}
        self.silent: set[str] = set()
        self.reached = asyncio.Event()  # a silent path was asked for, or a stall_after's
        self.requests: list[str] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)

    async def close(self) -> None:
        for t in list(self._handlers):
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                line = await reader.readline()
                if not line.startswith((b"GET ", b"HEAD ")):
                    return  # EOF, or a TLS hello (crishim tries https first)
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                path = line.split()[1].decode().partition("?")[0]
                self.requests.append(path)
                if any(path.endswith(s) for s in self.silent):
                    self.reached.set()
                    await asyncio.Event().wait()
                if path == "/v2/":
                    await self._answer(writer, 200, "application/json", b"{}")
                    continue
                if path not in self.routes:
                    await self._answer(writer, 404, "application/json", b"{}")
                    continue
                ctype, body = self.routes[path]
                how = next((self.behave.pop(s) for s in list(self.behave) if
                            path.endswith(s)), None)
                await self._answer(writer, 200, ctype, body, how)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    @staticmethod
    async def _answer(w: asyncio.StreamWriter, status: int, ctype: str, body: bytes,
                      how: Behaviour | None = None) -> None:
        w.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode())
        if how is None:
            w.write(body)
            await w.drain()
        else:
            await how(w, body)


@pytest.fixture()
def image() -> ib.BuiltImage:
    return ib.build_image([[ib.file("a", os.urandom(4000))],
                           [ib.file("b", os.urandom(300_000))]], compression="none")


@pytest.fixture()
async def registry(image: ib.BuiltImage) -> AsyncIterator[StallingRegistry]:
    reg = StallingRegistry(image)
    await reg.start()
    yield reg
    await reg.close()


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


async def _manager(tmp_path: Path, stall_after_s: float,
                   clock: FakeClock) -> tuple[ImageManager, Database]:
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "run"))
    cfg.registry.config_path = str(tmp_path / "certs.d")
    cfg.registry.image_pull_progress_timeout = stall_after_s
    db = Database(str(tmp_path / "db"))
    await db.open()
    images = ImageManager(cfg, db, clock)
    await images.start()
    return images, db


@pytest.fixture()
async def images(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ImageManager]:
    images, db = await _manager(tmp_path, TIMEOUT, clock)
    yield images
    await images.stop()
    await db.close()


def store_state(images: ImageManager) -> tuple[list[str], list[str], list[str]]:
    p = images.paths
    return ([i.id for i in images.list()], sorted(os.listdir(p.layers)),
            sorted(os.listdir(p.tmp)))


def left_in_flight(images: ImageManager) -> list[object]:
    return [*images._pulls, *images._layer_jobs, *images._layer_feeds,
            *images._layer_waiters]


@pytest.mark.parametrize("where", ["layer", "manifest", "config", "no-headers"])
async def test_stalled_pull_fails_cleans_up_and_a_new_pull_starts_fresh(
        images: ImageManager, registry: StallingRegistry, image: ib.BuiltImage,
        clock: FakeClock, where: str) -> None:
    big = image.layers[1].digest
    stalled = {"layer": big, "manifest": "manifests/v1", "config": image.config.digest,
               "no-headers": big}[where]
    if where == "no-headers":
        registry.silent.add(big)
    else:
        registry.behave[stalled] = stall_after(100, registry.reached)
    ref = f"{registry.host}/t/app:v1"
    pull = asyncio.create_task(images.pull(ref))
    await asyncio.wait_for(registry.reached.wait(), 30)
    await outwait(clock, pull)
    with pytest.raises(PullStalled) as err:
        await pull
    msg = str(err.value)
    assert ref in msg and registry.host in msg and f"{TIMEOUT:g}s" in msg
    assert "registry.image_pull_progress_timeout" in msg
    assert stalled.removeprefix("manifests/") in msg, msg
    assert err.value.code.name == "UNAVAILABLE"
    # Nothing half-done stays: no temp dirs, no layers, no image, no in-flight entries.
    assert store_state(images) == ([], [], [])
    assert left_in_flight(images) == []
    # The registry heals: the same pull starts again from the start and works.
    registry.silent.clear()
    n = len(registry.requests)
    assert await images.pull(ref) == image.image_id
    assert any(p.endswith(stalled.removeprefix("manifests/")) for p in registry.requests[n:])
    ids, layers, tmp = store_state(images)
    assert ids == [image.image_id] and len(layers) == 2 and tmp == []


async def test_slow_pull_that_keeps_progressing_succeeds(
        images: ImageManager, registry: StallingRegistry, image: ib.BuiltImage,
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    big = image.layers[1].digest
    read: dict[str, int] = {}
    arrived = asyncio.Event()
    advance = Transfer.advance

    def counted(self: Transfer, n: int) -> None:
        advance(self, n)
        read[self.what] = self.received
        arrived.set()

    monkeypatch.setattr(Transfer, "advance", counted)
    # 12 pieces, each 0.6 of the timeout after the last was read: seven timeouts in all.
    registry.behave[big] = trickle(12, 0.6 * TIMEOUT, clock,
                                   lambda: read.get(f"layer {big}", 0), arrived)
    assert await images.pull(f"{registry.host}/t/app:v1") == image.image_id
    assert clock.now >= 7 * TIMEOUT


async def test_pulls_sharing_a_stalled_layer_both_end(
        tmp_path: Path, images: ImageManager, registry: StallingRegistry,
        image: ib.BuiltImage, clock: FakeClock) -> None:
    """Two pulls wait for one layer download: both see it stall, both fail, and the
    download stops (the last one waiting cancels it)."""
    other = StallingRegistry(image)  # same layers under another name
    await other.start()
    try:
        big = image.layers[1].digest
        reached = asyncio.Event()  # whichever registry the one download asked
        registry.behave[big] = stall_after(100, reached)
        other.behave[big] = stall_after(100, reached)
        pulls = [asyncio.create_task(images.pull(f"{reg.host}/t/app:v1"))
                 for reg in (registry, other)]
        await asyncio.wait_for(reached.wait(), 30)
        await outwait(clock, *pulls)
        results = await asyncio.gather(*pulls, return_exceptions=True)
        assert all(isinstance(r, PullStalled) for r in results), results
        assert store_state(images) == ([], [], [])
        assert left_in_flight(images) == []
    finally:
        await other.close()


async def test_a_caller_that_gives_up_leaves_the_pull_to_the_others(
        images: ImageManager, registry: StallingRegistry, image: ib.BuiltImage) -> None:
    big = image.layers[1].digest
    release = asyncio.Event()
    registry.behave[big] = stall_after(100, registry.reached, release)
    ref = f"{registry.host}/t/app:v1"
    first = asyncio.create_task(images.pull(ref))
    await asyncio.wait_for(registry.reached.wait(), 30)  # the layer is downloading
    second = asyncio.create_task(images.pull(ref))
    await asyncio.sleep(0)  # it joins the pull in flight (no await before it does)
    first.cancel()  # e.g. the kubelet's deadline for its call
    release.set()
    assert await second == image.image_id
    with pytest.raises(asyncio.CancelledError):
        await first
    assert store_state(images)[0] == [image.image_id]


async def test_without_a_timeout_a_stall_is_waited_out(
        tmp_path: Path, registry: StallingRegistry, image: ib.BuiltImage,
        clock: FakeClock) -> None:
    images, db = await _manager(tmp_path, 0, clock)
    try:
        registry.behave[image.layers[1].digest] = stall_after(100, registry.reached)
        task = asyncio.create_task(images.pull(f"{registry.host}/t/app:v1"))
        await asyncio.wait_for(registry.reached.wait(), 30)
        await clock.advance(3600)
        await asyncio.wait({task}, timeout=0.5)  # a chance to end, which it must not take
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await images.stop()
        await db.close()
    assert store_state(images)[2] == []
