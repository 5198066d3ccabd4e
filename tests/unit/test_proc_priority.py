"""The daemon's raised priority stays its own: threads made later and child processes
begin at nice 0 (proc/priority.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from crishim.proc import priority

# Runs in a child interpreter so that the test process keeps its own priority.
CHILD = """
import json, os, subprocess, sys, threading
from crishim.proc import priority
before = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
before.start()
changed = priority.raise_threads(-7)
later = {}
t = threading.Thread(target=lambda: later.update(nice=os.getpriority(os.PRIO_PROCESS, 0)))
t.start(); t.join()
child = subprocess.run(["cut", "-d", " ", "-f", "19", "/proc/self/stat"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"main": os.getpriority(os.PRIO_PROCESS, 0),
                  "before": priority.nice_of(before.native_id),
                  "changed": sorted(changed) == sorted({os.getpid(), before.native_id}),
                  "later_thread": later["nice"], "child": int(child)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root (CAP_SYS_NICE)")
def test_threads_raised_children_and_new_threads_at_zero() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert json.loads(out) == {"main": -7, "before": -7, "changed": True,
                               "later_thread": 0, "child": 0}


def test_a_lowered_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="nice 3"):
        priority.raise_threads(3)


SLICE_CHILD = """
import json, os, subprocess, time
from crishim.proc import priority
priority.raise_threads(-7)
default = priority.slice_of(os.getpid())
short = priority.set_slice(os.getpid(), 300_000)
child = subprocess.Popen(["sleep", "10"])
try:
    time.sleep(0.05)
    print(json.dumps({"default": default, "short": short,
                      "main": priority.slice_of(os.getpid()),
                      "nice": os.getpriority(os.PRIO_PROCESS, 0),
                      "child": priority.slice_of(child.pid),
                      "child_nice": os.getpriority(os.PRIO_PROCESS, child.pid)}))
finally:
    child.kill()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root (CAP_SYS_NICE)")
def test_the_loops_short_slice_keeps_its_nice_and_is_not_inherited() -> None:
    if not priority.slice_of(os.getpid()):
        pytest.skip("this kernel keeps no time slice per thread (before Linux 6.12)")
    out = json.loads(subprocess.run([sys.executable, "-c", SLICE_CHILD], capture_output=True,
                                    text=True, check=True, timeout=60).stdout)
    assert out["short"] is True
    assert out["main"] == 300_000 and out["nice"] == -7
    assert out["child"] == out["default"] and out["child_nice"] == 0
