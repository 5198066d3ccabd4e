"""SQLite (WAL) under --root: the source of truth for every object crishim owns.

All SQLite work runs on one dedicated thread (SQLite connections are thread-bound and
a commit may fsync), so the event loop never blocks on disk. Objects are stored as JSON
documents keyed by (kind, id); multi-step operations record an intent first so that
startup reconciliation can finish or roll back what a crash interrupted.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from crishim.host import priority

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL,
    id   TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE TABLE IF NOT EXISTS intents (
    id      TEXT PRIMARY KEY,
    kind    TEXT NOT NULL,
    data    TEXT NOT NULL,
    created REAL NOT NULL
);
"""


class Database:
    def __init__(self, path: str) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite",
                                        initializer=priority.follow_main_thread)
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        await self.run(self._open)

    def _open(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o711, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives a process crash (kill -9); only an OS crash
        # can lose the last transactions, which is the trade-off containerd's bolt makes too.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def close(self) -> None:
        if self._conn is not None:
            await self.run(self._conn.close)
            self._conn = None
        self._pool.shutdown(wait=True)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the database thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection; only touch it from inside `run`."""
        assert self._conn is not None, "database is not open"
        return self._conn

    # -- JSON documents -------------------------------------------------------------------
    async def put(self, kind: str, obj_id: str, data: dict[str, Any],
                  clear_intent: str = "") -> None:
        """Store a document; with `clear_intent`, drop that intent in the same transaction
        (one round trip to the database thread instead of two)."""
        text = json.dumps(data, separators=(",", ":"))
        await self.run(self._put, kind, obj_id, text, clear_intent)

    def _put(self, kind: str, obj_id: str, text: str, clear_intent: str) -> None:
        conn = self.conn
        if not clear_intent:
            conn.execute("INSERT OR REPLACE INTO objects(kind, id, data) VALUES (?,?,?)",
                         (kind, obj_id, text))
            return
        with conn:  # one transaction: both or neither
            conn.execute("BEGIN")
            conn.execute("INSERT OR REPLACE INTO objects(kind, id, data) VALUES (?,?,?)",
                         (kind, obj_id, text))
            conn.execute("DELETE FROM intents WHERE id=?", (clear_intent,))

    async def delete(self, kind: str, obj_id: str) -> None:
        await self.run(self._exec, "DELETE FROM objects WHERE kind=? AND id=?", (kind, obj_id))

    async def load_all(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = await self.run(self._query, "SELECT id, data FROM objects WHERE kind=?", (kind,))
        return {row[0]: json.loads(row[1]) for row in rows}

    # -- intents ---------------------------------------------------------------------------
    async def add_intent(self, intent_id: str, kind: str, data: dict[str, Any]) -> None:
        await self.run(self._exec, "INSERT OR REPLACE INTO intents(id, kind, data, created) "
                       "VALUES (?,?,?,?)", (intent_id, kind, json.dumps(data), time.time()))

    async def remove_intent(self, intent_id: str) -> None:
        await self.run(self._exec, "DELETE FROM intents WHERE id=?", (intent_id,))

    async def intents(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = await self.run(self._query, "SELECT id, data FROM intents WHERE kind=?", (kind,))
        return {row[0]: json.loads(row[1]) for row in rows}

    def _exec(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.conn.execute(sql, params)

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()
