"""CRI 1.36 list streaming (KEP-5825): StreamPodSandboxes and StreamContainers.

Same content as ListPodSandbox/ListContainers, sent in bounded batches (cri/batching.py).
An empty result is an empty stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.cri.batching import batches
from crishim.node.daemon import Daemon


class StreamListRPCs:
    daemon: Daemon

    async def StreamPodSandboxes(self, request: pb.StreamPodSandboxesRequest, context: Context
                                 ) -> AsyncIterator[pb.StreamPodSandboxesResponse]:
        flt = request.filter if request.HasField("filter") else None
        items = [s.list_proto() for s in self.daemon.sandboxes.list_sandboxes(flt)]
        for batch in batches(items):
            yield pb.StreamPodSandboxesResponse(pod_sandboxes=batch)

    async def StreamContainers(self, request: pb.StreamContainersRequest, context: Context
                               ) -> AsyncIterator[pb.StreamContainersResponse]:
        flt = request.filter if request.HasField("filter") else None
        items = [c.list_proto() for c in self.daemon.containers.list_containers(flt)]
        for batch in batches(items):
            yield pb.StreamContainersResponse(containers=batch)
