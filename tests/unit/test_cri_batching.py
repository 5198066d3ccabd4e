"""List replies are cut into batches that fit a gRPC message."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.batching import batches


def test_batches_bound_items_and_bytes() -> None:
    items = [pb.Container(id=str(i) * 100) for i in range(10)]
    assert [len(b) for b in batches(items, max_items=4)] == [4, 4, 2]
    one = items[0].ByteSize()
    assert [len(b) for b in batches(items, max_items=100, max_bytes=3 * one)] == [3, 3, 3, 1]
    assert list(batches([])) == []
