"""CRI 1.36 list streaming (KEP-5825): StreamPodSandboxes and StreamContainers.

Same content as ListPodSandbox/ListContainers, sent in bounded batches so a node with
many objects never exceeds the gRPC message limit. An empty result is an empty stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TypeVar

from google.protobuf.message import Message

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.node.daemon import Daemon

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


class StreamListRPCs:
    daemon: Daemon

    async def StreamPodSandboxes(self, request: pb.StreamPodSandboxesRequest, context: Context
                                 ) -> AsyncIterator[pb.StreamPodSandboxesResponse]:
        flt = request.filter if request.HasField("filter") else None
        items = [s.list_proto() for s in self.daemon.sandboxes.list(flt)]
        for batch in batches(items):
            yield pb.StreamPodSandboxesResponse(pod_sandboxes=batch)

    async def StreamContainers(self, request: pb.StreamContainersRequest, context: Context
                               ) -> AsyncIterator[pb.StreamContainersResponse]:
        flt = request.filter if request.HasField("filter") else None
        items = [c.list_proto() for c in self.daemon.containers.list_containers(flt)]
        for batch in batches(items):
            yield pb.StreamContainersResponse(containers=batch)
