"""The daemon's gRPC servers (docs/grpc-server.md), with raw-bytes handlers: grpcio's asyncio server (`Server`) for
the registration socket and the health port, its synchronous one (`ThreadedServer`) for the DRA socket.

- Methods have no deserializer: the handler parses the bytes and answers INVALID_ARGUMENT naming the message
  type when they do not decode (grpcio's deserializer path leaks memory per rejected request; hardening.md §1).
- `Server`: a handler runs only once its request has arrived (awaited in the event loop), so calls whose bodies
  never come or whose answers cannot be sent hold no thread. Blocking handlers run in the server's pool, at most
  `max_concurrent` at once (beyond: RESOURCE_EXHAUSTED, kubelet retries); `inline` ones and coroutines in the loop,
  at most `max_inline` at once when set (a coroutine awaiting something holds its call: the health checks).
- The daemon's servers share one event loop thread (`EventLoopThread`), each with its own pool and limits: grpc.aio's
  poller wakes every bound loop for every completion, so each extra loop costs CPU and a hand-off per call.
- `ThreadedServer`: every call on a pool thread from its HEADERS on, which answers it itself: one thread hand-off per
  call instead of three, for the socket that only kubelet reaches and whose calls all block.
- HTTP/2 and connection limits are grpc's channel options (`Limits`), the same for both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

log = logging.getLogger(__name__)

StatusCode = grpc.StatusCode
SOCKET_UMASK = 0o177  # what grpc's bind creates: the socket file is never more than 0600, not even briefly
_END = object()
INLINE_THREADS = 4  # ThreadedServer: threads for inline calls beside the blocking ones


class RpcError(Exception):
    """A call's outcome other than OK: raised by `CallContext.abort`, and by `call_on` for the answer."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CallContext:
    """What a handler knows about its call (safe from any thread): the deadline, whether the caller is still
    there, and callbacks run once when the call ends for any reason (answered, cancelled, connection lost)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline  # time.monotonic(); None: no deadline
        self._lock = threading.Lock()
        self._over = False
        self._callbacks: list[Callable[[], object]] = []

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def is_active(self) -> bool:
        return not self._over and (self.deadline is None or time.monotonic() < self.deadline)

    def add_callback(self, fn: Callable[[], object]) -> bool:
        """Run `fn` when the call ends; False (and `fn` not kept) when it has ended already."""
        with self._lock:
            if self._over:
                return False
            self._callbacks.append(fn)
            return True

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise RpcError(code, details)

    def end(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # one failing callback must not stop the others
                log.exception("call end callback failed")


def parse(request_type: type[Message], data: bytes) -> Message:
    """The request message from the wire bytes, or RpcError INVALID_ARGUMENT naming the type."""
    try:
        return request_type.FromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:  # RuntimeError: recursion limit of nested messages
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"cannot decode the request as "
                       f"{request_type.DESCRIPTOR.full_name}: {(str(e) or type(e).__name__)[:200]}") from None


def message_class(descriptor: Descriptor) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


@dataclass(frozen=True)
class Method:
    """One unary or server-streaming method: `behaviour(request, context)` returns the response message (unary)
    or an iterator of them (streaming); a coroutine function runs in the event loop, a plain function in the
    pool unless `inline(request)` says it is cheap enough for the loop."""

    request_type: type[Message]
    behaviour: Callable[[Any, CallContext], Any]
    streaming: bool
    inline: Callable[[Any], bool] | None = None


def service_methods(service: ServiceDescriptor, servicer: object,
                    inline: Mapping[str, Callable[[Any], bool]] | None = None) -> dict[str, Method]:
    """Wire path -> Method for every method of `service`, calling the servicer's method of the same name;
    `inline`: method name -> which of its requests run in the event loop."""
    methods: dict[str, Method] = {}
    for m in service.methods:
        if m.client_streaming:
            raise ValueError(f"{m.full_name}: client-streaming methods are not supported")
        behaviour = getattr(servicer, m.name, None)
        if behaviour is None:
            raise TypeError(f"{type(servicer).__name__} lacks {m.name} of {service.full_name}")
        methods[f"/{service.full_name}/{m.name}"] = Method(message_class(m.input_type), behaviour,
                                                           m.server_streaming, (inline or {}).get(m.name))
    return methods


def method_paths(service: ServiceDescriptor) -> list[str]:
    """The wire paths of a service's methods (for fuzzing and tests)."""
    return [f"/{service.full_name}/{m.name}" for m in service.methods]


@dataclass(frozen=True)
class Limits:
    """A server's bounds, as grpc core's channel options (include/grpc/impl/channel_arg_names.h)."""

    max_concurrent: int  # blocking calls running at once (the pool's size); more: RESOURCE_EXHAUSTED
    max_message: int = 4 * 1024 * 1024  # request and response bytes (grpc's default receive limit)
    max_streams: int = 100  # per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
    max_connections: int = 128
    max_metadata: int = 16 * 1024  # header list bytes, hard limit (the soft one: 80 %)
    handshake_timeout_ms: int = 5_000  # until the client's preface and SETTINGS have arrived
    idle_ms: int = 5 * 60_000  # a connection without calls this long is closed (GOAWAY)
    age_ms: int | None = None  # a connection this old is closed after its calls (or the grace) end
    age_grace_ms: int = 5_000
    min_ping_interval_ms: int = 10_000  # pings without data more often than this are strikes
    max_ping_strikes: int = 2  # then GOAWAY ENHANCE_YOUR_CALM
    max_inline: int | None = None  # calls in the event loop at once (coroutines, inline); more: RESOURCE_EXHAUSTED

    def options(self) -> list[tuple[str, int]]:
        opts = [
            ("grpc.max_receive_message_length", self.max_message),
            ("grpc.max_send_message_length", self.max_message),
            ("grpc.max_concurrent_streams", self.max_streams),
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.absolute_max_metadata_size", self.max_metadata),
            ("grpc.max_metadata_size", self.max_metadata * 4 // 5),
            ("grpc.server_handshake_timeout_ms", self.handshake_timeout_ms),
            ("grpc.max_connection_idle_ms", self.idle_ms),
            ("grpc.http2.min_ping_interval_without_data_ms", self.min_ping_interval_ms),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
            ("grpc.so_reuseport", 0),  # a second daemon on the same port fails instead of sharing it
        ]
        if self.age_ms is not None:
            opts += [("grpc.max_connection_age_ms", self.age_ms), ("grpc.max_connection_age_grace_ms",
                                                                   self.age_grace_ms)]
        return opts


class _Handlers(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpcio has no type hints
    def __init__(self, server: Server) -> None:
        self._server = server
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add(self, path: str, method: Method) -> None:
        s = self._server  # grpc.aio tells coroutine and async generator handlers apart by their functions

        async def unary(raw: bytes, ctx: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await s._unary(method, raw, ctx)

        async def stream(raw: bytes, ctx: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
            async for item in s._stream(method, raw, ctx):
                yield item

        self._handlers[path] = (grpc.unary_stream_rpc_method_handler(stream) if method.streaming
                                else grpc.unary_unary_rpc_method_handler(unary))

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)


def _context(ctx: grpc.aio.ServicerContext[Any, Any]) -> CallContext:
    remaining = ctx.time_remaining()
    call = CallContext(None if remaining is None else time.monotonic() + remaining)
    ctx.add_done_callback(lambda _: call.end())
    return call


def _close_after(pending: concurrent.futures.Future[Any] | None, gen: Generator[Any, None, None]) -> None:
    if pending is not None:
        concurrent.futures.wait([pending])
    gen.close()  # runs the generator's cleanup (its `finally`) in this worker thread


class _Threads:
    """At most `size` daemon threads, each started when work finds none idle (as ThreadPoolExecutor does) and kept.
    Daemon threads, unlike ThreadPoolExecutor's: a handler still running when the daemon stops (a prepare waiting
    on the API server, an unprepare on the other instance's lock) must not hold the interpreter's exit, which joins
    a pool's threads. Subclasses say how one item runs (`_run`) and is skipped once shut down (`_skip`)."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0
        self._closed = False

    def _put(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: shut down")
            self._queue.put(item)
            if not self._idle.acquire(blocking=False) and self._threads < self._size:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}_{self._threads - 1}", daemon=True).start()

    def _close(self) -> None:
        """Threads end once their item does; items not started are skipped now, not when a thread frees up."""
        with self._lock:
            self._closed = True
            waiting = []
            with contextlib.suppress(queue.Empty):
                while True:
                    waiting.append(self._queue.get_nowait())
            for _ in range(self._threads):
                self._queue.put(None)
        for item in waiting:
            if item is not None:
                self._skip(item)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._closed:
                self._skip(item)
            else:
                self._run(item)
            del item  # nothing of a finished item stays referenced by an idle thread
            self._idle.release()

    def _run(self, item: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def _skip(self, item: tuple[Any, ...]) -> None:
        raise NotImplementedError


class _Workers(_Threads):
    """The threads a Server runs its blocking unary handlers in. A handler's outcome goes straight to the loop's
    future with one call_soon_threadsafe; a concurrent.futures Future, its condition and callback chain cost about
    twice the CPU per call (docs/benchmarks.md §1). `done` runs in the worker when the handler ends (or is skipped:
    its call was cancelled before a thread took it, or the server stops)."""

    def submit(self, loop: asyncio.AbstractEventLoop, done: Callable[[], object], fn: Callable[..., Any],
               *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` in a worker; the future (of `loop`, created in it) gets its result or exception."""
        future: asyncio.Future[Any] = loop.create_future()
        self._put((loop, future, done, fn, args))
        return future

    def shutdown(self) -> None:
        """Workers end once their handler does; handlers not started are not run (their `done` still is)."""
        self._close()

    def _run(self, item: tuple[Any, ...]) -> None:
        loop, future, done, fn, args = item
        if future.cancelled():  # not started: the call is over
            self._skip(item)
            return
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the caller, as a pool's future would
            _settle_later(loop, done, future, error=e)
        else:
            _settle_later(loop, done, future, result)

    def _skip(self, item: tuple[Any, ...]) -> None:
        _settle_later(item[0], item[2])


class DaemonThreadPool(_Threads, concurrent.futures.Executor):
    """A concurrent.futures executor on daemon threads (see `_Threads`), for what wants real futures: grpcio's sync
    server (it chains its call bookkeeping on the future), a Server's streams, the helper's parallel claim lookups."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Never waits (the threads are the daemon's to abandon); work not started is cancelled."""
        self._close()

    def _run(self, item: tuple[Any, ...]) -> None:
        future, fn, args, kwargs = item
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            future.set_exception(e)
        else:
            future.set_result(result)

    def _skip(self, item: tuple[Any, ...]) -> None:
        item[0].cancel()


def _settle_later(loop: asyncio.AbstractEventLoop, done: Callable[[], object],
                  future: asyncio.Future[Any] | None = None, result: Any = None,
                  error: BaseException | None = None) -> None:
    done()
    if future is None:
        return
    with contextlib.suppress(RuntimeError):  # the loop is closed: the process is stopping
        loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class EventLoopThread:
    """An asyncio event loop running on its own daemon thread, for the Servers given it. Whoever created it closes
    it, after stopping those servers."""

    def __init__(self, name: str = "grpc-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop and wait for its thread; a second call does nothing. The loop object is not closed:
        grpc.aio's poller keeps every loop it was bound to and may still hand it a late completion."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


class _Listening:
    """What both kinds of server share: where they listen, and services added from their descriptors."""

    _server: Any  # grpc.aio.Server or grpc.Server: add_insecure_port is the same

    def add_methods(self, methods: Mapping[str, Method]) -> None:
        raise NotImplementedError

    def add_service(self, service: ServiceDescriptor, servicer: object) -> None:
        self.add_methods(service_methods(service, servicer))

    def _listen(self, target: str, where: str) -> int:
        try:  # grpc raises RuntimeError for an address it cannot bind (never returns port 0)
            return int(self._server.add_insecure_port(target))
        except RuntimeError as e:
            raise OSError(f"cannot listen on {where}: {e}") from e

    def add_unix(self, path: Path) -> None:
        """Listen at `path` (bound now; calls wait until `start`), the socket file mode 0600 from its creation."""
        old = os.umask(SOCKET_UMASK)  # process-wide: files other threads create meanwhile get less access, not more
        try:
            self._listen(f"unix:{path}", str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)


def _failure(server: str, e: Exception) -> tuple[grpc.StatusCode, str]:
    """The status a handler's exception ends its call with: an RpcError's own, INTERNAL (logged) for any other."""
    if isinstance(e, RpcError):
        return e.code, e.details
    log.exception("gRPC handler failed", extra={"server": server, "error": str(e)})
    return StatusCode.INTERNAL, f"internal error: {type(e).__name__}"


class Server(_Listening):
    """One grpc.aio server with its own pool, in the event loop given (shared with other servers) or else in one of
    its own, ended by `stop`; methods are added before `start`."""

    def __init__(self, name: str, limits: Limits, loop: EventLoopThread | None = None) -> None:
        self.name = name
        self.limits = limits
        self.active_calls = 0  # blocking calls admitted to the pool and not finished
        self.inline_calls = 0  # calls handled in the event loop and not finished (only the loop counts them)
        self._count_lock = threading.Lock()
        self._pool = DaemonThreadPool(limits.max_concurrent, f"{name}-stream")
        self._workers = _Workers(limits.max_concurrent, f"{name}-call")  # unary calls
        self._own_loop: EventLoopThread | None = None
        if loop is None:
            loop = self._own_loop = EventLoopThread(f"{name}-grpc")
        self._loop = loop.loop
        self._handlers = _Handlers(self)
        self._server: grpc.aio.Server = self.run(self._make())
        self._stopped = False

    async def _make(self) -> grpc.aio.Server:
        server = grpc.aio.server(options=self.limits.options())
        server.add_generic_rpc_handlers([self._handlers])
        return server

    def run(self, coro: Awaitable[Any], timeout: float | None = 30.0) -> Any:
        """Run `coro` in the event loop and return its result (from another thread: in the loop's own it would
        wait for itself)."""
        if _running_loop() is self._loop:
            raise RuntimeError(f"{self.name}: Server.run called from its event loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)  # type: ignore[arg-type]

    def add_methods(self, methods: Mapping[str, Method]) -> None:
        for path, method in methods.items():
            self._handlers.add(path, method)

    def add_abstract(self, name: str) -> None:
        """Listen on the abstract unix socket `name` (Linux: no file; reachable from this network namespace)."""
        self._listen(f"unix-abstract:{name}", f"the abstract socket {name}")

    def add_tcp(self, address: str, port: int) -> int:
        """Listen on address:port (0: any free port); returns the port."""
        host = f"[{address}]" if ":" in address else address
        return self._listen(f"{host}:{port}", f"{host}:{port}")

    def start(self) -> None:
        self.run(self._server.start())

    def stop(self, grace: float = 5.0) -> None:
        """Refuse new calls, give running ones `grace` seconds, then cancel them; ends the loop thread only when it
        is the server's own (a shared one runs on for the others)."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            self.run(self._server.stop(grace), timeout=grace + 10)
        if self._own_loop is not None:
            self._own_loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._workers.shutdown()

    # --- per call, in the event loop --------------------------------------------------------------------

    def _admit(self) -> None:
        with self._count_lock:
            if self.active_calls >= self.limits.max_concurrent:
                raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"{self.name}: {self.limits.max_concurrent} calls "
                                                              "are running already; retry")
            self.active_calls += 1

    def _admit_inline(self) -> None:
        limit = self.limits.max_inline
        if limit is not None and self.inline_calls >= limit:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"{self.name}: {limit} calls are being handled already; "
                                                          "retry")
        self.inline_calls += 1

    def _release(self, _: object = None) -> None:
        with self._count_lock:
            self.active_calls -= 1

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        # Released when the work ends, not when the call does: a cancelled call's handler may still be running.
        self._admit()
        try:
            work = self._workers.submit(self._loop, self._release, fn, *args)
        except BaseException:
            self._release()
            raise
        try:
            return await work
        finally:
            del work  # a failure's traceback holds this frame, the future holds the failure: no cycle

    async def _unary(self, method: Method, raw: bytes, ctx: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        call = _context(ctx)
        request: Any = None
        try:
            request = parse(method.request_type, raw)
            if inspect.iscoroutinefunction(method.behaviour):
                self._admit_inline()
                try:
                    response = await method.behaviour(request, call)
                finally:
                    self.inline_calls -= 1
            elif method.inline is not None and method.inline(request):
                self._admit_inline()
                try:
                    response = method.behaviour(request, call)
                finally:
                    self.inline_calls -= 1
            else:
                response = await self._in_pool(method.behaviour, request, call)
            data: bytes = response.SerializeToString()
            return data
        except Exception as e:
            failure = _failure(self.name, e)
        # Aborted outside the handler: inside it, the abort's exception would chain the caught one, whose traceback
        # holds this frame (a cycle only the garbage collector frees, and with it the request: a large refused
        # call stayed in memory until it ran).
        request = None
        await ctx.abort(*failure)
        raise AssertionError("unreachable")  # abort raises

    async def _stream(self, method: Method, raw: bytes, ctx: grpc.aio.ServicerContext[Any, Any]
                      ) -> AsyncIterator[bytes]:
        call = _context(ctx)
        try:
            request = parse(method.request_type, raw)
            self._admit()  # one place for the stream's life
        except RpcError as e:
            refused: tuple[grpc.StatusCode, str] | None = (e.code, e.details)
        else:
            refused = None
        if refused is not None:  # aborted outside the handler (see _unary)
            await ctx.abort(*refused)
            raise AssertionError("unreachable")  # abort raises
        gen: Generator[Any, None, None] = method.behaviour(request, call)
        pending: concurrent.futures.Future[Any] | None = None
        try:
            while True:
                pending = self._pool.submit(next, gen, _END)
                item = await asyncio.wrap_future(pending)
                pending = None
                if item is _END:
                    return
                yield item.SerializeToString()
        except RpcError as e:
            await ctx.abort(e.code, e.details)
        except Exception as e:
            log.exception("gRPC stream handler failed", extra={"server": self.name, "error": str(e)})
            await ctx.abort(StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
        finally:
            self._release()
            call.end()  # the generator sees is_active() False and returns
            with contextlib.suppress(RuntimeError):  # the pool is shut down: the process is stopping
                self._pool.submit(_close_after, pending, gen)


class ThreadedServer(_Listening):
    """One grpcio synchronous server, for a socket whose every method blocks (the DRA socket): grpc core hands
    each call to a pool thread, which runs the handler and sends its answer itself, one thread hand-off per call
    where the event loop's servers take three (core to loop, loop to worker, worker to loop; docs/grpc-server.md).
    Blocking calls at most `max_concurrent` at once, `inline` ones beside them in INLINE_THREADS more threads;
    beyond either, RESOURCE_EXHAUSTED. A call whose request has not arrived holds its thread until the request
    does or the call ends: the socket's one peer is kubelet (the socket is root's, mode 0600)."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self.active_calls = 0
        self.inline_calls = 0
        self._count_lock = threading.Lock()
        threads = limits.max_concurrent + INLINE_THREADS
        self._pool = DaemonThreadPool(threads, name)
        self._methods: dict[str, Method] = {}
        self._server = grpc.server(self._pool, handlers=[_ThreadedHandlers(self)], options=limits.options(),
                                   maximum_concurrent_rpcs=threads)
        self._stopped = False

    def add_methods(self, methods: Mapping[str, Method]) -> None:
        self._methods.update(methods)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 5.0) -> None:
        """Refuse new calls, give running ones `grace` seconds, then cancel them."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace).wait(grace + 10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _admit(self, inline: bool) -> None:
        with self._count_lock:
            if inline:
                if self.inline_calls >= INLINE_THREADS:
                    raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"{self.name}: {INLINE_THREADS} calls are being "
                                                                  "handled already; retry")
                self.inline_calls += 1
            else:
                if self.active_calls >= self.limits.max_concurrent:
                    raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"{self.name}: {self.limits.max_concurrent} "
                                                                  "calls are running already; retry")
                self.active_calls += 1

    def _release(self, inline: bool) -> None:
        with self._count_lock:
            if inline:
                self.inline_calls -= 1
            else:
                self.active_calls -= 1

    def unary(self, method: Method, raw: bytes, ctx: grpc.ServicerContext) -> bytes:
        call = _threaded_context(ctx)  # ended by grpc once the answer is sent or the call is over
        request: Any = None
        try:
            request = parse(method.request_type, raw)
            inline = method.inline is not None and method.inline(request)
            self._admit(inline)
            try:
                response = method.behaviour(request, call)
            finally:
                self._release(inline)
            data: bytes = response.SerializeToString()
            return data
        except Exception as e:
            failure = _failure(self.name, e)
        request = None  # aborted outside the handler's except (see Server._unary)
        ctx.abort(*failure)
        raise AssertionError("unreachable")  # abort raises

    def stream(self, method: Method, raw: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
        call = _threaded_context(ctx)
        try:
            refused: tuple[grpc.StatusCode, str] | None = None
            try:
                request = parse(method.request_type, raw)
                self._admit(False)  # one place for the stream's life
            except RpcError as e:
                refused = (e.code, e.details)
            if refused is not None:
                ctx.abort(*refused)
            try:
                failure: tuple[grpc.StatusCode, str] | None = None
                gen: Generator[Any, None, None] = method.behaviour(request, call)
                try:
                    for item in gen:
                        yield item.SerializeToString()
                except RpcError as e:
                    failure = (e.code, e.details)
                except Exception as e:
                    log.exception("gRPC stream handler failed", extra={"server": self.name, "error": str(e)})
                    failure = (StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
                finally:
                    call.end()  # the generator sees is_active() False and returns
                    gen.close()
                if failure is not None:
                    ctx.abort(*failure)
            finally:
                self._release(False)
        finally:
            call.end()


class _ThreadedHandlers(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpcio has no type hints
    def __init__(self, server: ThreadedServer) -> None:
        self._server = server
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is None:
            method = self._server._methods.get(path)
            if method is None:
                return None
            s = self._server
            handler = (grpc.unary_stream_rpc_method_handler(lambda raw, ctx: s.stream(method, raw, ctx))
                       if method.streaming else
                       grpc.unary_unary_rpc_method_handler(lambda raw, ctx: s.unary(method, raw, ctx)))
            self._handlers[path] = handler
        return handler


_NO_DEADLINE = 1e8  # seconds: grpcio's time_remaining() without a deadline is its infinite future


def _threaded_context(ctx: grpc.ServicerContext) -> CallContext:
    remaining = ctx.time_remaining()
    call = CallContext(None if remaining is None or remaining > _NO_DEADLINE else time.monotonic() + remaining)
    if not ctx.add_callback(call.end):
        call.end()
    return call


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def channel(target: str, max_response: int = 1024 * 1024) -> grpc.aio.Channel:
    """A channel of its own (no connection shared with other channels), without retries, for the running event
    loop. `target`: a grpc target (unix:PATH, HOST:PORT)."""
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0),
               ("grpc.max_receive_message_length", max_response)]
    return grpc.aio.insecure_channel(target, options=options)


async def call_on(chan: grpc.aio.Channel, path: str, request: bytes, timeout: float) -> bytes:
    """One unary call on `chan`; RpcError with the status when it is not OK."""
    try:
        answer: bytes = await chan.unary_unary(path)(request, timeout=timeout)
        return answer
    except grpc.aio.AioRpcError as e:
        raise RpcError(e.code(), e.details() or "") from e

