"""The SQLite store: a record saved together with clearing its intent is one transaction."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import pytest

from crishim.store.db import Database


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
