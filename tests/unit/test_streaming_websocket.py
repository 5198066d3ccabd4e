"""RFC 6455 framing (the RFC's own examples) and the single-use token store."""

from __future__ import annotations

import asyncio

from crishim.streaming import websocket as ws
from crishim.streaming.tokens import TokenStore


def test_accept_key_rfc_example() -> None:
    assert ws.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_unmasked_frame_rfc_example() -> None:
    assert ws.encode_frame(ws.OP_TEXT, b"Hello") == bytes.fromhex("810548656c6c6f")


def _server_side(data: bytes) -> tuple[ws.WebSocket, asyncio.StreamReader]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()

    class _W:
        def __init__(self) -> None:
            self.out = bytearray()

        def write(self, b: bytes) -> None:
            self.out += b

        async def drain(self) -> None:
            pass

        def is_closing(self) -> bool:
            return False

    return ws.WebSocket(reader, _W()), reader  # type: ignore[arg-type]


async def test_masked_and_fragmented_frames_rfc_examples() -> None:
    masked_hello = bytes.fromhex("818537fa213d7f9f4d5158")
    # The RFC's fragmented "Hel"+"lo", masked as a client must send it.
    frag = ws.encode_frame(ws.OP_TEXT, b"Hel", fin=False, mask=True) + \
        ws.encode_frame(ws.OP_CONT, b"lo", mask=True)
    sock, _ = _server_side(masked_hello + frag)
    assert await sock.recv() == (ws.OP_TEXT, b"Hello")
    assert await sock.recv() == (ws.OP_TEXT, b"Hello")
    assert await sock.recv() is None


async def test_lengths_16_and_64_bit_round_trip() -> None:
    for size in (125, 126, 65535, 65536, 200_000):
        payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        sock, _ = _server_side(ws.encode_frame(ws.OP_BINARY, payload, mask=True))
        assert await sock.recv() == (ws.OP_BINARY, payload)


async def test_unmasked_client_frame_and_oversized_message_are_rejected() -> None:
    sock, _ = _server_side(ws.encode_frame(ws.OP_BINARY, b"abc"))
    assert await sock.recv() is None
    sock, _ = _server_side(ws.encode_frame(ws.OP_BINARY, b"a" * 2000, mask=True))
    sock.max_message = 1000
    assert await sock.recv() is None
    assert sock.writer.out.startswith(bytes([0x88]))  # type: ignore[attr-defined]
    assert int.from_bytes(sock.writer.out[2:4], "big") == ws.CLOSE_TOO_BIG  # type: ignore[attr-defined]


async def test_ping_is_answered_with_pong() -> None:
    sock, _ = _server_side(ws.encode_frame(ws.OP_PING, b"p", mask=True) +
                           ws.encode_frame(ws.OP_BINARY, b"\x01hi", mask=True))
    assert await sock.recv() == (ws.OP_BINARY, b"\x01hi")
    assert sock.writer.out == ws.encode_frame(ws.OP_PONG, b"p")  # type: ignore[attr-defined]


def test_tokens_single_use_expire_and_are_long() -> None:
    now = [0.0]
    store: TokenStore[str] = TokenStore(ttl=60, clock=lambda: now[0])
    t1 = store.put("a")
    assert len(t1) >= 32  # 24 random bytes, url-safe base64
    assert store.take(t1) == "a"
    assert store.take(t1) is None  # replay
    t2 = store.put("b")
    now[0] = 59.9
    t3 = store.put("c")
    now[0] = 60.0
    assert store.take(t2) is None  # expired after 60 s unused
    assert store.take(t3) == "c"
    assert store.take("guess") is None
    assert len({store.put("x") for _ in range(1000)}) == 1000
