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


async def test_runtime_without_a_pid_yet_is_killed(runtime: OCIRuntime, tmp_path: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execproc, "START_WAIT", 0.3)
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


def _state(pid: int) -> str:
    """The process's state letter; "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


async def _leave_early(rt: OCIRuntime, cid: str, args: list[str], tmp: str) -> spawn.Child:
    """A client that leaves once the runtime has started the process, before the runtime
    wrote its pid file; the runtime process."""
    procs: list[spawn.Child] = []

    async def body() -> None:
        async with execproc.run_exec(rt, cid, {"args": args}, os.path.join(tmp, "exec"),
                                     stdin=spawn.DEVNULL, stdout=spawn.DEVNULL,
                                     stderr=spawn.DEVNULL) as ex:
            procs.append(ex.proc)
            await ex.proc.wait()

    task = asyncio.create_task(body())
    for _ in range(500):
        if "child" in _log(rt, cid):
            break
        await asyncio.sleep(0.01)
    assert "pid" not in _log(rt, cid)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return procs[0]


@pytest.mark.parametrize("sync", [False, True])
async def test_client_leaving_before_the_pid_file_does_not_orphan_the_process(
        runtime: OCIRuntime, tmp_path: Any, sync: bool) -> None:
    # runc writes its pid file once the process runs: killed before that, runc would leave
    # the process running in the container. Teardown waits for the pid instead.
    args = ["--late-pid", "0.5", "sleep", "60"]
    if sync:
        call = asyncio.create_task(exec_sync(runtime, "c9", {"args": args},
                                             os.path.join(str(tmp_path), "exec"), 0))
        for _ in range(500):
            if "child" in _log(runtime, "c9"):
                break
            await asyncio.sleep(0.01)
        call.cancel()  # the ExecSync client's deadline
        await asyncio.gather(call, return_exceptions=True)
    else:
        await _leave_early(runtime, "c9", args, str(tmp_path))
    pid = int(_log(runtime, "c9")["child"])
    _assert_reaped_by_runtime(runtime, "c9", pid)
    assert os.listdir(os.path.join(str(tmp_path), "exec")) == []


async def test_runtime_that_never_writes_the_pid_is_killed_with_its_children(
        runtime: OCIRuntime, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execproc, "START_WAIT", 0.3)
    proc = await _leave_early(runtime, "c10", ["--hang-with-child", "sleep", "60"],
                              str(tmp_path))
    assert proc.returncode == -9
    child = int(_log(runtime, "c10")["child"])
    # Killed before the runtime was: at most a zombie until whoever inherited it reaps it.
    assert _state(child) in ("", "Z")


async def test_runtime_that_fails_to_start_is_not_killed(runtime: OCIRuntime,
                                                         tmp_path: Any) -> None:
    # No pid file and the runtime exits on its own (runc could not start the process):
    # teardown waits for that exit rather than killing it.
    proc = await _leave_early_failing(runtime, str(tmp_path))
    assert proc.returncode == 1


async def _leave_early_failing(rt: OCIRuntime, tmp: str) -> spawn.Child:
    procs: list[spawn.Child] = []
    entered = asyncio.Event()

    async def body() -> None:
        async with execproc.run_exec(rt, "c11", {"args": ["--fail-start", "0.3"]},
                                     os.path.join(tmp, "exec"), stdin=spawn.DEVNULL,
                                     stdout=spawn.DEVNULL, stderr=spawn.DEVNULL) as ex:
            procs.append(ex.proc)
            entered.set()
            await ex.proc.wait()

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return procs[0]


async def test_client_leaving_while_the_runtime_is_spawned_does_not_orphan_the_process(
        runtime: OCIRuntime, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The start itself runs on a thread: a client that leaves meanwhile must not leave
    # the runtime, and what it starts, to nobody.
    real_start = spawn.start

    async def slow_start(*args: Any, **kwargs: Any) -> spawn.Child:
        proc = await real_start(*args, **kwargs)
        await asyncio.sleep(0.5)  # the caller is cancelled here, the runtime started
        return proc

    monkeypatch.setattr(spawn, "start", slow_start)
    call = asyncio.create_task(exec_sync(runtime, "c12", {"args": ["sleep", "60"]},
                                         os.path.join(str(tmp_path), "exec"), 0))
    for _ in range(500):
        if "pid" in _log(runtime, "c12"):
            break
        await asyncio.sleep(0.01)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    _assert_reaped_by_runtime(runtime, "c12", int(_log(runtime, "c12")["pid"]))
    assert os.listdir(os.path.join(str(tmp_path), "exec")) == []
