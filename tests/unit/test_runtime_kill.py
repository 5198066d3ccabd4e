"""kill_and_delete (crishim/runtime/kill.py), for containers without a monitor (the pause):
a live container's process is SIGKILLed and waited for before the forced delete, a
stopped one is only deleted, an unknown one is left alone, and with a pidfd the signal
goes to exactly that process. The runtime is a fake over a real process."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from crishim.runtime import pidwatch
from crishim.runtime.kill import kill_and_delete


class FakeRuntime:
    """runc's state/kill/delete for one container whose process is `proc`."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, status: str = "running") -> None:
        self.proc = proc
        self.status = status
        self.calls: list[tuple[Any, ...]] = []

    async def state(self, cid: str) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        return {"id": cid, "status": self.status, "pid": self.proc.pid}

    async def kill(self, cid: str, sig: int, all_procs: bool = False) -> None:
        self.calls.append(("kill", cid, sig, all_procs))
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    async def delete(self, cid: str, force: bool = False) -> None:
        self.calls.append(("delete", cid, force))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "3600"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


async def test_a_running_container_is_killed_then_deleted(
        sleeper: subprocess.Popen[bytes]) -> None:
    rt = FakeRuntime(sleeper)
    await kill_and_delete(rt, "pause1", all_procs=True)  # type: ignore[arg-type]
    assert rt.calls == [("kill", "pause1", signal.SIGKILL, True), ("delete", "pause1", True)]
    assert gone(sleeper.pid)


async def test_a_stopped_container_is_only_deleted(sleeper: subprocess.Popen[bytes]) -> None:
    rt = FakeRuntime(sleeper, status="stopped")
    await kill_and_delete(rt, "pause1")  # type: ignore[arg-type]
    assert rt.calls == [("delete", "pause1", True)]
    assert not gone(sleeper.pid)


async def test_an_unknown_container_is_left_alone() -> None:
    rt = FakeRuntime(None)
    await kill_and_delete(rt, "nosuch")  # type: ignore[arg-type]
    assert rt.calls == []


async def test_with_a_pidfd_the_signal_goes_to_that_process(
        sleeper: subprocess.Popen[bytes]) -> None:
    rt = FakeRuntime(sleeper)
    pidfd = pidwatch.open_pidfd(sleeper.pid)
    try:
        await kill_and_delete(rt, "pause1", pidfd=pidfd)  # type: ignore[arg-type]
    finally:
        os.close(pidfd)
    assert rt.calls == [("delete", "pause1", True)]  # no runc kill: the pidfd was used
    assert gone(sleeper.pid)
