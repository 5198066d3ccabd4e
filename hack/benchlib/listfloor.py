"""The floor of a relist in Python's gRPC: a server that does nothing but send bytes.

crishim answers ListPodSandbox and ListContainers with a reply serialized once per change
(crishim/cri/listreply.py), so what is left of those calls is the delivery by grpcio
and the client's own share. This server, in its own process, answers the same two
methods with the very bytes crishim sent, through the same grpcio aio server; the bench
times it with the kubelet's tick, as it times the runtimes.

    python -m hack.benchlib.listfloor SOCKET REPLIES_DIR

REPLIES_DIR holds ListPodSandbox.bin and ListContainers.bin. Prints "ready" once serving
and stops when its stdin closes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, cast

import grpc

SERVICE = "runtime.v1.RuntimeService"
METHODS = ("ListPodSandbox", "ListContainers")


def _identity(b: bytes) -> bytes:
    return b


async def serve(socket: str, replies: dict[str, bytes]) -> None:
    def handler(reply: bytes) -> grpc.RpcMethodHandler[Any, Any]:
        async def answer(request: bytes, context: Any) -> bytes:
            return reply
        return grpc.unary_unary_rpc_method_handler(answer, request_deserializer=_identity,
                                                   response_serializer=_identity)

    handlers = {m: handler(replies[m]) for m in METHODS}
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    cast(Any, server).add_registered_method_handlers(SERVICE, handlers)
    server.add_insecure_port("unix:" + socket)
    await server.start()
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
