"""gRPC servers whose handlers receive the request as raw bytes and parse it themselves.

Why: grpcio's Python server (1.85.3) leaks about 19 KB for every request whose message its own deserializer
fails on (one byte b"\\xff" suffices; a minimal server with no project code leaks too), so any client that can
reach a port could grow the daemon until the kernel kills it. Handlers registered here get `bytes`
(request_deserializer=None, which grpcio passes through untouched), parse them with the generated message
class and answer INVALID_ARGUMENT when that fails: no leak (docs/hardening.md §1 has the measurement).

Every server of the daemon is built with `new_server` (bounded workers and concurrent RPCs: more calls than
that are answered RESOURCE_EXHAUSTED instead of queueing without bound) and gets its services with
`add_servicer`, which takes the methods from the proto's service descriptor: a servicer written for the
generated `add_XServicer_to_server` works unchanged (it receives parsed messages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

# Room for kubelet's largest prepare (thousands of claims) on the DRA socket; gRPC's default receive limit.
DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024


def new_server(name: str, max_workers: int, max_concurrent_rpcs: int,
               max_receive_message_length: int = DEFAULT_MAX_MESSAGE) -> grpc.Server:
    """A server with `max_workers` threads that admits at most `max_concurrent_rpcs` calls at once."""
    if max_concurrent_rpcs < max_workers:
        raise ValueError(f"max_concurrent_rpcs {max_concurrent_rpcs} < max_workers {max_workers}: "
                         "workers would never be used")
    return grpc.server(ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name),
                       maximum_concurrent_rpcs=max_concurrent_rpcs,
                       options=[("grpc.max_receive_message_length", max_receive_message_length),
                                ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE)])


def message_class(descriptor: Descriptor) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def _abort_invalid(context: grpc.ServicerContext, request_type: type[Message], why: str) -> NoReturn:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  f"cannot decode the request as {request_type.DESCRIPTOR.full_name}: {why[:200]}")
    raise AssertionError("context.abort returned")  # it raises; this line keeps type checkers honest


def parse(request_type: type[Message], data: Any, context: grpc.ServicerContext) -> Message:
    """The request message from the wire bytes, or INVALID_ARGUMENT for the caller."""
    if not isinstance(data, bytes):
        _abort_invalid(context, request_type, f"expected bytes, got {type(data).__name__}")
    try:
        return request_type.FromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:  # RuntimeError: recursion limit of nested messages
        _abort_invalid(context, request_type, str(e) or type(e).__name__)


def _unary(request_type: type[Message], behaviour: Callable[[Any, grpc.ServicerContext], Message]
           ) -> Callable[[bytes, grpc.ServicerContext], Message]:
    def handle(data: bytes, context: grpc.ServicerContext) -> Message:
        return behaviour(parse(request_type, data, context), context)

    return handle


def _streaming(request_type: type[Message], behaviour: Callable[[Any, grpc.ServicerContext], Iterator[Message]]
               ) -> Callable[[bytes, grpc.ServicerContext], Iterator[Message]]:
    def handle(data: bytes, context: grpc.ServicerContext) -> Iterator[Message]:
        request = parse(request_type, data, context)
        yield from behaviour(request, context)

    return handle


def _serialize(message: Message) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def method_handler(method: MethodDescriptor, behaviour: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """A raw-bytes handler of one unary or server-streaming method (the kinds the kubelet protocols use)."""
    if method.client_streaming:
        raise ValueError(f"{method.full_name}: client-streaming methods are not supported")
    request_type = message_class(method.input_type)
    if method.server_streaming:
        return grpc.unary_stream_rpc_method_handler(_streaming(request_type, behaviour), request_deserializer=None,
                                                    response_serializer=_serialize)
    return grpc.unary_unary_rpc_method_handler(_unary(request_type, behaviour), request_deserializer=None,
                                               response_serializer=_serialize)


def service_handler(service: ServiceDescriptor, servicer: object) -> grpc.GenericRpcHandler:
    """Raw-bytes handlers for every method of `service`, calling the servicer's method of the same name."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        behaviour = getattr(servicer, method.name, None)
        if behaviour is None:
            raise TypeError(f"{type(servicer).__name__} lacks {method.name} of {service.full_name}")
        handlers[method.name] = method_handler(method, behaviour)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def add_servicer(server: grpc.Server, service: ServiceDescriptor, servicer: object) -> None:
    """Serve `servicer` as `service` (e.g. dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]) with raw handlers."""
    server.add_generic_rpc_handlers((service_handler(service, servicer),))


def method_paths(service: ServiceDescriptor) -> list[str]:
    """The wire paths of a service's methods (for fuzzing and tests)."""
    return [f"/{service.full_name}/{m.name}" for m in service.methods]
