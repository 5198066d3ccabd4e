"""Single-use, short-lived tokens that name a pending streaming request.

The CRI Exec/Attach/PortForward RPCs store the request here and hand the kubelet a URL
with the token; the streaming server takes it back exactly once. A token that is unknown,
already used or older than `ttl` seconds finds nothing (the server answers 404).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

TOKEN_TTL = 60.0
MAX_PENDING = 10000  # a flood of unused tokens cannot grow memory without bound


@dataclass
class _Entry(Generic[T]):
    value: T
    expires: float


class TokenStore(Generic[T]):
    def __init__(self, ttl: float = TOKEN_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._entries: dict[str, _Entry[T]] = {}

    def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, e in self._entries.items() if e.expires <= now]:
            del self._entries[token]

    def put(self, value: T) -> str:
        self._expire()
        if len(self._entries) >= MAX_PENDING:
            # Drop the oldest pending token rather than refuse new requests.
            oldest = min(self._entries, key=lambda t: self._entries[t].expires)
            del self._entries[oldest]
        token = secrets.token_urlsafe(24)  # 192 bits
        self._entries[token] = _Entry(value, self._clock() + self.ttl)
        return token

    def take(self, token: str) -> T | None:
        """The value for `token`, removing it; None if unknown, used or expired."""
        entry = self._entries.pop(token, None)
        if entry is None or entry.expires <= self._clock():
            return None
        return entry.value

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)
