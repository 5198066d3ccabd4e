"""GetContainerEvents: a server stream of lifecycle events from the daemon's EventBus.

Each call is one subscription with its own bounded queue (see crishim/observe/events.py): a slow
client loses events instead of holding up the runtime. The subscription ends when the
client cancels or disconnects (the generator is closed), so nothing leaks, or when the
daemon shuts down (EventBus.close), so an open stream does not hold up the drain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.node.daemon import Daemon
from crishim.observe.events import CLOSED


class EventRPCs:
    daemon: Daemon

    async def GetContainerEvents(self, request: pb.GetEventsRequest,
                                 context: Context) -> AsyncIterator[pb.ContainerEventResponse]:
        queue = self.daemon.events.subscribe()
        try:
            while True:
                event = await queue.get()
                if event is CLOSED:
                    return  # the daemon is shutting down
                yield event
        finally:
            self.daemon.events.unsubscribe(queue)
