"""crishim/proc/spawn.py: processes started off the event loop behave as asyncio's do, and
begin at nice 0 when the daemon runs raised."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from crishim.proc import spawn


async def test_communicate_exit_code_and_output() -> None:
    child = await spawn.start(["sh", "-c", "cat; echo oops >&2; exit 3"], stdin=spawn.PIPE,
                              stdout=spawn.PIPE, stderr=spawn.PIPE)
    out, err = await child.communicate(b"hello" * 20000)  # more than a pipe holds
    assert (out, err, child.returncode) == (b"hello" * 20000, b"oops\n", 3)
    assert await child.wait() == 3


async def test_kill_and_wait_after_a_timeout() -> None:
    child = await spawn.start(["sleep", "30"], start_new_session=True)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(child.wait(), 0.1)
    child.kill()
    assert await child.wait() == -signal.SIGKILL
    child.kill()  # already reaped: nothing to do


async def test_missing_program_is_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        await spawn.start(["/nonexistent/crishim-test-binary"])
    with pytest.raises(FileNotFoundError):
        await spawn.start(["crishim-test-binary-not-on-path"], env={"PATH": "/usr/bin"})


async def test_env_cwd_and_passed_fds() -> None:
    r, w = os.pipe()  # close-on-exec, as Python makes every fd
    child = await spawn.start(["sh", "-c", f'pwd; echo "$X"; test -e /proc/$$/fd/{w} && echo fd'],
                              stdout=spawn.PIPE, env={"PATH": "/usr/bin:/bin", "X": "y"},
                              cwd="/", pass_fds=(w,))
    os.close(w)
    out, _ = await child.communicate()
    assert out == b"/\ny\nfd\n"
    os.close(r)


async def test_only_stdio_and_passed_fds_reach_the_child() -> None:
    """An inheritable fd of the daemon (another child's pipe end, say) must not: a conmon
    holding it would keep that pipe open for its life."""
    leaked = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    passed = os.open("/dev/null", os.O_RDONLY)
    for fd in (*leaked, passed):
        os.set_inheritable(fd, fd != passed)
    try:
        child = await spawn.start(["ls", "/proc/self/fd"], stdout=spawn.PIPE,
                                  pass_fds=(passed,))
        out, _ = await child.communicate()
    finally:
        for fd in (*leaked, passed):
            os.close(fd)
    # and ls's own, at the lowest free number
    ls_dir = min(set(range(3, passed + 2)) - {passed})
    assert sorted(int(n) for n in out.split()) == sorted({0, 1, 2, passed, ls_dir})


async def test_the_child_starts_with_default_signals_in_its_own_session() -> None:
    """SIGPIPE (ignored by Python) is back at its default, nothing is blocked, and
    start_new_session gives the child its own session."""
    # The spawned program reads its own status: a shell reading its own would race with
    # its forks, which block every signal in the shell until the parent runs again.
    child = await spawn.start(["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"],
                              stdout=spawn.PIPE, start_new_session=True)
    out, _ = await child.communicate()
    words = out.decode().split()
    ignored = int(words[words.index("SigIgn:") + 1], 16)
    assert int(words[words.index("SigBlk:") + 1], 16) == 0
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    child = await spawn.start(["sh", "-c", "ps -o sid= -p $$"], stdout=spawn.PIPE,
                              start_new_session=True)
    out, _ = await child.communicate()
    assert int(out.split()[-1]) == child.pid


async def test_missing_working_directory_names_it() -> None:
    with pytest.raises(FileNotFoundError) as info:
        await spawn.start(["true"], cwd="/nonexistent/crishim-test-dir")
    assert info.value.filename == "/nonexistent/crishim-test-dir"


CHILD = """
import asyncio, json, os
from crishim.proc import spawn
from crishim.proc import priority

def starter():
    reset = os.sched_getscheduler(0) & os.SCHED_RESET_ON_FORK
    return os.getpriority(os.PRIO_PROCESS, 0), bool(reset)

async def main():
    priority.raise_threads(-6)
    child = await spawn.start(["sh", "-c", "cut -d' ' -f19 /proc/$$/stat; cat /proc/$$/cmdline"],
                              stdout=spawn.PIPE)
    out, _ = await child.communicate()
    nice, cmdline = out.split(b"\\n", 1)
    starter_nice, reset = spawn._starter.submit(starter).result()
    print(json.dumps({"nice": int(nice), "argv0": cmdline.split(b"\\0")[0].decode(),
                      "starter": [starter_nice, reset]}))

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root (CAP_SYS_NICE)")
def test_children_of_a_raised_daemon_run_their_program_at_nice_zero() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    found = json.loads(out)
    assert found["nice"] == 0 and os.path.basename(found["argv0"]) == "sh"
    # The starter waits for no CPU behind what it starts, and passes its priority on to
    # none of it, with no `nice` run in between.
    assert found["starter"] == [-6, True]


async def test_the_exit_is_reaped_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel frees the process inside waitpid, which can take tens of milliseconds.
    reapers: list[str] = []
    waitpid = os.waitpid

    def recording_waitpid(pid: int, options: int) -> tuple[int, int]:
        reapers.append(threading.current_thread().name)
        return waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", recording_waitpid)
    child = await spawn.start(["sh", "-c", "exit 3"])
    assert await child.wait() == 3
    assert child.returncode == 3
    assert reapers and reapers[0] != threading.main_thread().name
