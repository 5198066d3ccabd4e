"""EventBus fan-out and GetContainerEvents subscription lifetime."""

from __future__ import annotations

import asyncio
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.events import EventRPCs
from crishim.observe.events import EventBus


def ev(cid: str, t: int = pb.CONTAINER_CREATED_EVENT) -> pb.ContainerEventResponse:
    return pb.ContainerEventResponse(container_id=cid, container_event_type=t)  # type: ignore[arg-type]


async def test_every_subscriber_gets_events_in_order() -> None:
    bus = EventBus()
    a, b = bus.subscribe(), bus.subscribe()
    for i in range(5):
        bus.publish(ev(str(i)))
    assert [a.get_nowait().container_id for _ in range(5)] == list("01234")
    assert [b.get_nowait().container_id for _ in range(5)] == list("01234")


async def test_slow_subscriber_drops_without_blocking_others() -> None:
    bus = EventBus(queue_size=3)
    slow, fast = bus.subscribe(), bus.subscribe()
    for i in range(10):
        bus.publish(ev(str(i)))
        fast.get_nowait()
    assert slow.qsize() == 3  # oldest kept, the rest dropped
    assert [slow.get_nowait().container_id for _ in range(3)] == ["0", "1", "2"]
    bus.publish(ev("late"))
    assert slow.get_nowait().container_id == "late"


class _Daemon:
    def __init__(self) -> None:
        self.events = EventBus()


async def test_get_container_events_streams_and_unsubscribes_on_cancel() -> None:
    svc = EventRPCs()
    daemon: Any = _Daemon()
    svc.daemon = daemon
    got: list[str] = []

    async def consume() -> None:
        async for e in svc.GetContainerEvents(pb.GetEventsRequest(), None):  # type: ignore[arg-type]
            got.append(e.container_id)

    task = asyncio.create_task(consume())
    for _ in range(100):
        if daemon.events.subscriber_count:
            break
        await asyncio.sleep(0.001)
    assert daemon.events.subscriber_count == 1
    daemon.events.publish(ev("c1"))
    daemon.events.publish(ev("c1", pb.CONTAINER_STARTED_EVENT))
    for _ in range(100):
        if len(got) == 2:
            break
        await asyncio.sleep(0.001)
    assert got == ["c1", "c1"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert daemon.events.subscriber_count == 0


async def test_close_ends_streams_even_with_a_full_queue() -> None:
    bus = EventBus(queue_size=2)
    svc = EventRPCs()
    daemon: Any = _Daemon()
    daemon.events = bus
    svc.daemon = daemon
    got: list[str] = []

    async def consume() -> None:
        async for e in svc.GetContainerEvents(pb.GetEventsRequest(), None):  # type: ignore[arg-type]
            got.append(e.container_id)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    full = bus.subscribe()  # a subscriber that never reads
    for i in range(5):
        bus.publish(ev(str(i)))
    bus.close()
    await asyncio.wait_for(task, 5)  # the stream returned on its own
    # Its queue held 0 and 1 (the rest dropped); close made room by dropping the oldest.
    assert got == ["1"]
    assert full.qsize() == 2 and bus.subscriber_count == 0
    late = bus.subscribe()  # subscribing after close ends at once
    from crishim.observe.events import CLOSED
    assert late.get_nowait() is CLOSED
