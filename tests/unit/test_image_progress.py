"""image_pull_progress_timeout: a pull whose registry stops sending bytes is cancelled with
a clear error and leaves nothing behind; a slow pull that keeps making progress is not.

The watchdog alone first, then whole pulls through ImageManager against a small HTTP
registry on a local socket that can stall or trickle chosen blobs.
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
from crishim.image.progress import ProgressFeed, PullStalled, PullWatchdog
from crishim.store.db import Database
from tests.e2e import imagebuild as ib

# --- the watchdog ----------------------------------------------------------------------------


async def test_no_bytes_for_the_timeout_cancels_with_a_clear_error() -> None:
    w = PullWatchdog("registry.test/app:v1", 0.2)
    feed = ProgressFeed(w)
    started = time.monotonic()
    with pytest.raises(PullStalled) as err:
        async with w.guard():
            with feed.transfer("layer sha256:abc", "registry.test", 1000) as t:
                t.advance(10)
                await asyncio.sleep(30)
    assert 0.2 <= time.monotonic() - started < 1.5
    msg = str(err.value)
    for part in ("registry.test/app:v1", "layer sha256:abc", "registry.test",
                 "10 of 1000 bytes", "0.2s", "registry.image_pull_progress_timeout"):
        assert part in msg, msg


async def test_bytes_keep_a_long_pull_alive() -> None:
    w = PullWatchdog("registry.test/app:v1", 0.2)
    feed = ProgressFeed(w)
    async with w.guard():
        with feed.transfer("layer sha256:abc", "registry.test") as t:
            for _ in range(10):  # 0.8 s in all, never 0.2 s without a byte
                await asyncio.sleep(0.08)
                t.advance(1)


async def test_waiting_without_a_transfer_in_flight_is_not_a_stall() -> None:
    """Download slots, unpacking, retry backoff: none of it is the registry's doing."""
    w = PullWatchdog("registry.test/app:v1", 0.2)
    feed = ProgressFeed(w)
    async with w.guard():
        await asyncio.sleep(0.5)  # nothing in flight
        with feed.transfer("layer sha256:abc", "registry.test") as t:
            await asyncio.sleep(0.1)  # a new transfer gets the whole timeout
            t.advance(1)
            with t.paused():  # the unpack thread is behind
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.1)


async def test_a_shared_transfer_feeds_every_pull_waiting_for_it() -> None:
    a, b = PullWatchdog("a", 0.2), PullWatchdog("b", 0.2)
    feed = ProgressFeed(a)

    async def pull_b() -> None:
        async with b.guard():
            await asyncio.sleep(30)  # waits on the shared layer only

    async with a.guard():
        with feed.transfer("layer sha256:abc", "registry.test") as t:
            feed.watch(b)
            task = asyncio.create_task(pull_b())
            for _ in range(8):
                await asyncio.sleep(0.08)
                t.advance(1)
            assert not task.done()
        # The transfer is over; b now waits on nothing in flight.
        await asyncio.sleep(0.4)
        assert not task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


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
    w = PullWatchdog("registry.test/app:v1", 0)
    feed = ProgressFeed(w)
    async with w.guard():
        with feed.transfer("layer sha256:abc", "registry.test"):
            await asyncio.sleep(0.3)


# --- whole pulls against a registry that stalls ------------------------------------------

Behaviour = Callable[[asyncio.StreamWriter, bytes], Awaitable[None]]


def stall_after(n: int) -> Behaviour:
    """Headers and `n` bytes of the body, then silence (the connection stays open)."""
    async def send(w: asyncio.StreamWriter, body: bytes) -> None:
        w.write(body[:n])
        await w.drain()
        await asyncio.sleep(3600)
    return send


def trickle(pieces: int, gap: float) -> Behaviour:
    """The whole body, in `pieces` with `gap` seconds between them."""
    async def send(w: asyncio.StreamWriter, body: bytes) -> None:
        step = -(-len(body) // pieces)
        for i in range(0, len(body), step):
            w.write(body[i:i + step])
            await w.drain()
            await asyncio.sleep(gap)
    return send


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
                    await asyncio.sleep(3600)
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


async def _manager(tmp_path: Path, stall_after_s: float) -> tuple[ImageManager, Database]:
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "run"))
    cfg.registry.config_path = str(tmp_path / "certs.d")
    cfg.registry.image_pull_progress_timeout = stall_after_s
    db = Database(str(tmp_path / "db"))
    await db.open()
    images = ImageManager(cfg, db)
    await images.start()
    return images, db


@pytest.fixture()
async def images(tmp_path: Path) -> AsyncIterator[ImageManager]:
    images, db = await _manager(tmp_path, 0.4)
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
        where: str) -> None:
    big = image.layers[1].digest
    stalled = {"layer": big, "manifest": "manifests/v1", "config": image.config.digest,
               "no-headers": big}[where]
    if where == "no-headers":
        registry.silent.add(big)
    else:
        registry.behave[stalled] = stall_after(100)
    ref = f"{registry.host}/t/app:v1"
    started = time.monotonic()
    with pytest.raises(PullStalled) as err:
        await images.pull(ref)
    assert time.monotonic() - started < 5
    msg = str(err.value)
    assert ref in msg and registry.host in msg and "0.4s" in msg
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
        images: ImageManager, registry: StallingRegistry, image: ib.BuiltImage) -> None:
    # 12 pieces 0.15 s apart: ~1.8 s for the layer, four times the 0.4 s timeout.
    registry.behave[image.layers[1].digest] = trickle(12, 0.15)
    started = time.monotonic()
    assert await images.pull(f"{registry.host}/t/app:v1") == image.image_id
    assert time.monotonic() - started > 1.2


async def test_pulls_sharing_a_stalled_layer_both_end(
        tmp_path: Path, images: ImageManager, registry: StallingRegistry,
        image: ib.BuiltImage) -> None:
    """Two pulls wait for one layer download: both see it stall, both fail, and the
    download stops (the last one waiting cancels it)."""
    other = StallingRegistry(image)  # same layers under another name
    await other.start()
    try:
        big = image.layers[1].digest
        registry.behave[big] = stall_after(100)
        other.behave[big] = stall_after(100)
        results = await asyncio.gather(images.pull(f"{registry.host}/t/app:v1"),
                                       images.pull(f"{other.host}/t/app:v1"),
                                       return_exceptions=True)
        assert all(isinstance(r, PullStalled) for r in results), results
        assert store_state(images) == ([], [], [])
        assert left_in_flight(images) == []
    finally:
        await other.close()


async def test_a_caller_that_gives_up_leaves_the_pull_to_the_others(
        images: ImageManager, registry: StallingRegistry, image: ib.BuiltImage) -> None:
    registry.behave[image.layers[1].digest] = trickle(6, 0.1)
    ref = f"{registry.host}/t/app:v1"
    first = asyncio.create_task(images.pull(ref))
    await asyncio.sleep(0.2)
    second = asyncio.create_task(images.pull(ref))
    first.cancel()  # e.g. the kubelet's deadline for its call
    assert await second == image.image_id
    with pytest.raises(asyncio.CancelledError):
        await first
    assert store_state(images)[0] == [image.image_id]


async def test_without_a_timeout_a_stall_is_waited_out(
        tmp_path: Path, registry: StallingRegistry, image: ib.BuiltImage) -> None:
    images, db = await _manager(tmp_path, 0)
    try:
        registry.behave[image.layers[1].digest] = stall_after(100)
        task = asyncio.create_task(images.pull(f"{registry.host}/t/app:v1"))
        await asyncio.sleep(1.0)
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await images.stop()
        await db.close()
    assert store_state(images)[2] == []
