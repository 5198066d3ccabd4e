"""The floor of a relist: crishim's gRPC server (crishim/rpc) doing nothing but send bytes.

crishim answers ListPodSandbox and ListContainers with a reply serialized once per change
(crishim/cri/listreply.py), so what is left of those calls is their delivery and the
client's own share. This server, in its own process, answers the same two methods with
the very bytes crishim sent, through the same server code; the bench times it with the
kubelet's tick, as it times the runtimes.

    python -m hack.benchlib.listfloor SOCKET REPLIES_DIR

REPLIES_DIR holds ListPodSandbox.bin and ListContainers.bin. Prints "ready" once serving
and stops when its stdin closes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from crishim.rpc.connection import Context, Method
from crishim.rpc.server import Server

SERVICE = "runtime.v1.RuntimeService"
METHODS = ("ListPodSandbox", "ListContainers")
MAX_MESSAGE = 16 * 1024 * 1024


def _identity(b: bytes) -> bytes:
    return b


async def serve(socket: str, replies: dict[str, bytes]) -> None:
    def method(reply: bytes) -> Method:
        async def handler(request: Any, context: Context) -> bytes:
            return reply
        # Answered where the request is read, as crishim's lists are.
        return Method(_identity, _identity, handler, False, lambda request: reply)

    server = Server({f"/{SERVICE}/{m}": method(replies[m]) for m in METHODS}, MAX_MESSAGE)
    await server.start(socket)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(grace=1)


def main(argv: list[str]) -> int:
    socket, folder = argv
    replies = {}
    for m in METHODS:
        with open(os.path.join(folder, f"{m}.bin"), "rb") as fh:
            replies[m] = fh.read()
    asyncio.run(serve(socket, replies))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
