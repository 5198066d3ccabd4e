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
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from crishim.rpc.method import Context, Method
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


@contextlib.contextmanager
def running(folder: str, replies: Mapping[str, bytes]) -> Iterator[str]:
    """This server in a process of its own, answering each of METHODS with its reply
    (written to `folder`); yields the socket's path, and stops the server after."""
    for m in METHODS:
        with open(os.path.join(folder, f"{m}.bin"), "wb") as fh:
            fh.write(replies[m])
    sock = os.path.join(folder, "floor.sock")
    # The repository root, as runtimes.REPO_ROOT has it: not imported from there, so
    # that the server's process loads no more than crishim/rpc.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", __spec__.name, sock, folder],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the list floor server did not start")
        yield sock
    finally:
        proc.communicate(input="", timeout=30)


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
