"""HPACK (RFC 7541) decoding of request header blocks.

Every call's headers pass through here, so it does the least per field: an indexed field
is a table lookup, a literal a slice; only Huffman-coded strings (the `hpack` package's
table-driven decoder) cost more, and the few that recur (a client's path, authority,
user agent) are decoded once.
"""

from __future__ import annotations

from collections import deque

from hpack.huffman_table import decode_huffman

Field = tuple[bytes, bytes]

# RFC 7541 Appendix A; entry 1 is STATIC[0].
STATIC: tuple[Field, ...] = tuple((n.encode(), v.encode()) for n, v in (
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
    (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
    (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
    (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
    ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
    ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
    ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
    ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
    ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
    ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
    ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", "")))
ENTRY_OVERHEAD = 32  # RFC 7541 4.1
DEFAULT_TABLE_SIZE = 4096  # what the server's SETTINGS_HEADER_TABLE_SIZE leaves as is
HUFFMAN_CACHE = 256  # distinct coded strings kept decoded (a client repeats a few)


class HeaderBlockError(Exception):
    """The block is malformed or too large: the connection's decoding state is lost."""


class Decoder:
    def __init__(self, max_header_list_size: int,
                 max_table_size: int = DEFAULT_TABLE_SIZE) -> None:
        self._max_list = max_header_list_size
        self._max_table = max_table_size  # the limit we allow (our SETTINGS)
        self._table_limit = max_table_size  # the limit the encoder chose, at most ours
        self._dynamic: deque[Field] = deque()  # newest first: index 62 is [0]
        self._size = 0
        self._huffman: dict[bytes, bytes] = {}
        # Counts changes to the dynamic table: a block that only refers to the table
        # decodes to the same fields while this count holds.
        self.table_changes = 0

    def decode(self, block: bytes) -> list[Field]:
        fields: list[Field] = []
        listed = 0
        pos, end = 0, len(block)
        try:
            while pos < end:
                b = block[pos]
                if b & 0x80:  # indexed field
                    index, pos = self._int(block, pos, 7)
                    field = self._entry(index)
                elif b & 0x40:  # literal, added to the table
                    index, pos = self._int(block, pos, 6)
                    field, pos = self._literal(block, pos, index)
                    self._add(field)
                elif b & 0x20:  # dynamic table size update
                    if fields:
                        raise HeaderBlockError("a table size update after a field")
                    size, pos = self._int(block, pos, 5)
                    if size > self._max_table:
                        raise HeaderBlockError(f"a table size of {size} bytes, over "
                                               f"{self._max_table}")
                    self._table_limit = size
                    self._evict(size)
                    self.table_changes += 1
                    continue
                else:  # literal without indexing (0x00) or never indexed (0x10)
                    index, pos = self._int(block, pos, 4)
                    field, pos = self._literal(block, pos, index)
                fields.append(field)
                listed += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
                if listed > self._max_list:
                    raise HeaderBlockError(f"a header list over {self._max_list} bytes")
        except IndexError:
            raise HeaderBlockError("the block ends inside a field") from None
        return fields

    @staticmethod
    def _int(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
        limit = (1 << prefix) - 1
        value = block[pos] & limit
        pos += 1
        if value < limit:
            return value, pos
        shift = 0
        while True:
            b = block[pos]
            pos += 1
            value += (b & 0x7F) << shift
            if not b & 0x80:
                return value, pos
            shift += 7
            if shift > 28:
                raise HeaderBlockError("an integer too large")

    def _entry(self, index: int) -> Field:
        if 0 < index <= len(STATIC):
            return STATIC[index - 1]
        dyn = index - len(STATIC) - 1
        if index == 0 or dyn >= len(self._dynamic):
            raise HeaderBlockError(f"no table entry {index}")
        return self._dynamic[dyn]

    def _literal(self, block: bytes, pos: int, index: int) -> tuple[Field, int]:
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return (name, value), pos

    def _string(self, block: bytes, pos: int) -> tuple[bytes, int]:
        coded = block[pos] & 0x80
        length, pos = self._int(block, pos, 7)
        stop = pos + length
        if stop > len(block):
            raise HeaderBlockError("a string runs past the block")
        raw = block[pos:stop]
        if not coded:
            return raw, stop
        text = self._huffman.get(raw)
        if text is None:
            try:
                text = decode_huffman(raw)
            except Exception as exc:  # the package's own error types vary by version
                raise HeaderBlockError(f"a Huffman string: {exc}") from None
            if len(self._huffman) >= HUFFMAN_CACHE:
                self._huffman.clear()
            self._huffman[raw] = text
        return text, stop

    def _add(self, field: Field) -> None:
        self.table_changes += 1
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        if size > self._table_limit:  # RFC 7541 4.4: the table empties, nothing is added
            self._evict(0)
            return
        self._evict(self._table_limit - size)
        self._dynamic.appendleft(field)
        self._size += size

    def _evict(self, room: int) -> None:
        while self._size > room:
            name, value = self._dynamic.pop()
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD
