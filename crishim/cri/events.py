"""GetContainerEvents: a server stream of lifecycle events from the daemon's EventBus.

Each call is one subscription with its own bounded queue (see crishim/events.py): a slow
client loses events instead of holding up the runtime. The subscription ends when the
client cancels or disconnects (the generator is closed), so nothing leaks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.daemon import Daemon


class EventRPCs:
    daemon: Daemon

    async def GetContainerEvents(self, request: pb.GetEventsRequest,
                                 context: Context) -> AsyncIterator[pb.ContainerEventResponse]:
        queue = self.daemon.events.subscribe()
        try:
            while True:
                yield await queue.get()
        finally:
            self.daemon.events.unsubscribe(queue)
