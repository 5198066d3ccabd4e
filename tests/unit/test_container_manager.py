"""ContainerManager lifecycle, locking and start-up reconcile with fakes at the boundaries:
the fake OCI runtime of tests/fakes/runtime.py, a fake conmon (the parent of the container
process, a real `sleep`, writing `<exit_dir>/<id>` with its exit code when it ends), a
rootfs that is a plain dir and an image record in a temporary image store."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.manager import KIND, ContainerManager
from crishim.errors import FailedPrecondition
from crishim.image import rootfs
from crishim.nri.hooks import NRIHooks
from crishim.runtime.runc import OCIRuntime, RuntimeRegistry
from crishim.store.container import CREATED, EXITED, RUNNING, Container
from crishim.store.sandbox import Sandbox
from tests.fakes.containers import POD
from tests.fakes.containers import container_config as _config
from tests.fakes.containers import env as env  # the fixture
from tests.fakes.containers import stored_state as _stored_state
from tests.fakes.host import alive as _alive
from tests.fakes.host import exists as _exists


async def _stop_events(mgr: ContainerManager,
                       queue: asyncio.Queue[pb.ContainerEventResponse], cid: str) -> int:
    """CONTAINER_STOPPED events for `cid`: the first waited for (StopContainer returns once
    the state is EXITED; the event follows the write), then any more that the exit reports
    in flight make."""
    def stopped(ev: pb.ContainerEventResponse) -> bool:
        return ev.container_id == cid and ev.container_event_type == pb.CONTAINER_STOPPED_EVENT

    async with asyncio.timeout(30):
        while not stopped(await queue.get()):
            pass
    n = 1
    await asyncio.sleep(0.02)  # inotify delivers an exit file just written
    await asyncio.gather(*mgr.runtime.exit_files._tasks)
    while not queue.empty():
        n += stopped(queue.get_nowait())
    return n


async def test_create_start_stop_remove(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    assert rec.state == CREATED and not rec.launched
    assert _exists(os.path.join(rec.bundle, "config.json"))
    assert await _stored_state(env, rec.id) == CREATED and await env.db.intents(KIND) == {}
    assert await env.runtime.list() == []  # a created container costs no process

    await mgr.start_container(rec.id)
    assert rec.state == RUNNING and _alive(rec.pid) and rec.started_at > 0
    assert await _stored_state(env, rec.id) == RUNNING
    assert (await env.runtime.state(rec.id) or {})["status"] == "running"

    await mgr.stop_container(rec.id, 5)
    assert rec.state == EXITED and not _alive(rec.pid)
    assert (rec.exit_code, rec.reason) == (128 + signal.SIGTERM, "Error")
    assert rec.finished_at >= rec.started_at and rec.released
    assert await env.runtime.state(rec.id) is None  # released: runc delete ran
    assert await _stored_state(env, rec.id) == EXITED

    await mgr.remove_container(rec.id)
    assert mgr.find(rec.id) is None
    assert await _stored_state(env, rec.id) is None and await env.db.intents(KIND) == {}
    await mgr.parts.bundles.after_reply.settle()  # the files go in the background
    assert not _exists(rec.bundle) and not _exists(rec.persist_dir)


class _NRIRecorder(NRIHooks):
    """NRI as the manager sees it, recording each step it is told of."""

    def __init__(self) -> None:
        self.told: list[str] = []

    async def post_create_container(self, sb: Sandbox, ctr: Container) -> None:
        self.told.append("PostCreateContainer")

    async def start_container(self, sb: Sandbox, ctr: Container) -> None:
        self.told.append("StartContainer")

    async def post_start_container(self, sb: Sandbox, ctr: Container,
                                   exited: asyncio.Event) -> None:
        self.told.append("PostStartContainer")

    async def update_container(self, sb: Sandbox, ctr: Container,
                               requested: pb.LinuxContainerResources,
                               resources: dict[str, Any]
                               ) -> tuple[pb.LinuxContainerResources, dict[str, Any]]:
        self.told.append("UpdateContainer")
        return requested, resources

    async def post_update_container(self, sb: Sandbox, ctr: Container) -> None:
        self.told.append("PostUpdateContainer")

    async def stop_container(self, sb: Sandbox, ctr: Container) -> None:
        self.told.append("StopContainer")

    async def remove_container(self, sb: Sandbox, ctr: Container) -> None:
        self.told.append("RemoveContainer")


async def test_nri_is_told_of_every_container_step(env: SimpleNamespace) -> None:
    nri = _NRIRecorder()
    mgr = await env.manager(nri=nri)
    rec = await mgr.create_container(POD, _config())
    await mgr.update_resources(rec, pb.LinuxContainerResources(cpu_shares=512))
    await mgr.start_container(rec.id)
    await mgr.stop_container(rec.id, 0)
    await mgr.remove_container(rec.id)
    assert nri.told == ["PostCreateContainer", "UpdateContainer", "PostUpdateContainer",
                        "StartContainer", "PostStartContainer", "StopContainer",
                        "RemoveContainer"]


async def test_create_for_a_handler_that_cannot_run_here_is_refused(
        env: SimpleNamespace) -> None:
    # The fake runtime has no `--version`: the start-up probe finds it cannot run.
    runtimes = RuntimeRegistry(env.cfg)
    await runtimes.probe()
    mgr = await env.manager(runtimes)
    for _ in range(2):  # the name is not left reserved
        with pytest.raises(FailedPrecondition, match=r"runtime handler 'fake' cannot run "
                           r"on this host: .*cannot run"):
            await mgr.create_container(POD, _config())
    assert mgr.list_containers() == [] and await env.db.intents(KIND) == {}
    assert not _exists(mgr.containers_dir) or not os.listdir(mgr.containers_dir)
    assert await env.runtime.list() == []


async def test_an_exit_unmounts_the_rootfs_before_the_delete(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delete (the cgroup's rmdir, whose kernel clean-up follows a grace period
    later) is the release's last step."""
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    seen: list[bool] = []

    def unmount_all(*args: Any) -> None:
        seen.append(os.path.exists(os.path.join(env.runtime.root, rec.id)))

    monkeypatch.setattr(rootfs, "unmount_all", unmount_all)
    await mgr.stop_container(rec.id, 0)
    assert seen == [True] and rec.released and await env.runtime.state(rec.id) is None


async def test_stop_of_a_never_started_container(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.stop_container(rec.id, 10)
    assert rec.state == EXITED and rec.exit_code == 128 + signal.SIGKILL
    assert rec.message == "stopped before it was started" and rec.finished_at > 0
    assert await _stored_state(env, rec.id) == EXITED and await env.runtime.list() == []
    with pytest.raises(FailedPrecondition, match="not in the created state"):
        await mgr.start_container(rec.id)
    await mgr.remove_container(rec.id)
    await mgr.parts.bundles.after_reply.settle()
    assert mgr.list_containers() == [] and not _exists(rec.bundle)


async def test_stop_and_remove_are_idempotent(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    queue = env.events.subscribe()
    await mgr.stop_container(rec.id, 0)
    finished = rec.finished_at
    await mgr.stop_container(rec.id, 0)
    assert rec.state == EXITED and rec.finished_at == finished
    assert await _stop_events(mgr, queue, rec.id) == 1
    await mgr.remove_container(rec.id)
    await mgr.remove_container(rec.id)
    await mgr.stop_container(rec.id, 0)
    await mgr.stop_container("nope", 0)
    await mgr.remove_container("nope")
    assert mgr.list_containers() == [] and await env.db.load_all(KIND) == {}


@pytest.mark.parametrize("grace", [0, 2])
@pytest.mark.parametrize("delay", [0.0, 0.02])
async def test_stop_racing_the_containers_own_exit(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, grace: int,
        delay: float) -> None:
    """The exit reaches the manager from the exit-file watcher and (without grace, its conmon
    gone) from Stop's own look at the exit file, while the first report still releases
    the container: it is recorded once."""
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    finishes: list[int] = []
    finish = mgr.parts.exits.finish

    async def counted(r: Any, code: int, *args: Any) -> None:
        finishes.append(code)
        await finish(r, code, *args)

    monkeypatch.setattr(mgr.parts.exits, "finish", counted)
    delete = OCIRuntime.delete

    async def slow_delete(self: OCIRuntime, *args: Any, **kw: Any) -> None:
        await asyncio.sleep(0.3)  # the release outlasts Stop's own look at the exit file
        await delete(self, *args, **kw)

    monkeypatch.setattr(OCIRuntime, "delete", slow_delete)
    queue = env.events.subscribe()
    os.kill(rec.pid, signal.SIGKILL)
    await asyncio.sleep(delay)
    await mgr.stop_container(rec.id, grace)
    await env.fake.exited(rec.id)
    assert await _stop_events(mgr, queue, rec.id) == 1 and len(finishes) == 1
    assert rec.state == EXITED and rec.exit_code == 128 + signal.SIGKILL
    assert await _stored_state(env, rec.id) == EXITED


async def test_concurrent_stops_serialize(env: SimpleNamespace,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    busy, overlaps, kills = [0], [0], [0]
    kill = OCIRuntime.kill

    async def one_at_a_time(self: OCIRuntime, *args: Any, **kw: Any) -> None:
        busy[0] += 1
        overlaps[0] += busy[0] > 1
        kills[0] += 1
        try:
            await kill(self, *args, **kw)
        finally:
            busy[0] -= 1

    monkeypatch.setattr(OCIRuntime, "kill", one_at_a_time)
    queue = env.events.subscribe()
    await asyncio.gather(*(mgr.stop_container(rec.id, g) for g in (5, 0, 5, 0)))
    assert rec.state == EXITED and overlaps == [0] and 1 <= kills[0] <= 2
    assert await _stop_events(mgr, queue, rec.id) == 1


async def test_a_stop_during_start_waits_for_the_launch(env: SimpleNamespace) -> None:
    """Start holds the container's lock while it launches: the stop then stops a running
    container rather than recording "never started" over a live process."""
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    env.fake.gate.clear()
    start = asyncio.create_task(mgr.start_container(rec.id))
    await asyncio.wait_for(env.fake.at_gate.wait(), 30)  # launching, under the lock
    stop = asyncio.create_task(mgr.stop_container(rec.id, 5))
    await asyncio.sleep(0.05)
    assert not stop.done() and rec.state == CREATED
    env.fake.gate.set()
    await asyncio.wait_for(asyncio.gather(start, stop), 10)
    assert rec.state == EXITED and rec.exit_code == 128 + signal.SIGTERM
    assert not _alive(rec.pid) and await env.runtime.list() == []


async def test_remove_of_a_running_container_stops_it_first(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    queue = env.events.subscribe()
    await mgr.remove_container(rec.id)
    assert not _alive(rec.pid) and rec.state == EXITED
    assert await _stop_events(mgr, queue, rec.id) == 1
    assert mgr.find(rec.id) is None and await env.db.load_all(KIND) == {}
    await mgr.parts.bundles.after_reply.settle()
    assert await env.runtime.list() == [] and not _exists(rec.bundle)


async def test_start_reconciles_after_a_crash(env: SimpleNamespace) -> None:
    first = await env.manager()
    running, dying, created = [await first.create_container(POD, _config(n))
                               for n in ("running", "dying", "created")]
    for rec in (running, dying):
        await first.start_container(rec.id)
    await first.stop()  # the daemon is gone; conmon, runc state, files and records remain
    first.records.clear()
    env.managers.remove(first)
    os.kill(dying.pid, signal.SIGKILL)  # dies while nobody watches
    await env.fake.exited(dying.id)

    mgr = await env.manager()
    assert mgr.get(running.id).state == RUNNING and _alive(running.pid)
    assert mgr.get(created.id).state == CREATED
    dead = mgr.get(dying.id)
    assert dead.state == EXITED and dead.exit_code == 128 + signal.SIGKILL
    assert dead.finished_at >= dead.started_at > 0 and dead.released
    assert await _stored_state(env, dying.id) == EXITED
    # Still watched: the running container's exit is noticed by the new manager.
    start = time.monotonic()
    await mgr.stop_container(running.id, 5)
    assert mgr.get(running.id).exit_code == 128 + signal.SIGTERM
    assert time.monotonic() - start < 5  # unwatched, Stop would wait out the 5 s grace


async def test_stop_when_the_monitor_died_without_an_exit_file(env: SimpleNamespace) -> None:
    """conmon is gone and wrote nothing: Stop asks the runtime and records the SIGKILL."""
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    env.fake.monitors[rec.id].cancel()  # the monitor dies; nobody will write the file
    env.fake.alive.clear()
    await asyncio.wait_for(mgr.stop_container(rec.id, 0), 10)
    assert rec.state == EXITED and rec.exit_code == 128 + signal.SIGKILL
    assert await _stored_state(env, rec.id) == EXITED


async def test_a_remove_during_an_exit_deletes_after_the_exit_is_written(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exit's record is written after its release. A RemoveContainer in between must
    delete after that write: a write after the delete brings the container back at the
    next start, its pod perhaps gone (seen in the kill -9 storm)."""
    mgr = await env.manager()
    rec = await mgr.create_container(POD, _config())
    await mgr.start_container(rec.id)
    held, gate, save = asyncio.Event(), asyncio.Event(), mgr.parts.exits.save

    async def held_save(r: Container) -> None:
        if r.state == EXITED:
            held.set()
            await gate.wait()
        await save(r)

    monkeypatch.setattr(mgr.parts.exits, "save", held_save)
    stop = asyncio.create_task(mgr.stop_container(rec.id, 0))
    await held.wait()  # released, its write not yet made
    assert rec.released
    remove = asyncio.create_task(mgr.remove_container(rec.id))
    await asyncio.sleep(0.1)
    assert not remove.done()  # it waits for the exit's write
    gate.set()
    await asyncio.gather(stop, remove)
    assert mgr.find(rec.id) is None and await _stored_state(env, rec.id) is None
