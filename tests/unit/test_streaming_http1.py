"""The streaming server's HTTP/1.1 head parser and responses (crishim/streaming/http1.py):
what a client sends is untrusted, so a malformed, truncated or oversized head is a
BadRequest, never an exception of another kind or a hang."""

from __future__ import annotations

import asyncio

import pytest

from crishim.streaming.http1 import MAX_HEAD, BadRequest, read_request, response


async def parse(data: bytes, eof: bool = True) -> object:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return await read_request(reader)


async def test_a_request_head_is_parsed() -> None:
    req = await parse(b"GET /exec/tok?command=ls&command=-l&tty=1 HTTP/1.1\r\n"
                      b"Host: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                      b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
                      b"X-Stream-Protocol-Version: v3.channel.k8s.io\r\n\r\n")
    assert req.method == "GET" and req.path == "/exec/tok"  # type: ignore[attr-defined]
    assert req.query == {"command": ["ls", "-l"], "tty": ["1"]}  # type: ignore[attr-defined]
    assert req.has_token("connection", "upgrade")  # type: ignore[attr-defined]
    assert req.header("UPGRADE") == "SPDY/3.1"  # type: ignore[attr-defined]
    assert req.header_list("x-stream-protocol-version") == [  # type: ignore[attr-defined]
        "v4.channel.k8s.io", "v3.channel.k8s.io"]


@pytest.mark.parametrize(("data", "why"), [
    (b"GET /exec/tok\r\n\r\n", "bad request line"),
    (b"GET /exec/tok SPDY/3\r\n\r\n", "bad request line"),
    (b"GET /exec/tok HTTP/1.1\r\nno colon here\r\n\r\n", "bad header line"),
    (b"GET /exec/tok HTTP/1.1\r\nHost: x\r\n", "closed before"),
    (b"GET /" + b"a" * (MAX_HEAD + 10) + b" HTTP/1.1\r\n\r\n", "too large"),
])
async def test_a_bad_head_is_a_bad_request(data: bytes, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        await parse(data)


async def test_a_head_larger_than_the_reader_allows_is_a_bad_request() -> None:
    reader = asyncio.StreamReader(limit=1024)
    reader.feed_data(b"GET /" + b"a" * 4096)
    with pytest.raises(BadRequest, match="too large"):
        await read_request(reader)


def test_responses() -> None:
    up = response(101, [("Upgrade", "SPDY/3.1")])
    assert up == b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\n\r\n"
    nf = response(404, body="unknown token")
    head, body = nf.split(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n") and body == b"unknown token"
    assert b"Content-Length: 13" in head and b"Connection: close" in head
