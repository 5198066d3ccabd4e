"""Work left behind by a call runs on a worker thread, and only after the call's step."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from crishim.proc.afterreply import AfterReply


async def test_the_work_starts_after_the_current_step_on_another_thread() -> None:
    ran: list[tuple[str, int]] = []
    work = AfterReply()
    work.run("note", lambda what: ran.append((what, threading.get_ident())), "x")
    # Still in the step that asked (where a handler writes its reply): nothing ran yet.
    assert ran == []
    await work.settle()
    assert ran[0][0] == "x" and ran[0][1] != threading.get_ident()


async def test_a_failure_is_logged_and_goes_no_further(caplog: pytest.LogCaptureFixture) -> None:
    def fail(path: str) -> None:
        raise OSError(f"cannot delete {path}")

    work = AfterReply()
    with caplog.at_level(logging.WARNING):
        work.run("deleting files", fail, "/x")
        await work.settle()
    assert "background work failed" in caplog.text
    fields = getattr(caplog.records[-1], "kv", {})
    assert fields == {"work": "deleting files", "error": "cannot delete /x"}


# Runs in a child interpreter so that the test process keeps its own priority.
CHILD = """
import asyncio, json, os
from concurrent.futures import ThreadPoolExecutor
from crishim.proc.afterreply import AfterReply
from crishim.proc import priority

async def main():
    priority.raise_threads(-6)  # as the daemon starts, with its workers at its priority
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(initializer=priority.follow_main_thread))
    seen = {}
    work = AfterReply()
    work.run("note", lambda key: seen.update({key: os.getpriority(os.PRIO_PROCESS, 0),
                                              "policy": os.sched_getscheduler(0)}), "x")
    await work.settle()
    print(json.dumps({"loop": os.getpriority(os.PRIO_PROCESS, 0), "work": seen["x"],
                      "batch": seen["policy"] == os.SCHED_BATCH}))

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root (CAP_SYS_NICE)")
def test_the_work_of_a_raised_daemon_runs_at_nice_zero_as_a_batch_thread() -> None:
    # At the daemon's priority, or woken as a normal thread, it took the CPU that the
    # reply had just woken the client on.
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert json.loads(out) == {"loop": -6, "work": 0, "batch": True}
