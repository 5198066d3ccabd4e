"""A client in its own process that times cheap RPCs in a loop, as the kubelet would see
them (its own process and connection, so the bench's threads that start pods share no
interpreter lock with it).

    python -m hack.benchlib.probe SOCKET PERIOD CALL[,CALL...]

Prints "ready" once connected, then loops until its stdin closes and prints one JSON
line: {call: [[monotonic start, seconds], ...]}.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc as pbg

TIMEOUT = 120.0


def calls(rt: pbg.RuntimeServiceStub) -> dict[str, Callable[[], Any]]:
    return {
        "Version": lambda: rt.Version(pb.VersionRequest(), timeout=TIMEOUT),
        "ListPodSandbox": lambda: rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                    timeout=TIMEOUT),
        "ListContainers": lambda: rt.ListContainers(pb.ListContainersRequest(),
                                                    timeout=TIMEOUT),
    }


def main(argv: list[str]) -> int:
    socket, period, names = argv[0], float(argv[1]), argv[2].split(",")
    channel = grpc.insecure_channel("unix://" + socket, options=[
        ("grpc.max_receive_message_length", 16 * 1024 * 1024)])
    rt = pbg.RuntimeServiceStub(channel)
    rt.Version(pb.VersionRequest(), timeout=30)  # connected before timing
    table = calls(rt)
    samples: dict[str, list[list[float]]] = {n: [] for n in names}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    error = ""
    while not stop.is_set():
        for name in names:
            t0 = time.monotonic()
            try:
                table[name]()
            except grpc.RpcError as exc:
                error = f"{name}: {exc.code().name}: {exc.details()}"
                stop.set()
                break
            samples[name].append([t0, time.monotonic() - t0])
        stop.wait(period)
    channel.close()
    print(json.dumps({"samples": samples, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
