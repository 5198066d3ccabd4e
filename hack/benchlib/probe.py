"""A client in its own process that times cheap RPCs in a loop, as the kubelet would see
them (its own process and connection, so the bench's threads that start pods share no
interpreter lock with it). It calls through h2unary.py, the thin client: what it times
is the server's answer, not grpcio's own thread hand-offs.

    python -m hack.benchlib.probe SOCKET PERIOD CALL[,CALL...]

Prints "ready" once connected, then loops until its stdin closes and prints one JSON
line: {call: [[monotonic start, seconds], ...]}.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from hack.benchlib.h2unary import CallError, H2Unary

SERVICE = "/runtime.v1.RuntimeService/"
# Empty requests: Version and both lists unfiltered serialize to no bytes.
CALLS = ("Version", "ListPodSandbox", "ListContainers")


def main(argv: list[str]) -> int:
    socket, period, names = argv[0], float(argv[1]), argv[2].split(",")
    unknown = set(names) - set(CALLS)
    if unknown:
        raise SystemExit(f"probe: calls not known: {sorted(unknown)}")
    client = H2Unary(socket)
    client.call(SERVICE + "Version", b"")  # connected before timing
    samples: dict[str, list[list[float]]] = {n: [] for n in names}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    error = ""
    while not stop.is_set():
        for name in names:
            t0 = time.monotonic()
            try:
                client.call(SERVICE + name, b"")
            except (CallError, OSError) as exc:
                error = f"{name}: {exc}"
                stop.set()
                break
            samples[name].append([t0, time.monotonic() - t0])
        stop.wait(period)
    client.close()
    print(json.dumps({"samples": samples, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
