"""The SQLite store: a record saved together with clearing its intent is one transaction."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from typing import Any

import pytest

from crishim.store.db import BACKSTOP_PAGES, CHECKPOINT_EVERY, Database


def test_put_clearing_intent_is_atomic(tmp_path: os.PathLike[str]) -> None:
    async def main() -> None:
        db = Database(os.path.join(tmp_path, "x.db"))
        await db.open()
        try:
            await db.add_intent("c1", "container", {"op": "create"})
            await db.put("container", "c1", {"state": 1}, clear_intent="c1")
            assert await db.intents("container") == {}
            assert await db.load_all("container") == {"c1": {"state": 1}}

            # If clearing the intent fails, the record is not stored either.
            await db.run(db.conn.execute, "DROP TABLE intents")
            with pytest.raises(sqlite3.OperationalError):
                await db.put("container", "c2", {"state": 1}, clear_intent="c2")
            assert "c2" not in await db.load_all("container")
        finally:
            await db.close()

    asyncio.run(main())


def test_the_wal_is_copied_back_beside_the_commits_not_inside_them(
        tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit does not pay for a checkpoint (two fsyncs): the checkpointer thread
    does, often enough that the WAL does not grow with the number of writes (nor reach
    the size at which a commit would checkpoint)."""
    path = os.path.join(tmp_path, "x.db")
    threads: list[str] = []
    whole: list[bool] = []  # one entry per checkpoint: did it copy all of the WAL
    run_checkpoint = Database._run_checkpoint

    def recorded(self: Database) -> bool:
        threads.append(threading.current_thread().name)
        done = run_checkpoint(self)
        whole.append(done)
        return done

    monkeypatch.setattr(Database, "_run_checkpoint", recorded)

    doc = {"blob": "x" * 3000}  # a page of its own and more

    async def quiet_until_checkpointed(seen: int) -> None:
        """A pause after a burst lasts until a checkpoint since entry `seen` has copied the
        whole WAL (a daemon's pauses are longer than that): waiting for it, not for a fixed
        time, keeps the test true on a loaded machine where the thread may start late."""
        deadline = time.monotonic() + 30
        while not any(whole[seen:]):
            assert time.monotonic() < deadline, \
                f"no whole checkpoint in a quiet moment of 30s: {whole[seen:]}"
            await asyncio.sleep(0.005)

    async def write() -> None:
        db = Database(path)
        await db.open()
        try:
            assert await db.run(lambda: db.conn.execute(
                "PRAGMA wal_autocheckpoint").fetchone()[0]) == BACKSTOP_PAGES
            seen = 0
            for i in range(2000):
                await db.put("container", f"c{i}", doc)
                await db.delete("container", f"c{i}")
                if i % 50 == 49:  # a daemon's writes come in bursts of CHECKPOINT_EVERY
                    await quiet_until_checkpointed(seen)
                    seen = len(whole)
            await db.put("container", "kept", doc)
            wal_sizes.append(await asyncio.to_thread(os.path.getsize, path + "-wal"))
        finally:
            await db.close()

    async def read() -> dict[str, Any]:
        db = Database(path)
        await db.open()
        try:
            return await db.load_all("container")
        finally:
            await db.close()

    wal_sizes: list[int] = []
    asyncio.run(write())
    assert wal_sizes[0] < 4 * 1024 * 1024  # 8000 writes of a page or more: 32 MB if kept
    assert not os.path.exists(path + "-wal")  # the last close copied it back
    assert asyncio.run(read()) == {"kept": doc}
    assert threads and all(t.startswith("sqlite-checkpoint") for t in threads)


def test_a_failing_checkpoint_is_not_retried_in_a_loop(
        tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that fails is tried again after another CHECKPOINT_EVERY calls, not
    every quiet moment; the writes themselves go on."""
    attempts: list[float] = []

    def failing(self: Database) -> bool:
        attempts.append(time.monotonic())
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Database, "_run_checkpoint", failing)

    async def main() -> None:
        db = Database(os.path.join(tmp_path, "x.db"))
        await db.open()
        try:
            for i in range(CHECKPOINT_EVERY + 1):
                await db.put("container", f"c{i}", {"i": i})
            deadline = time.monotonic() + 30
            while not attempts:  # the first attempt comes in the quiet moment
                assert time.monotonic() < deadline, "no checkpoint attempt in 30s"
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.5)  # quiet: fifty chances to loop
            assert len(attempts) == 1
            assert len(await db.load_all("container")) == CHECKPOINT_EVERY + 1
        finally:
            await db.close()

    asyncio.run(main())
