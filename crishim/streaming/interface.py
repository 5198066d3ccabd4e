"""What the protocol layer needs from the rest of crishim: the requests and the backend.

The protocol code (SPDY, WebSocket) turns client streams into `ByteSource`/`ByteSink`
objects and calls an `ExecBackend`; the backend does the container work (runc exec,
conmon attach, dialing into the pod's netns).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class TerminalSize(NamedTuple):
    width: int
    height: int


class ByteSource(Protocol):
    async def read(self, n: int = 65536) -> bytes:
        """Up to n bytes; b"" at end of stream."""
        ...


class ByteSink(Protocol):
    async def write(self, data: bytes) -> None:
        """Send data, waiting while the client is slow (backpressure)."""
        ...

    async def close(self) -> None:
        """No more data (the client sees end of stream). Idempotent."""
        ...


class ExitError(Exception):
    """The command ran and exited non-zero."""

    def __init__(self, code: int) -> None:
        super().__init__(f"command terminated with exit code {code}")
        self.code = code


@dataclass
class ExecRequest:
    container_id: str
    cmd: list[str]
    tty: bool = False
    stdin: bool = False
    stdout: bool = True
    stderr: bool = True


@dataclass
class AttachRequest:
    container_id: str
    tty: bool = False
    stdin: bool = False
    stdout: bool = True
    stderr: bool = True


@dataclass
class PortForwardRequest:
    pod_id: str
    ports: list[int] = field(default_factory=list)


StreamRequest = ExecRequest | AttachRequest | PortForwardRequest


class ExecBackend(Protocol):
    async def exec(self, container_id: str, cmd: list[str], tty: bool,
                   stdin: ByteSource | None, stdout: ByteSink | None,
                   stderr: ByteSink | None,
                   resize: AsyncIterator[TerminalSize] | None) -> int:
        """Run cmd in the container; return its exit code. Cancelled = kill it."""
        ...

    async def attach(self, container_id: str, tty: bool, stdin: ByteSource | None,
                     stdout: ByteSink | None, stderr: ByteSink | None,
                     resize: AsyncIterator[TerminalSize] | None) -> None:
        """Connect to the container's main process until it exits or the client leaves."""
        ...

    async def port_forward(self, pod_id: str,
                           port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to 127.0.0.1:port inside the pod's network namespace."""
        ...
