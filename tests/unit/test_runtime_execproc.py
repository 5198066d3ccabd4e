"""`<runtime> exec` teardown against a fake runtime: the exec'd process is killed and
reaped by the runtime (its parent), so nothing is left running and no zombie is handed to
the container's init, whether ExecSync times out or a streaming client goes away."""

from __future__ import annotations

import _posixsubprocess
import asyncio
import json
import os
import tempfile
import threading
from typing import Any

import pytest

from crishim.container import execsync
from crishim.container.execsync import exec_sync
from crishim.errors import DeadlineExceeded
from crishim.proc import spawn
from crishim.runtime import execproc
from crishim.runtime.runc import OCIRuntime
from crishim.streaming.backend import ContainerBackend
from tests.fakes.runtime import runtime as runtime  # the fixture


def _log(rt: OCIRuntime, cid: str) -> dict[str, str]:
    try:
        with open(os.path.join(rt.root, "exec.log")) as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split(" ", 2)[1:] for line in lines if line.startswith(cid + " "))


async def _wait_for_pid(rt: OCIRuntime, cid: str) -> int:
    for _ in range(500):
        pid = _log(rt, cid).get("pid")
        if pid:
            return int(pid)
        await asyncio.sleep(0.01)
    raise AssertionError("the fake runtime never started its process")


def _assert_reaped_by_runtime(rt: OCIRuntime, cid: str, pid: int) -> None:
    # The runtime outlived the SIGKILL of its child long enough to reap it...
    assert _log(rt, cid).get("reaped") == "-9"
    # ... so the process is gone entirely, not a zombie orphaned to someone else.
    assert not os.path.exists(f"/proc/{pid}")


async def test_exec_sync_collects_output_and_status(runtime: OCIRuntime,
                                                    tmp_path: Any) -> None:
    res = await exec_sync(runtime, "c1", {"args": ["sh", "-c", "echo out; echo err >&2; "
                                                   "exit 3"]},
                          os.path.join(str(tmp_path), "exec"), 10)
    assert (res.stdout, res.stderr, res.exit_code) == (b"out\n", b"err\n", 3)
    assert os.listdir(os.path.join(str(tmp_path), "exec")) == []  # spec and pid file gone


async def test_exec_sync_starts_the_runtime_off_the_event_loop(
        runtime: OCIRuntime, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Kubelet exec probes make this the most frequent process start: a start from the
    # loop's thread holds the loop (and the interpreter lock) until the child has exec'd.
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    real_fork_exec, real_mkstemp = _posixsubprocess.fork_exec, tempfile.mkstemp

    def fork_exec(*args: Any) -> int:
        if threading.get_ident() == loop_thread:
            on_loop.append("process start")
        return real_fork_exec(*args)

    def mkstemp(*args: Any, **kwargs: Any) -> tuple[int, str]:
        if threading.get_ident() == loop_thread:
            on_loop.append("process file")
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(_posixsubprocess, "fork_exec", fork_exec)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    res = await exec_sync(runtime, "c8", {"args": ["cat", "/proc/self/comm"]},
                          os.path.join(str(tmp_path), "exec"), 10)
    assert (res.stdout, res.exit_code) == (b"cat\n", 0)
    assert on_loop == []


async def test_exec_sync_timeout_kills_and_reaps(runtime: OCIRuntime, tmp_path: Any) -> None:
    with pytest.raises(DeadlineExceeded, match="timed out"):
        await exec_sync(runtime, "c2", {"args": ["sleep", "60"]},
                        os.path.join(str(tmp_path), "exec"), 1)
    pid = int(_log(runtime, "c2")["pid"])
    _assert_reaped_by_runtime(runtime, "c2", pid)


async def test_exec_sync_limit_is_the_commands_not_the_runtimes_setup(
        runtime: OCIRuntime, tmp_path: Any) -> None:
    # A 1 s exec probe whose command is quick passes on a host where the runtime takes
    # longer than that to start it.
    res = await exec_sync(runtime, "c5", {"args": ["--slow-start", "1.5", "echo", "ok"]},
                          os.path.join(str(tmp_path), "exec"), 1)
    assert (res.stdout, res.exit_code) == (b"ok\n", 0)


async def test_exec_sync_slow_to_start_command_still_times_out(runtime: OCIRuntime,
                                                                tmp_path: Any) -> None:
    with pytest.raises(DeadlineExceeded, match="timed out after 1s"):
        await exec_sync(runtime, "c6", {"args": ["--slow-start", "0.5", "sleep", "60"]},
                        os.path.join(str(tmp_path), "exec"), 1)
    _assert_reaped_by_runtime(runtime, "c6", int(_log(runtime, "c6")["pid"]))


async def test_exec_sync_runtime_that_never_starts_is_given_up_on(
        runtime: OCIRuntime, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execsync, "START_LIMIT", 0.5)
    with pytest.raises(DeadlineExceeded, match="did not start"):
        await exec_sync(runtime, "c7", {"args": ["--no-pid"]},
                        os.path.join(str(tmp_path), "exec"), 0.2)
    assert os.listdir(os.path.join(str(tmp_path), "exec")) == []


class _Sink:
    async def write(self, data: bytes) -> None:
        pass

    async def close(self) -> None:
        pass


class _Record:
    id = "c3"
    state = 1  # RUNNING

    def __init__(self, bundle: str) -> None:
        self.bundle = bundle


class _Containers:
    """What the streaming backend needs of the container manager."""

    def __init__(self, tmp: str, runtime: OCIRuntime) -> None:
        self.exec_dir = os.path.join(tmp, "exec")
        bundle = os.path.join(tmp, "bundle")
        os.makedirs(bundle)
        with open(os.path.join(bundle, "config.json"), "w") as fh:
            json.dump({"process": {"args": ["sh"], "cwd": "/"}}, fh)
        self.rec = _Record(bundle)
        self.runtime = runtime

    def get(self, cid: str) -> _Record:
        return self.rec

    def runtime_for(self, rec: Any) -> OCIRuntime:
        return self.runtime


async def test_streaming_exec_of_a_departed_client_is_killed_and_reaped(
        runtime: OCIRuntime, tmp_path: Any) -> None:
    containers = _Containers(str(tmp_path), runtime)
    backend = ContainerBackend(containers, containers)
    session = asyncio.create_task(backend.exec("c3", ["sleep", "60"], False, None, _Sink(),
                                               _Sink(), None))
    pid = await _wait_for_pid(runtime, "c3")
    session.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await session
    _assert_reaped_by_runtime(runtime, "c3", pid)
    assert os.listdir(containers.exec_dir) == []


async def test_runtime_without_a_pid_yet_is_killed(runtime: OCIRuntime,
                                                   tmp_path: Any) -> None:
    async def body() -> None:
        async with execproc.run_exec(runtime, "c4", {"args": ["--no-pid"]},
                                     os.path.join(str(tmp_path), "exec"),
                                     stdin=spawn.DEVNULL, stdout=spawn.DEVNULL,
                                     stderr=spawn.DEVNULL) as ex:
            procs.append(ex.proc)
            started.set()
            await ex.proc.wait()

    procs: list[spawn.Child] = []
    started = asyncio.Event()
    task = asyncio.create_task(body())
    await started.wait()
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert procs[0].returncode == -9
