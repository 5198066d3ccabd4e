"""A client in its own process that times cheap RPCs in a loop, as the kubelet would see
them (its own process and connection, so the bench's threads that start pods share no
interpreter lock with it). It calls through h2unary.py, the thin client: what it times
is the server's answer, not grpcio's own thread hand-offs.

    python -m hack.benchlib.probe SOCKET PERIOD CALL[,CALL...]

Prints "ready" once connected, then loops until its stdin closes and prints one JSON
line: {"samples": {call: [[monotonic start, seconds, waited], ...]}, "error": ...}.

`waited` is how long this client itself was runnable but waiting for a CPU during the
call (the kernel's run delay of its thread, /proc/thread-self/schedstat): while ten pods
start on two CPUs a client at the default priority can wait tens of milliseconds for its
turn after the answer has arrived, whatever the server. The bench reports the call's time
both as timed and without that wait (0 where the kernel keeps no schedstat).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from hack.benchlib.h2unary import CallError, H2Unary

SERVICE = "/runtime.v1.RuntimeService/"
# Empty requests: Version and both lists unfiltered serialize to no bytes.
CALLS = ("Version", "ListPodSandbox", "ListContainers")
SCHEDSTAT = "/proc/thread-self/schedstat"


class RunDelay:
    """The calling thread's total wait for a CPU so far, in seconds."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9


def main(argv: list[str]) -> int:
    socket, period, names = argv[0], float(argv[1]), argv[2].split(",")
    unknown = set(names) - set(CALLS)
    if unknown:
        raise SystemExit(f"probe: calls not known: {sorted(unknown)}")
    run_delay = RunDelay()  # opened by the thread that calls: thread-self is this one
    client = H2Unary(socket)
    client.call(SERVICE + "Version", b"")  # connected before timing
    samples: dict[str, list[list[float]]] = {n: [] for n in names}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    error = ""
    while not stop.is_set():
        for name in names:
            req = client.request(SERVICE + name, b"")
            w0 = run_delay()
            t0 = time.monotonic()
            try:
                client.exchange(req)
            except (CallError, OSError) as exc:
                error = f"{name}: {exc}"
                stop.set()
                break
            samples[name].append([t0, time.monotonic() - t0, run_delay() - w0])
        stop.wait(period)
    client.close()
    print(json.dumps({"samples": samples, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
