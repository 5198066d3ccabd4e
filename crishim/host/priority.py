"""The daemon's CPU priority over the processes it starts.

While pods start, their runc, conmon and CNI plugin processes compete with the daemon for
the node's CPUs, and the kubelet's relist, probes and status calls wait behind them. The
daemon's threads run at `daemon_nice` (-10 unless configured). The main thread has the
kernel's reset-on-fork flag: every process it starts (and so every container) begins at
nice 0, as under any other runtime. Worker threads take the main thread's
priority when they start (follow_main_thread); processes are started from such threads
only through crishim/spawn.py, which hands them back to nice 0.
"""

from __future__ import annotations

import contextlib
import os

TASKS = "/proc/self/task"
AUTOGROUP = "/proc/self/autogroup"


def thread_ids() -> list[int]:
    return sorted(int(t) for t in os.listdir(TASKS))


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def follow_main_thread() -> None:
    """Initializer of the daemon's worker threads: the main thread's priority, without
    the reset-on-fork flag. A thread is created at nice 0 (the flag resets it), and a
    worker preempted by the pods' processes while it holds the interpreter lock stalls
    the event loop as long as it waits for a CPU."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, os.getpid()))


def raise_threads(nice: int) -> list[int]:
    """Give every thread of this process `nice` (≤ 0), and the main thread (the event
    loop, which starts processes through asyncio too) the reset-on-fork flag; return the
    thread ids changed. Blocking (reads /proc): call it where a short stall is fine.

    The flag is set first, so that no child is ever forked at the raised priority. Only
    the main thread gets it: the threads of crishim/spawn.py must not (a child they start
    keeps their priority until it has called exec)."""
    if nice > 0:
        raise ValueError(f"nice {nice}: only a raised (negative) priority makes sense here")
    changed = []
    for tid in thread_ids():
        try:
            if tid == os.getpid():
                os.sched_setscheduler(tid, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK,
                                      os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        changed.append(tid)
    return changed


def raise_session(nice: int) -> bool:
    """Give the daemon's session `nice` where the kernel schedules sessions as groups
    (autogroup: processes in no cpu cgroup of their own, as on hosts without systemd).
    There a thread's nice weighs only within its session, and every runc or conmon that
    starts a session of its own weighs as much as the whole daemon. Only a daemon that
    leads its session (as under systemd or hack/bench) changes it; True when it did."""
    if os.getsid(0) != os.getpid() or not os.path.exists(AUTOGROUP):
        return False
    try:
        with open(AUTOGROUP, "w") as fh:
            fh.write(str(nice))
    except OSError:
        return False
    return True
