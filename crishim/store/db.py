"""SQLite (WAL) under --root: the source of truth for every object crishim owns.

All SQLite work runs on one dedicated thread (SQLite connections are thread-bound), so
the event loop never blocks on disk; it is woken through a pipe (crishim/proc/pipeworker.py),
which lets the kernel run it on the loop's CPU rather than wait for a busy one. Objects
are stored as JSON documents keyed by (kind, id); multi-step operations record an intent
first so that startup reconciliation can finish or roll back what a crash interrupted.

A commit appends to the WAL and does not fsync (synchronous=NORMAL). Copying the WAL
back into the database (a checkpoint) does fsync, twice: SQLite does it inside whichever
commit finds the WAL past 1000 pages, which makes one call in a hundred or so
milliseconds slower than the rest. Here it runs on a thread and connection of its own
instead, beside the commits and not in their way (a PASSIVE checkpoint waits for no
writer), after CHECKPOINT_EVERY calls, once none has come for QUIET_S. The WAL starts
over from its beginning only after a checkpoint has copied all of it, so one that
commits overtook is tried again at the next quiet moment; for writes that never pause,
SQLite's own checkpoint stays as the backstop, at a larger size.
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

from crishim.log import get_logger
from crishim.observe import tracing
from crishim.proc import priority
from crishim.proc.pipeworker import PipeWorker

T = TypeVar("T")
log = get_logger(__name__)

CHECKPOINT_EVERY = 100  # calls on the database thread, each a few pages of WAL at most
QUIET_S = 0.01  # no call for this long: the checkpoint is likely to finish before the next
BACKSTOP_PAGES = 4000  # 16 MB of WAL: a commit checkpoints only past this
WAL_KEPT_BYTES = 4 * 1024 * 1024  # a WAL that starts over is cut back to this size

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
        self._worker = PipeWorker("sqlite", initializer=priority.follow_main_thread)
        self._conn: sqlite3.Connection | None = None
        # An in-memory database (tests) has no WAL and no second connection to it.
        self._checkpoints = path != ":memory:"
        self._checkpointer = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="sqlite-checkpoint",
                                                initializer=priority.follow_main_thread)
        self._checkpoint_conn: sqlite3.Connection | None = None
        self._checkpoint: asyncio.Future[bool] | None = None
        self._in_flight = 0
        self._quiet: asyncio.TimerHandle | None = None
        self._since_checkpoint = 0  # calls

    async def open(self) -> None:
        await self.run(self._open)

    def _open(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives a process crash (kill -9); only an OS crash
        # can lose the last transactions, which is the trade-off containerd's bolt makes too.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")  # see the docstring
        conn.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def close(self) -> None:
        self._checkpoints = False
        if self._quiet is not None:
            self._quiet.cancel()
        if self._checkpoint is not None:
            await asyncio.gather(self._checkpoint, return_exceptions=True)
        if self._checkpoint_conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._checkpointer,
                                                             self._checkpoint_conn.close)
            self._checkpoint_conn = None
        self._checkpointer.shutdown(wait=True)
        if self._conn is not None:
            # The last connection to close copies the WAL back and removes it.
            await self.run(self._conn.close)
            self._conn = None
        await self._worker.close()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the database thread."""
        if self._quiet is not None:
            self._quiet.cancel()
            self._quiet = None
        self._in_flight += 1
        try:
            return await self._worker.run(fn, *args)
        finally:
            self._in_flight -= 1
            self._since_checkpoint += 1
            if self._in_flight == 0 and self._since_checkpoint >= CHECKPOINT_EVERY:
                self._checkpoint_when_quiet()

    def _checkpoint_when_quiet(self) -> None:
        if self._checkpoints and self._checkpoint is None and self._quiet is None:
            self._quiet = asyncio.get_running_loop().call_later(QUIET_S, self._start_checkpoint)

    def _start_checkpoint(self) -> None:
        self._quiet = None
        if not self._checkpoints or self._checkpoint is not None:
            return
        self._since_checkpoint = 0
        self._checkpoint = asyncio.get_running_loop().run_in_executor(
            self._checkpointer, self._run_checkpoint)
        self._checkpoint.add_done_callback(self._checkpoint_done)

    def _run_checkpoint(self) -> bool:
        """Copy the WAL back; True if all of it was (no commit came meanwhile)."""
        if self._checkpoint_conn is None:
            self._checkpoint_conn = sqlite3.connect(self.path, isolation_level=None,
                                                    check_same_thread=False)
            self._checkpoint_conn.execute("PRAGMA busy_timeout=5000")
        _, frames, copied = self._checkpoint_conn.execute(
            "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return bool(frames == copied)

    def _checkpoint_done(self, fut: asyncio.Future[bool]) -> None:
        self._checkpoint = None
        if fut.cancelled() or not self._checkpoints:
            return
        if (exc := fut.exception()) is not None:
            # Tried again after CHECKPOINT_EVERY more calls, not at once: a failure that
            # lasts must not become a loop. The WAL grows meanwhile; nothing is lost.
            log.warning("database checkpoint failed", error=str(exc))
        elif not fut.result():  # commits overtook it: again at the next quiet moment
            self._since_checkpoint = CHECKPOINT_EVERY
            if self._in_flight == 0:
                self._checkpoint_when_quiet()

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
        with tracing.span("db put", **{"db.kind": kind}):
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
        with tracing.span("db delete", **{"db.kind": kind}):
            await self.run(self._exec, "DELETE FROM objects WHERE kind=? AND id=?",
                           (kind, obj_id))

    async def load_all(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = await self.run(self._query, "SELECT id, data FROM objects WHERE kind=?", (kind,))
        return {row[0]: json.loads(row[1]) for row in rows}

    # -- intents ---------------------------------------------------------------------------
    async def add_intent(self, intent_id: str, kind: str, data: dict[str, Any]) -> None:
        with tracing.span("db add_intent", **{"db.kind": kind}):
            await self.run(self._exec, "INSERT OR REPLACE INTO intents(id, kind, data, "
                           "created) VALUES (?,?,?,?)",
                           (intent_id, kind, json.dumps(data), time.time()))

    async def remove_intent(self, intent_id: str) -> None:
        with tracing.span("db remove_intent"):
            await self.run(self._exec, "DELETE FROM intents WHERE id=?", (intent_id,))

    async def intents(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = await self.run(self._query, "SELECT id, data FROM intents WHERE kind=?", (kind,))
        return {row[0]: json.loads(row[1]) for row in rows}

    def _exec(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.conn.execute(sql, params)

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()
