"""The gRPC server on a unix socket: its methods, its connections, a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

from crishim.log import get_logger
from crishim.rpc import frames as fr
from crishim.rpc.connection import Connection
from crishim.rpc.limits import DEFAULT_LIMITS, Budget, Limits
from crishim.rpc.method import Method

log = get_logger(__name__)

REFUSED_LOG_EVERY = 10.0  # seconds between log lines about refused connections


class _Refused(asyncio.Protocol):
    """A connection past the limit: told why (GOAWAY ENHANCE_YOUR_CALM), then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(fr.settings({}) + fr.goaway(0, fr.ENHANCE_YOUR_CALM,
                                                    b"too many connections"))
        transport.close()


class Server:
    def __init__(self, methods: Mapping[str, Method], max_message: int,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        """`methods` by path ("/package.Service/Method")."""
        self._methods = dict(methods)
        self._max_message = max_message
        self._limits = limits
        self._budget = Budget(limits.max_buffered)
        self._connections: set[Connection] = set()
        self._listener: asyncio.Server | None = None
        # Connections refused, and idle ones closed for new ones, since the last log
        # line about them.
        self._refused = self._evicted = 0
        self._refused_logged = 0.0

    def _connect(self) -> asyncio.BaseProtocol:
        if len(self._connections) >= self._limits.max_connections and not self._evict():
            self._refused += 1
            self._log_limit()
            return _Refused()
        conn = Connection(self._methods, self._max_message, self._connections.discard,
                          self._limits, self._budget)
        self._connections.add(conn)
        return conn

    def _evict(self) -> bool:
        """At the limit, a new connection takes the place of the one idle longest (no
        call running; Connection.idle): clients that leak idle connections, or hold
        requests that never end, cannot lock out the kubelet or crictl. False when
        every connection is busy."""
        now = time.monotonic()
        idle = [c for c in self._connections if c.idle(now)]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.last_read)
        self._connections.discard(victim)
        victim.evict()
        self._evicted += 1
        self._log_limit()
        return True

    def _log_limit(self) -> None:
        """One log line for a burst of connections past the limit, not one each."""
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_EVERY:
            log.warning("too many client connections (grpc_max_connections): new ones "
                        "refused, or idle ones closed for them",
                        limit=self._limits.max_connections, refused=self._refused,
                        idle_closed=self._evicted)
            self._refused = self._evicted = 0
            self._refused_logged = now

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
