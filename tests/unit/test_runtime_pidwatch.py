"""PidWatcher (pidfd exit notice on the event loop) and the monitor-less OCIRuntime.create
it is used with, against real processes and a fake runc."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import time

import pytest

from crishim.runtime import pidwatch
from crishim.runtime.pidwatch import PidWatcher
from crishim.runtime.runc import OCIRuntime, OCIRuntimeError
from tests.fakes.runtime import FAKE_PROLOGUE


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _sleep() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"])


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _reaped(pid: int) -> bool:
    """True once `pid` (our child) was reaped by someone else."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


async def _until(pred: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_killed_process_fires_callback_once_and_is_reaped() -> None:
    before = _fds()
    proc = _sleep()
    watcher = PidWatcher()
    fired: list[str] = []
    assert watcher.watch("a", proc.pid, fired.append)
    assert "a" in watcher
    await asyncio.sleep(0.05)
    assert fired == []  # alive: nothing yet
    proc.kill()
    await _until(lambda: fired)
    await asyncio.sleep(0.05)
    assert fired == ["a"]
    assert "a" not in watcher
    # Our own child: reaped through its pidfd, so no zombie is left.
    assert _reaped(proc.pid)
    assert _fds() == before


async def test_async_callback_and_failing_callbacks() -> None:
    watcher = PidWatcher()
    got: list[str] = []

    async def on_exit(key: str) -> None:
        await asyncio.sleep(0)
        got.append(key)

    def boom(_key: str) -> None:
        raise RuntimeError("callback bug")

    async def aboom(_key: str) -> None:
        raise RuntimeError("async callback bug")

    procs = [_sleep() for _ in range(3)]
    assert watcher.watch("async", procs[0].pid, on_exit)
    assert watcher.watch("boom", procs[1].pid, boom)
    assert watcher.watch("aboom", procs[2].pid, aboom)
    for p in procs:
        p.kill()
    await _until(lambda: got)
    assert got == ["async"]
    await _until(lambda: all(_reaped(p.pid) for p in procs))
    watcher.close()


async def test_already_dead_pid_is_false() -> None:
    before = _fds()
    pid = _dead_pid()
    watcher = PidWatcher()
    assert not watcher.watch("gone", pid, lambda _k: None)
    assert "gone" not in watcher
    assert not watcher.watch("nopid", 0, lambda _k: None)
    assert _fds() == before


async def test_unwatch_means_no_callback_and_no_fd() -> None:
    before = _fds()
    proc = _sleep()
    watcher = PidWatcher()
    fired: list[str] = []
    assert watcher.watch("a", proc.pid, fired.append)
    watcher.unwatch("a")
    watcher.unwatch("a")  # idempotent
    watcher.unwatch("never")
    assert _fds() == before
    proc.kill()
    proc.wait()  # not reaped by the watcher: Popen still gets the status
    assert proc.returncode == -signal.SIGKILL
    await asyncio.sleep(0.1)
    assert fired == []


async def test_rewatch_replaces_and_close_forgets_everything() -> None:
    before = _fds()
    a, b = _sleep(), _sleep()
    watcher = PidWatcher()
    fired: list[str] = []
    assert watcher.watch("k", a.pid, lambda k: fired.append(f"a:{k}"))
    assert watcher.watch("k", b.pid, lambda k: fired.append(f"b:{k}"))  # replaces
    assert watcher.watch("other", a.pid, fired.append)
    a.kill()
    await _until(lambda: fired)
    assert fired == ["other"]
    watcher.close()
    assert _fds() == before
    b.kill()
    b.wait()
    await asyncio.sleep(0.1)
    assert fired == ["other"]


async def test_reap_false_leaves_the_status_to_the_parent() -> None:
    proc = _sleep()
    watcher = PidWatcher()
    fired: list[str] = []
    assert watcher.watch("a", proc.pid, fired.append, reap=False)
    proc.send_signal(signal.SIGTERM)
    await _until(lambda: fired)
    assert proc.wait(5) == -signal.SIGTERM


async def test_take_hands_over_the_pidfd_for_kill_and_wait() -> None:
    before = _fds()
    proc = _sleep()
    watcher = PidWatcher()
    fired: list[str] = []
    assert watcher.watch("a", proc.pid, fired.append)
    fd = watcher.take("a")
    assert fd is not None and watcher.take("a") is None and "a" not in watcher
    try:
        assert not pidwatch.exited(fd)
        assert not await pidwatch.wait_exit(fd, 0.05)
        assert pidwatch.send_signal(fd, signal.SIGKILL)
        assert await pidwatch.wait_exit(fd, 5)
        assert pidwatch.exited(fd)
        pidwatch.reap(fd)
        assert not pidwatch.send_signal(fd, signal.SIGKILL)  # gone: no error
    finally:
        os.close(fd)
    assert _reaped(proc.pid)
    await asyncio.sleep(0.05)
    assert fired == []
    assert _fds() == before


async def test_a_taken_pidfd_can_be_given_back() -> None:
    before = _fds()
    proc = _sleep()
    watcher = PidWatcher()
    fired: list[str] = []
    assert watcher.watch("a", proc.pid, fired.append)
    fd = watcher.take("a")
    assert fd is not None
    assert watcher.watch("a", proc.pid, fired.append, pidfd=fd)  # the watcher owns it
    proc.kill()
    await _until(lambda: fired)
    # Given back after the process died: reported on the next loop iteration.
    other = _sleep()
    assert watcher.watch("b", other.pid, fired.append)
    fd = watcher.take("b")
    assert fd is not None
    other.kill()
    await _until(lambda: pidwatch.exited(fd))
    assert watcher.watch("b", other.pid, fired.append, pidfd=fd)
    await _until(lambda: len(fired) == 2)
    assert fired == ["a", "b"]
    assert _reaped(proc.pid) and _reaped(other.pid)
    assert _fds() == before


def test_reap_of_a_process_that_is_not_our_child_is_a_noop() -> None:
    fd = pidwatch.open_pidfd(1)
    assert fd is not None
    try:
        pidwatch.reap(fd)  # PID 1 is not our child: ChildProcessError is swallowed
    finally:
        os.close(fd)


# --- OCIRuntime.create: no monitor, stdio on /dev/null ---------------------------------

# `create` leaves a background "container" process holding the runtime's stdio (as runc
# does without a terminal), writes its pid to --pid-file and exits.
FAKE_CREATE = FAKE_PROLOGUE + """[ "$cmd" = create ] || exit 3
pidfile=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pid-file) pidfile="$2"; shift 2;;
    --bundle) shift 2;;
    *) id="$1"; shift;;
  esac
done
if [ "$id" = bad ]; then
  echo "stderr is not where the reason comes from" >&2
  echo '{"level":"error","msg":"starting container process caused: no such file"}' >> "$log"
  exit 1
fi
if [ "$id" = nopid ]; then exit 0; fi
sleep 60 &
echo $! > "$pidfile"
"""


@pytest.fixture
def fake_runtime(tmp_path: object) -> OCIRuntime:
    path = os.path.join(str(tmp_path), "fake-runc")
    with open(path, "w") as fh:
        fh.write(FAKE_CREATE)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return OCIRuntime("runc", path, os.path.join(str(tmp_path), "root"))


async def test_create_returns_pid_without_waiting_for_the_container(
        fake_runtime: OCIRuntime, tmp_path: object) -> None:
    pid_file = os.path.join(str(tmp_path), "pause.pid")
    # Waiting for EOF would take the 60 s sleep; a loaded host may take seconds to fork.
    pid = await asyncio.wait_for(fake_runtime.create("good", "/bundle", pid_file), 30)
    try:
        for fd in (0, 1, 2):
            assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"
        assert os.getsid(pid) != os.getsid(0)  # its own session, not crishim's
        assert not [n for n in os.listdir(fake_runtime.root) if n.startswith(".log-")]
    finally:
        os.kill(pid, signal.SIGKILL)


async def test_create_failure_reason_comes_from_the_log(fake_runtime: OCIRuntime,
                                                        tmp_path: object) -> None:
    pid_file = os.path.join(str(tmp_path), "pause.pid")
    with pytest.raises(OCIRuntimeError) as err:
        await fake_runtime.create("bad", "/bundle", pid_file)
    assert str(err.value).startswith("runc create failed (exit 1): ")
    assert "no such file" in str(err.value)
    with pytest.raises(OCIRuntimeError) as err:
        await fake_runtime.create("nopid", "/bundle", pid_file)
    assert "no pid" in str(err.value)
    assert not [n for n in os.listdir(fake_runtime.root) if n.startswith(".log-")]
