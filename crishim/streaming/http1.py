"""Just enough HTTP/1.1 for the streaming endpoints: read one request head, answer it.

Every streaming request is a GET that either upgrades (SPDY/3.1 or websocket) or gets an
error; there are no bodies to read, so no keep-alive or chunking either.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

MAX_HEAD = 16 * 1024
HEAD_TIMEOUT = 30.0

REASONS = {101: "Switching Protocols", 400: "Bad Request", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
           503: "Service Unavailable"}


class BadRequest(Exception):
    pass


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, list[str]] = field(default_factory=dict)  # lowercase names

    def header(self, name: str, default: str = "") -> str:
        values = self.headers.get(name.lower())
        return values[0] if values else default

    def header_list(self, name: str) -> list[str]:
        """All values of a header, also splitting comma-separated ones."""
        out: list[str] = []
        for value in self.headers.get(name.lower(), []):
            out.extend(v.strip() for v in value.split(",") if v.strip())
        return out

    def has_token(self, name: str, token: str) -> bool:
        return token.lower() in (v.lower() for v in self.header_list(name))


async def read_request(reader: asyncio.StreamReader) -> Request:
    try:
        async with asyncio.timeout(HEAD_TIMEOUT):
            head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest("request head too large") from None
    except asyncio.IncompleteReadError:
        raise BadRequest("connection closed before the request head ended") from None
    except TimeoutError:
        raise BadRequest("timed out reading the request head") from None
    if len(head) > MAX_HEAD:
        raise BadRequest("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:100]!r}")
    method, target, _ = parts
    url = urlsplit(target)
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"bad header line {line[:100]!r}")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return Request(method, url.path, parse_qs(url.query), headers)


def response(status: int, headers: list[tuple[str, str]] | None = None, body: str = "") -> bytes:
    data = body.encode()
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}"]
    for name, value in headers or []:
        lines.append(f"{name}: {value}")
    if status != 101:
        lines += ["Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(data)}",
                  "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data
