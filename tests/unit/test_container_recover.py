"""Start-up reconciliation of containers (crishim/container/recover.py) through the real
ContainerManager, with the fakes of tests/fakes/containers.py at the boundary (fake runtime,
fake conmon, plain-dir rootfs): a container that vanished while the daemon was down, a
create a crash cut short, a remove a crash cut short, and the image users learnt again
from the records."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from types import SimpleNamespace

import pytest

from crishim.container import manager as container_manager
from crishim.container.manager import KIND, ContainerManager
from crishim.store.container import EXITED, RUNNING
from tests.fakes.containers import IMAGE, POD
from tests.fakes.containers import container_config as _config
from tests.fakes.containers import env as env  # the fixture
from tests.fakes.containers import stored_state as _stored_state
from tests.fakes.host import exists as _exists


class Crash(BaseException):
    """The daemon dying at a crash point: nothing after it runs, no cleanup catches it."""


def crash_at(monkeypatch: pytest.MonkeyPatch, step: str) -> list[str]:
    """Crash at `step` while the returned list holds it (clear it: the daemon restarts
    without the crash point; monkeypatch.undo would also undo the env's fakes)."""
    armed = [step]

    def point(name: str) -> None:
        if name in armed:
            raise Crash(name)
    monkeypatch.setattr(container_manager, "crash_point", point)
    return armed


async def gone(env: SimpleNamespace, mgr: ContainerManager) -> None:
    """The daemon is gone: conmon, runtime state, files and records remain."""
    await mgr.stop()
    mgr.records.clear()
    env.managers.remove(mgr)


async def test_a_container_that_vanished_while_down_exits_255(env: SimpleNamespace) -> None:
    first = await env.manager()
    rec = await first.create_container(POD, _config())
    await first.start_container(rec.id)
    assert first.get(rec.id).state == RUNNING
    await gone(env, first)
    # The node lost it: the monitor died without an exit file, the process and runc's
    # state are gone (e.g. a reboot).
    env.fake.monitors[rec.id].cancel()
    env.fake.alive.discard(rec.persist_dir)
    os.kill(rec.pid, signal.SIGKILL)
    await env.fake.procs[rec.id].wait()
    shutil.rmtree(os.path.join(env.runtime.root, rec.id))

    mgr = await env.manager()
    dead = mgr.get(rec.id)
    assert dead.state == EXITED
    assert dead.exit_code == 255, "a vanished container must not look like a success"
    assert dead.reason == "Unknown" and "disappeared" in dead.message
    assert dead.finished_at > 0
    assert await _stored_state(env, rec.id) == EXITED
    assert (await env.db.load_all(KIND))[rec.id]["exit_code"] == 255
    await mgr.remove_container(rec.id)
    assert mgr.find(rec.id) is None


async def test_a_create_cut_short_is_rolled_back(env: SimpleNamespace,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    first = await env.manager()
    armed = crash_at(monkeypatch, "container-before-record")
    with pytest.raises(Crash):
        await first.create_container(POD, _config("cut"))
    assert len(await env.db.intents(KIND)) == 1
    bundles = os.listdir(first.parts.bundles.containers_dir)
    assert len(bundles) == 1, bundles
    await gone(env, first)
    armed.clear()

    mgr = await env.manager()
    assert mgr.list_containers() == []
    assert await env.db.intents(KIND) == {} and await env.db.load_all(KIND) == {}
    assert os.listdir(mgr.parts.bundles.containers_dir) == []
    # The name is free again and the container can be made.
    rec = await mgr.create_container(POD, _config("cut"))
    await mgr.start_container(rec.id)
    assert mgr.get(rec.id).state == RUNNING


async def test_the_image_users_come_back_from_the_records(env: SimpleNamespace) -> None:
    first = await env.manager()
    rec = await first.create_container(POD, _config())
    images = first.stores.images
    assert images._images[IMAGE.id].users == {rec.id}, "create did not mark the image used"
    await images.remove(IMAGE.id)
    assert images.get(IMAGE.id) is None
    assert IMAGE.id in await env.db.load_all("image"), "an image in use was deleted"
    await gone(env, first)
    images._images[IMAGE.id].users.clear()  # memory only: a restart starts from nothing

    mgr = await env.manager()
    assert images._images[IMAGE.id].users == {rec.id}
    await asyncio.gather(*images._bg)  # any background deletion has run by now
    assert IMAGE.id in await env.db.load_all("image"), \
        "restart deleted the layers of a removed image a container still uses"
    await mgr.remove_container(rec.id)
    await asyncio.gather(*images._bg)
    assert IMAGE.id not in await env.db.load_all("image"), \
        "the removed image stayed after its last container went"


async def test_a_remove_cut_short_is_finished_at_start(env: SimpleNamespace,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    first = await env.manager()
    rec = await first.create_container(POD, _config())
    await first.start_container(rec.id)
    await first.stop_container(rec.id, 0)
    bundle = rec.bundle
    armed = crash_at(monkeypatch, "container-remove-before-files")
    with pytest.raises(Crash):
        await first.remove_container(rec.id)
    await gone(env, first)
    armed.clear()

    mgr = await env.manager()
    # Exited, not yet forgotten: listed, and removing it again leaves nothing.
    assert mgr.get(rec.id).state == EXITED
    await mgr.remove_container(rec.id)
    assert mgr.list_containers() == [] and await env.db.load_all(KIND) == {}
    for _ in range(100):  # the files go in the background, after the record
        if not _exists(bundle):
            break
        await asyncio.sleep(0.05)
    assert not _exists(bundle), "the bundle of a removed container stayed"


async def test_files_no_record_owns_are_swept_at_start(env: SimpleNamespace) -> None:
    """What a crash leaves between forgetting a record and deleting its files (the
    removal of a released container's files runs in the background): a bundle and
    conmon's files of an id no record has."""
    first = await env.manager()
    kept = await first.create_container(POD, _config("kept"))
    containers_dir, conmon_dir = first.parts.bundles.containers_dir, first.conmon_dir
    await gone(env, first)
    stray = "f" * 64
    os.makedirs(os.path.join(containers_dir, stray, "rootfs"))
    os.makedirs(os.path.join(conmon_dir, stray))

    mgr = await env.manager()
    assert not _exists(os.path.join(containers_dir, stray)), "an orphan bundle stayed"
    assert not _exists(os.path.join(conmon_dir, stray)), "orphan conmon files stayed"
    assert _exists(mgr.get(kept.id).bundle), "a live container's bundle was swept"
