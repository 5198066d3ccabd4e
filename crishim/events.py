"""Container/sandbox lifecycle events fanned out to GetContainerEvents subscribers.

Each subscriber has a bounded queue: a slow client loses events (logged) rather than
growing memory or blocking the runtime that publishes them.
"""

from __future__ import annotations

import asyncio

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.log import get_logger

log = get_logger(__name__)

QUEUE_SIZE = 1000


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[pb.ContainerEventResponse]] = set()

    def subscribe(self) -> asyncio.Queue[pb.ContainerEventResponse]:
        q: asyncio.Queue[pb.ContainerEventResponse] = asyncio.Queue(QUEUE_SIZE)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[pb.ContainerEventResponse]) -> None:
        self._subscribers.discard(q)

    def publish(self, event: pb.ContainerEventResponse) -> None:
        for q in self._subscribers:
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                log.warning("event subscriber too slow; event dropped",
                            container=event.container_id, type=event.container_event_type)
