"""How a container's end is recorded (container/exit.py): the termination message and the
OOM evidence are files, read off the event loop; an exit reported twice (conmon's exit
file, and a stop's own look) is handled once, and each report returns with the container
EXITED."""

from __future__ import annotations

import asyncio
import builtins
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.container.events import ContainerEvents
from crishim.container.exit import ContainerExits
from crishim.container.registry import ContainerRegistry
from crishim.host.facts import HostFacts
from crishim.observe.events import EventBus
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.container import EXITED, RUNNING, Container
from crishim.store.db import Database


class Node:
    def __init__(self, tmp: Path, db: Database) -> None:
        self.tmp = tmp
        self.records = ContainerRegistry()
        self.bus = EventBus()
        self.exits = ContainerExits(db, self.records,
                                    ContainerEvents(self.bus, SandboxRegistry(), self.records),
                                    RuntimeRegistry(Config()),
                                    ExitFileWatcher(str(tmp / "exits")), HostFacts())

    def running(self, cid: str, message: str = "", oom: bool = False) -> Container:
        base = self.tmp / cid
        (base / "persist").mkdir(parents=True)
        if oom:  # what conmon leaves when the cgroup saw an OOM kill
            (base / "persist" / "oom").write_text("")
        log = ""
        if message:
            log = str(base / "termination-log")
            Path(log).write_text(message)
        rec = Container(id=cid, pod_id="p", name=cid,
                        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name=cid)),
                        runtime_handler="", created_at=1, image_name="img",
                        image_id="sha256:x", image_ref="sha256:x", bundle=str(base),
                        rootfs=str(base / "rootfs"), persist_dir=str(base / "persist"),
                        termination_log=log)
        rec.state, rec.started_at = RUNNING, 2
        self.records.add(rec)
        return rec


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    db = Database(str(tmp_path / "db" / "crishim.db"))
    await db.open()
    yield Node(tmp_path, db)
    await db.close()


async def test_termination_message_is_read_off_the_event_loop(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = node.running("c1", message="disk full\n")
    loop_thread = threading.get_ident()
    read_on_loop: list[str] = []
    real_open = builtins.open

    def watched_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == loop_thread and os.fspath(file) == rec.termination_log:
            read_on_loop.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watched_open)
    await node.exits.on_exit(rec.id, 1, 5)
    assert (rec.state, rec.exit_code, rec.reason, rec.message) == \
        (EXITED, 1, "Error", "disk full\n")
    assert read_on_loop == []


async def test_an_oom_file_makes_the_reason_oomkilled(node: Node) -> None:
    rec = node.running("c2", oom=True)
    await node.exits.on_exit(rec.id, 137, 5)
    assert (rec.state, rec.reason) == (EXITED, "OOMKilled")


async def test_an_exit_reported_twice_is_handled_once(node: Node) -> None:
    rec = node.running("c3")
    events = node.bus.subscribe()
    first = asyncio.create_task(node.exits.on_exit(rec.id, 0, 5))
    await asyncio.sleep(0)  # the first is reading how it ended, on a worker thread
    assert rec.state == RUNNING
    await node.exits.on_exit(rec.id, 0, 6)  # the second returns once it is EXITED
    assert (rec.state, rec.reason, rec.finished_at) == (EXITED, "Completed", 5)
    await first
    stopped = [events.get_nowait() for _ in range(events.qsize())]
    assert [e.container_event_type for e in stopped] == [pb.CONTAINER_STOPPED_EVENT]
