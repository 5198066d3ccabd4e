"""The batches of a CRI 1.36 streaming RPC (KEP-5825): lists of pods, containers, images
and stats sent in bounded messages, so a node with many objects never exceeds the gRPC
message limit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)

# Far below the kubelet's 16 MiB limit, and small enough that the first batch arrives
# quickly; item counts bound the per-message work on the client too.
MAX_BATCH_ITEMS = 500
MAX_BATCH_BYTES = 4 * 1024 * 1024


def batches(items: Iterable[M], max_items: int = MAX_BATCH_ITEMS,
            max_bytes: int = MAX_BATCH_BYTES) -> Iterator[list[M]]:
    """Split `items` into lists of at most `max_items` and about `max_bytes` each."""
    batch: list[M] = []
    size = 0
    for item in items:
        n = item.ByteSize()
        if batch and (len(batch) >= max_items or size + n > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch
