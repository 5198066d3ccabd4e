"""The request header decoder: RFC 7541's own examples, and agreement with the `hpack`
package's encoder over many blocks (indexing, eviction, Huffman, size updates)."""

from __future__ import annotations

import random

import hpack
import pytest

from crishim.rpc.hpackdecoder import Decoder, HeaderBlockError

# RFC 7541 C.3 (plain strings) and C.4 (Huffman): three requests on one connection.
REQUESTS = [
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
     (b":authority", b"www.example.com")],
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
     (b":authority", b"www.example.com"), (b"cache-control", b"no-cache")],
    [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
     (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")],
]
PLAIN = ["828684410f7777772e6578616d706c652e636f6d",
         "828684be58086e6f2d6361636865",
         "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"]
HUFFMAN = ["828684418cf1e3c2e5f23a6ba0ab90f4ff",
           "828684be5886a8eb10649cbf",
           "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"]


@pytest.mark.parametrize("blocks", [PLAIN, HUFFMAN], ids=["plain", "huffman"])
def test_rfc_examples(blocks: list[str]) -> None:
    dec = Decoder(max_header_list_size=16384)
    for block, want in zip(blocks, REQUESTS, strict=True):
        assert dec.decode(bytes.fromhex(block)) == want


def test_agrees_with_an_encoder_through_eviction_and_size_updates() -> None:
    rng = random.Random(3)
    enc = hpack.Encoder()
    dec = Decoder(max_header_list_size=1 << 20)
    names = [b":path", b"grpc-timeout", b"user-agent", b"x-custom", b"content-type",
             b":authority", b"te"]
    for i in range(2000):
        if i % 250 == 100:
            enc.header_table_size = rng.choice([0, 64, 256, 4096])
        fields = [(rng.choice(names), b"v%d" % rng.randrange(60) * rng.randrange(1, 8))
                  for _ in range(rng.randrange(1, 9))]
        block = enc.encode(fields, huffman=bool(i % 2))
        assert dec.decode(block) == fields, i


def test_sensitive_fields_are_decoded_as_any_other() -> None:
    enc = hpack.Encoder()
    block = enc.encode([hpack.NeverIndexedHeaderTuple(b"authorization", b"secret")])
    assert Decoder(16384).decode(block) == [(b"authorization", b"secret")]


@pytest.mark.parametrize("block, why", [
    ("be", "no table entry 62"),
    ("80", "no table entry 0"),
    ("410f7777", "runs past the block"),
    ("41", "ends inside a field"),
    ("3fe11f", "table size of 4096 bytes, over 4095"),
    ("823fe11f", "after a field"),
    ("7fffffffffffff7f", "integer too large"),
])
def test_malformed_blocks_are_refused(block: str, why: str) -> None:
    with pytest.raises(HeaderBlockError, match=why):
        Decoder(16384, max_table_size=4095).decode(bytes.fromhex(block))


def test_a_list_over_the_limit_is_refused() -> None:
    block = hpack.Encoder().encode([(b"x-big", b"v" * 200)])
    with pytest.raises(HeaderBlockError, match="over 100 bytes"):
        Decoder(max_header_list_size=100).decode(block)


def test_an_entry_larger_than_the_table_empties_it() -> None:
    enc = hpack.Encoder()
    enc.header_table_size = 64
    dec = Decoder(16384)
    assert dec.decode(enc.encode([(b"a", b"b")])) == [(b"a", b"b")]
    big = [(b"x-big", b"v" * 100)]
    assert dec.decode(enc.encode(big)) == big
    assert dec.decode(enc.encode([(b"a", b"b")])) == [(b"a", b"b")]


def test_random_bytes_are_fields_or_a_block_error() -> None:
    # A connection only catches HeaderBlockError: nothing else may escape the decoder.
    rng = random.Random(11)
    enc = hpack.Encoder()
    valid = enc.encode([(b":path", b"/runtime.v1.RuntimeService/Version"),
                        (b"grpc-timeout", b"119999m")], huffman=True)
    for _ in range(5000):
        dec = Decoder(16384)
        if rng.random() < 0.5:
            block = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:  # a valid block with a byte or two changed
            changed = bytearray(valid)
            for _ in range(rng.randrange(1, 3)):
                changed[rng.randrange(len(changed))] = rng.randrange(256)
            block = bytes(changed)
        try:
            fields = dec.decode(block)
        except HeaderBlockError:
            continue
        assert all(isinstance(n, bytes) and isinstance(v, bytes) for n, v in fields)


def test_the_table_change_count_moves_with_the_table_only() -> None:
    enc, dec = hpack.Encoder(), Decoder(max_header_list_size=1 << 16)
    fields = [(":path", "/runtime.v1.RuntimeService/ListPodSandbox"), ("te", "trailers")]
    dec.decode(enc.encode(fields))
    after_first = dec.table_changes
    assert after_first == 2  # both added
    dec.decode(enc.encode(fields))  # table references only
    assert dec.table_changes == after_first
    enc.header_table_size = 0  # the encoder announces a size update
    dec.decode(enc.encode(fields))
    assert dec.table_changes > after_first
