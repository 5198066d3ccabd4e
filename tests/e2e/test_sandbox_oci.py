"""The OCI layer against the real runc + conmon: create/start/kill/exit/delete."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import pytest

from crishim.host.facts import oom_score_adj_floor
from crishim.oci import spec as ocispec
from crishim.runtime import conmon
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import OCIRuntime, OCIRuntimeError
from tests.e2e.loopdirs import mkdirs_on_this_thread


def _bundle(tmp: str, args: list[str]) -> str:
    bundle = os.path.join(tmp, "bundle")
    os.makedirs(os.path.join(bundle, "rootfs"), exist_ok=True)
    shutil.copy("/usr/bin/catatonit", os.path.join(bundle, "rootfs", "catatonit"))
    s = ocispec.default_spec(args, readonly_rootfs=True)
    # clamped: runc would fail otherwise on this host
    ocispec.set_oom_score_adj(s, -998, oom_score_adj_floor())
    ocispec.write_bundle(bundle, s)
    return bundle


def _gone(path: str) -> bool:
    return not os.path.lexists(path)


def _isdir(path: str) -> bool:
    return os.path.isdir(path)


@pytest.fixture
def work(tmp_path: object) -> str:
    return str(tmp_path)


async def test_conmon_runs_container_and_reports_exit(work: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rt = OCIRuntime("runc", "runc", os.path.join(work, "runc"))
    exits = os.path.join(work, "exits")
    bundle = _bundle(work, ["/catatonit", "-P"])
    watcher = ExitFileWatcher(exits)
    await watcher.start()
    cid = "crishim-oci-test-" + os.urandom(4).hex()
    persist = os.path.join(work, "conmon", cid)
    log = os.path.join(work, "pods", "web", "app", "0.log")
    try:
        # conmon's directories and the log's (not there yet) are made off the event loop.
        with mkdirs_on_this_thread(monkeypatch) as on_loop:
            created = await conmon.create(conmon.MonitorRequest(
                cid, bundle, rt, log, exits, persist, roots=(work,)))
        assert on_loop == []
        assert _isdir(persist) and _isdir(os.path.dirname(log))
        assert (await rt.state(cid) or {})["status"] == "created"
        await rt.start(cid)
        state = await rt.state(cid)
        assert state is not None and state["status"] == "running"
        assert state["pid"] == created.pid
        assert conmon.conmon_alive(persist)
        got: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        watcher.watch(cid, lambda _c, code, ts: got.set_result((code, ts)))
        await rt.kill(cid, signal.SIGKILL)
        code, finished = await asyncio.wait_for(got, 10)
        assert code == 137 and finished > 0
        assert watcher.read_exit(cid) == (code, finished)
        # Stopping or deleting twice is not an error.
        await rt.kill(cid, signal.SIGKILL)
        await rt.delete(cid)
        await rt.delete(cid)
        assert await rt.state(cid) is None
    finally:
        await rt.delete(cid, force=True)
        await conmon.remove_monitor_files(cid, bundle, persist, exits, roots=(work,))
        await watcher.stop()
    assert _gone(persist)


async def test_failed_create_reports_runtime_reason_and_leaves_nothing(work: str) -> None:
    rt = OCIRuntime("runc", "runc", os.path.join(work, "runc"))
    exits = os.path.join(work, "exits")
    bundle = _bundle(work, ["/does-not-exist"])
    cid = "crishim-oci-bad-" + os.urandom(4).hex()
    persist = os.path.join(work, "conmon", cid)
    with pytest.raises(OCIRuntimeError, match="does-not-exist"):
        await conmon.create(conmon.MonitorRequest(cid, bundle, rt, "", exits, persist,
                                                  roots=(work,)))
        await rt.start(cid)  # runc 1.1 reports exec failures at create; crun at start
    await rt.delete(cid, force=True)
    assert await rt.state(cid) is None
    assert _gone(persist)
    assert _gone(os.path.join(exits, cid))
