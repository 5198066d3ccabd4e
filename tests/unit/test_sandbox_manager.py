"""SandboxManager lifecycle, locking and start-up reconcile with fakes at the boundaries:
a fake OCI runtime (a script keeping runc-like state, its pause a real `sleep`), a fake
network manager and netns pins that are plain files. Id-prefix lookups of pods and
containers follow one rule."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.container.manager import ContainerManager
from crishim.errors import NotFound
from crishim.store.sandbox import NOTREADY, READY
from tests.fakes.host import alive as _alive
from tests.fakes.host import exists as _exists
from tests.fakes.sandbox import env as env  # the fixture
from tests.fakes.sandbox import pod_config as _config


async def test_run_stop_remove(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    sid = await mgr.run_sandbox(_config(), "")
    sb = mgr.get(sid)
    assert sb.state == READY and sb.ips == ["10.0.0.2"] and _alive(sb.pid)
    assert _exists(sb.netns_path) and _exists(sb.sandbox_dir)
    assert (await env.db.load_all("sandbox"))[sid]["state"] == READY
    assert await env.db.intents("sandbox") == {}

    await mgr.stop_sandbox(sid)
    assert sb.state == NOTREADY and sb.stopped and not _alive(sb.pid)
    assert await env.runtime.state(sid) is None  # deleted
    assert not _exists(sb.netns_path)
    await mgr.stop_sandbox(sid)  # idempotent

    await mgr.remove_sandbox(sid)
    assert mgr.find(sid) is None and await env.db.load_all("sandbox") == {}
    # The files go in the background, after the record.
    await mgr.parts.teardown.after_reply.settle()
    assert not _exists(sb.sandbox_dir)
    assert [c[0] for c in env.net.calls if c[1] == sid] == ["setup", "teardown", "teardown"]
    await mgr.remove_sandbox(sid)  # idempotent


async def test_stop_releases_the_mounts_and_remove_of_an_older_record_too(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = await env.manager()
    released: list[str] = []
    release = mgr.parts.teardown.release_mounts

    async def counted(sb: Any) -> None:
        released.append(sb.id)
        await release(sb)

    monkeypatch.setattr(mgr.parts.teardown, "release_mounts", counted)
    one = await mgr.run_sandbox(_config("one"), "")
    two = await mgr.run_sandbox(_config("two"), "")
    await mgr.stop_sandbox(one)
    assert released == [one]
    assert (await env.db.load_all("sandbox"))[one]["mounts_released"] is True
    await mgr.remove_sandbox(one)
    assert released == [one]  # nothing left to detach: one database delete

    # A pod stopped by a version that left its mounts for RemovePodSandbox.
    await mgr.stop_sandbox(two)
    mgr.get(two).mounts_released = False
    await mgr.remove_sandbox(two)
    assert released == [one, two, two] and mgr.list_sandboxes() == []


async def test_stop_waits_for_the_pod_lock(env: SimpleNamespace) -> None:
    """CreateContainer/StartContainer hold the pod lock: a stop cannot cut in."""
    mgr = await env.manager()
    sid = await mgr.run_sandbox(_config(), "")
    pid = mgr.get(sid).pid
    async with mgr.pod_lock(sid):
        stop = asyncio.create_task(mgr.stop_sandbox(sid))
        await asyncio.sleep(0.2)
        assert not stop.done() and _alive(pid) and mgr.get(sid).state == READY
    await asyncio.wait_for(stop, 10)
    assert not _alive(pid) and mgr.get(sid).state == NOTREADY


async def test_concurrent_stops_and_removes_settle(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    sid = await mgr.run_sandbox(_config(), "")
    await asyncio.gather(mgr.stop_sandbox(sid), mgr.remove_sandbox(sid),
                         mgr.stop_sandbox(sid), mgr.remove_sandbox(sid))
    assert mgr.list_sandboxes() == [] and await env.db.load_all("sandbox") == {}
    assert await env.runtime.list() == []


async def test_failed_run_leaves_nothing_and_frees_the_name(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    env.net.fail_setup = True
    with pytest.raises(RuntimeError, match="CNI ADD failed"):
        await mgr.run_sandbox(_config(), "")
    assert mgr.list_sandboxes() == [] and await env.runtime.list() == []
    assert await env.db.intents("sandbox") == {} and await env.db.load_all("sandbox") == {}
    assert os.listdir(os.path.join(env.cfg.root, "sandboxes")) == []
    env.net.fail_setup = False
    assert mgr.get(await mgr.run_sandbox(_config(), "")).state == READY


async def test_start_marks_dead_pauses_and_deletes_orphans(env: SimpleNamespace) -> None:
    first = await env.manager()
    dead = await first.run_sandbox(_config("dead"), "")
    live = await first.run_sandbox(_config("live"), "")
    orphan = await first.run_sandbox(_config("orphan"), "")
    await first.stop()
    first.stores.pods.clear()  # the daemon is gone; only records, runtime and files remain
    env.managers.remove(first)
    await env.db.delete("sandbox", orphan)  # a pause no record owns
    pause = (await env.runtime.state(dead) or {})["pid"]
    os.kill(pause, 9)
    deadline = time.monotonic() + 30
    while _alive(pause):  # dead once the kernel has run the kill
        assert time.monotonic() < deadline, "the pause outlived SIGKILL for 30 s"
        await asyncio.sleep(0.01)

    mgr = await env.manager()
    assert mgr.get(dead).state == NOTREADY and mgr.get(live).state == READY
    assert mgr.find(orphan) is None and await env.runtime.state(orphan) is None
    assert not _exists(os.path.join(env.cfg.root, "sandboxes", orphan))
    assert env.net.calls[-1] == ("reconcile", ",".join(sorted([dead, live])))


def _ids(*ids: str) -> dict[str, Any]:
    return {i: SimpleNamespace(id=i) for i in ids}


async def test_an_ambiguous_id_prefix_is_not_found_for_pods_and_containers(
        env: SimpleNamespace) -> None:
    pods = await env.manager()
    containers = pods.containers
    assert isinstance(containers, ContainerManager)
    pods.stores.pods._records.update(_ids("ab12", "ab34"))
    containers.records._records.update(_ids("cd12", "cd34"))
    for lookup, ambiguous, unique in ((pods, "ab", "ab3"), (containers, "cd", "cd1")):
        with pytest.raises(NotFound, match=r"prefix .* is ambiguous: 2 ids"):
            lookup.get(ambiguous)
        with pytest.raises(NotFound, match="ambiguous"):
            lookup.find(ambiguous)  # never "no such object" (a stop would be a no-op)
        assert lookup.get(unique).id.startswith(unique)
        assert lookup.find("zz") is None
        with pytest.raises(NotFound, match="not"):
            lookup.get("zz")
    # Idempotent stops and removes still refuse to guess.
    with pytest.raises(NotFound, match="ambiguous"):
        await pods.stop_sandbox("ab")
    with pytest.raises(NotFound, match="ambiguous"):
        await containers.stop_container("cd", 0)
    pods.stores.pods.clear()
    containers.records.clear()
