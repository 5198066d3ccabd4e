"""What one server lets its clients make it hold, and the request bytes all its
connections hold together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Request bytes a connection may always hold, whatever the others hold: the RFC's
# initial window, so that small calls go on while large ones wait for the budget.
FAIR_SHARE = 65535


@dataclass(frozen=True)
class Limits:
    """What one server lets its clients make it hold (config `grpc_*`)."""

    max_connections: int = 128
    max_concurrent_streams: int = 128
    connection_window: int = 128 * 1024
    max_buffered: int = 32 * 1024 * 1024  # request bytes held by all connections


DEFAULT_LIMITS = Limits()


class Reopens(Protocol):
    """A connection whose window waits for the budget."""

    def reopen(self) -> None: ...


class Budget:
    """Request bytes held by all of a server's connections, and the connections whose
    windows wait for some to be released."""

    __slots__ = ("held", "limit", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiting: dict[Reopens, None] = {}

    def release(self, n: int) -> None:
        self.held -= n
        if self.waiting and self.held < self.limit:
            waiting, self.waiting = self.waiting, {}
            for conn in waiting:
                conn.reopen()
