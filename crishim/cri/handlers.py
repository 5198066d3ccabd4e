"""A servicer's RPCs for the gRPC server, from the service's descriptor.

As the generated add_*Servicer_to_server, except for the reply serializer: a handler may
return bytes it serialized earlier (cri/listreply.py), which go out as they are. Both
servers take them: grpcio's (`add_service`) and crishim's own (`rpc_methods`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError, Message

from crishim.api.runtime.v1 import api_pb2
from crishim.cri.base import ServicerBase, Unparsed, counted
from crishim.rpc.method import Method

PACKAGE = "runtime.v1"


def serialize(reply: Message | bytes | bytearray) -> bytes | bytearray:
    """A reply message, or one serialized already (bytearray: cri/execreply.py)."""
    if isinstance(reply, (bytes, bytearray)):
        return reply
    return reply.SerializeToString()


def _as_bytes(reply: Message | bytes | bytearray) -> bytes:
    """`serialize` for grpcio, which takes bytes only."""
    data = serialize(reply)
    return data if isinstance(data, bytes) else bytes(data)


def parser(request: type[Message]) -> Callable[[bytes], Any]:
    """The request's deserializer for both servers: a message, or an `Unparsed` that its
    handler answers INTERNAL (a deserializer that raised would be a traceback and
    UNKNOWN under grpcio)."""
    parse, name = request.FromString, request.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            # protobuf's text repeats the type ("Error parsing message with type 'X': why").
            why = str(exc).rpartition("': ")[2] or "not a valid message"
            return Unparsed(f"cannot parse the request as {name}: {why[:1].lower()}{why[1:]}")

    return deserialize


def rpc_methods(service: str, servicer: ServicerBase) -> dict[str, Method]:
    """The service's methods by path ("/runtime.v1.RuntimeService/Version")."""
    methods: dict[str, Method] = {}
    answers = servicer.answers()
    for method in api_pb2.DESCRIPTOR.services_by_name[service].methods:
        if method.client_streaming:
            raise TypeError(f"{service}.{method.name}: client streaming is not served")
        request = getattr(api_pb2, method.input_type.name)
        answer = answers.get(method.name)
        methods[f"/{PACKAGE}.{service}/{method.name}"] = Method(
            parser(request), serialize, getattr(servicer, method.name),
            method.server_streaming,
            None if answer is None else counted(method.name, answer))
    return methods


def method_handlers(service: str, servicer: Any) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for path, m in rpc_methods(service, servicer).items():
        make = (grpc.unary_stream_rpc_method_handler if m.server_streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[path.rsplit("/", 1)[1]] = make(m.handler, request_deserializer=m.deserialize,
                                                response_serializer=_as_bytes)
    return handlers


def add_service(server: grpc.aio.Server, service: str, servicer: Any) -> None:
    handlers = method_handlers(service, servicer)
    name = f"{PACKAGE}.{service}"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    # Looked up by method path without the generic handler's per-call search (grpcio's
    # typing stubs lack this aio method that the generated code calls too).
    cast(Any, server).add_registered_method_handlers(name, handlers)
