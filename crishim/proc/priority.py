"""The daemon's CPU priority over the processes it starts.

While pods start, their runc, conmon and CNI plugin processes compete with the daemon for
the node's CPUs, and the kubelet's relist, probes and status calls wait behind them. The
daemon's threads run at `daemon_nice` (-10 unless configured). The main thread has the
kernel's reset-on-fork flag: every process it starts (and so every container) begins at
nice 0, as under any other runtime. Worker threads take the main thread's
priority when they start (follow_main_thread); processes are started only from the
threads of proc/spawn.py, which have the reset-on-fork flag too (starter_thread).

Where the kernel takes a time slice per thread (EEVDF, Linux 6.12+), the event loop's is
shortened too (LOOP_SLICE_NS): its weight stays that of its nice, but when a request wakes
it, its earlier deadline lets it preempt a pod's process rather than wait for that
process's slice to end. Its children start with the default slice (reset-on-fork).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

TASKS = "/proc/self/task"
AUTOGROUP = "/proc/self/autogroup"
# The event loop's time slice under EEVDF (Linux 6.12+ takes a slice per thread): a short
# one gives a thread that wakes an early deadline, so it runs soon after a request
# arrives, while its weight (share of the CPU) stays that of its nice.
LOOP_SLICE_NS = 500_000
SCHED_FLAG_RESET_ON_FORK = 0x01
# sched_setattr(2), sched_getattr(2): no wrapper in glibc 2.36.
_NUMBERS = {"x86_64": (314, 315), "aarch64": (274, 275),
            "riscv64": (274, 275)}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32),
                ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64),
                ("util_min", ctypes.c_uint32), ("util_max", ctypes.c_uint32)]


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


def starter_thread() -> None:
    """Initializer of the threads that start processes: the main thread's priority, so
    that a starter is not kept waiting behind the processes it starts, and the
    reset-on-fork flag, so that what it starts begins at nice 0."""
    follow_main_thread()
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, os.sched_param(0))


def batch_thread() -> None:
    """Initializer of a thread whose work nobody waits for: SCHED_BATCH, at the nice it
    was made with. A fair thread that wakes may preempt the one running on its CPU, and a
    thread of the daemon weighs as the whole daemon where the kernel schedules the
    daemon's session (autogroup) or cgroup as one group: the client its reply has just
    woken then waits behind it. A batch thread never preempts on waking; it runs when a
    CPU is free, or at the next tick, with the same share of the CPU."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def raise_threads(nice: int) -> list[int]:
    """Give every thread of this process `nice` (≤ 0), and the main thread (the event
    loop, which starts processes through asyncio too) the reset-on-fork flag; return the
    thread ids changed. Blocking (reads /proc): call it where a short stall is fine.

    The flag is set first, so that no child is ever forked at the raised priority.
    Workers started later set their own (follow_main_thread, starter_thread)."""
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


def _sched_attr(tid: int) -> _SchedAttr | None:
    if _NUMBERS is None:
        return None
    attr = _SchedAttr()
    if _libc.syscall(_NUMBERS[1], tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        return None
    return attr


def slice_of(tid: int) -> int:
    """A thread's time slice in ns; 0 where the kernel keeps none per thread (before
    6.12 a fair thread's runtime reads 0)."""
    attr = _sched_attr(tid)
    return int(attr.runtime) if attr is not None else 0


def set_slice(tid: int, slice_ns: int) -> bool:
    """Give thread `tid` a time slice of `slice_ns`, keeping its policy, nice and
    reset-on-fork flag (so that its children start with the default slice). False where
    the kernel keeps no slice per thread, or the thread is not a fair one."""
    attr = _sched_attr(tid)
    if _NUMBERS is None or attr is None or attr.policy != os.SCHED_OTHER or not attr.runtime:
        return False
    attr.size = ctypes.sizeof(attr)
    attr.flags &= SCHED_FLAG_RESET_ON_FORK
    attr.runtime = slice_ns
    if _libc.syscall(_NUMBERS[0], tid, ctypes.byref(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_setattr {tid}: {os.strerror(err)}")
    return True
