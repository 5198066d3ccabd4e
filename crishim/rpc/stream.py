"""One HTTP/2 stream's record, and the error that ends a stream or a connection."""

from __future__ import annotations

import asyncio


class ProtocolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    __slots__ = ("body", "closed", "headers_sent", "held", "id", "metadata", "path",
                 "remote_ended", "send_window", "task", "timeout")

    def __init__(self, sid: int, send_window: int) -> None:
        self.id = sid
        self.send_window = send_window
        self.path = ""
        self.timeout: float | None = None
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.closed = False  # our END_STREAM or RST_STREAM went out, or the peer's RST came
        self.remote_ended = False
        self.held = 0  # request bytes counted in the connection's and the budget's
