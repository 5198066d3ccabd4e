"""The gRPC server on a unix socket: its methods, its connections, a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from crishim.rpc.connection import Connection, Method


class Server:
    def __init__(self, methods: Mapping[str, Method], max_message: int) -> None:
        """`methods` by path ("/package.Service/Method")."""
        self._methods = dict(methods)
        self._max_message = max_message
        self._connections: set[Connection] = set()
        self._listener: asyncio.Server | None = None

    def _connect(self) -> Connection:
        conn = Connection(self._methods, self._max_message, self._connections.discard)
        self._connections.add(conn)
        return conn

    async def start(self, path: str) -> None:
        self._listener = await asyncio.get_running_loop().create_unix_server(
            self._connect, path)

    async def stop(self, grace: float) -> None:
        """No new connections or calls; the calls under way get `grace` seconds to
        finish, then are cancelled (their clients see CANCELLED)."""
        if self._listener is not None:
            self._listener.close()
        for conn in list(self._connections):
            conn.go_away()
        tasks = [t for conn in self._connections for t in conn.tasks()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        for conn in list(self._connections):
            conn.close()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.wait_closed()
