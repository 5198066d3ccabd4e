"""Container/sandbox lifecycle events fanned out to GetContainerEvents subscribers.

Each subscriber has a bounded queue: a slow client loses events (logged) rather than
growing memory or blocking the runtime that publishes them. Publishing never awaits, so
events reach every subscriber in the order they were published.
"""

from __future__ import annotations

import asyncio

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.log import get_logger

log = get_logger(__name__)

QUEUE_SIZE = 1000

# Put in every queue by close(): the stream ends (compared by identity, never sent).
CLOSED = pb.ContainerEventResponse()


class EventBus:
    def __init__(self, queue_size: int = QUEUE_SIZE) -> None:
        self.queue_size = queue_size
        # queue → events dropped for that subscriber since it was last not full
        self._subscribers: dict[asyncio.Queue[pb.ContainerEventResponse], int] = {}
        self.closed = False

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def subscribe(self) -> asyncio.Queue[pb.ContainerEventResponse]:
        q: asyncio.Queue[pb.ContainerEventResponse] = asyncio.Queue(self.queue_size)
        if self.closed:
            q.put_nowait(CLOSED)
        else:
            self._subscribers[q] = 0
        return q

    def close(self) -> None:
        """End every subscription (daemon shutdown): streams finish instead of holding the
        server's drain for its whole grace period."""
        self.closed = True
        for q in list(self._subscribers):
            if q.full():
                q.get_nowait()  # make room: ending the stream matters more than one event
            q.put_nowait(CLOSED)
        self._subscribers.clear()

    def unsubscribe(self, q: asyncio.Queue[pb.ContainerEventResponse]) -> None:
        dropped = self._subscribers.pop(q, 0)
        if dropped:
            log.warning("event subscriber left after dropping events", dropped=dropped)

    def publish(self, event: pb.ContainerEventResponse) -> None:
        if not self._subscribers:
            return
        for q, dropped in self._subscribers.items():
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                # Log the first drop of a burst and then every 100th, not every event.
                if dropped % 100 == 0:
                    log.warning("event subscriber too slow; events dropped",
                                container=event.container_id,
                                type=pb.ContainerEventType.Name(event.container_event_type),
                                dropped=dropped + 1, queue=self.queue_size)
                self._subscribers[q] = dropped + 1
            else:
                if dropped:
                    log.info("event subscriber caught up", dropped=dropped)
                    self._subscribers[q] = 0
