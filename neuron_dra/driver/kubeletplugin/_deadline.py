"""An overall deadline for an API request, enforced on every socket operation of its TLS connection.

A socket's timeout bounds each read, not the request: an answer trickling in a byte every few
seconds, or endless `100 Continue`s, never trips them. Here the SSLContext's socket class
(`SSLContext.sslsocket_class`) gives each handshake, send and receive only the time left until the deadline of
this thread's request (a context variable the API client sets around it); past it the operation raises
DeadlineExceeded, not an OSError, so the API client neither retries it nor keeps the connection.
"""

from __future__ import annotations

import contextvars
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class DeadlineExceeded(Exception):
    """The request's deadline passed while it waited on the connection (not an OSError: never retried)."""


@dataclass(frozen=True)
class Deadline:
    """When the request must be over (time.monotonic), its length, and the longest wait for one operation."""

    at: float
    seconds: float
    per_operation: float

    @classmethod
    def after(cls, seconds: float, per_operation: float | None = None) -> Deadline:
        return cls(time.monotonic() + seconds, seconds, seconds if per_operation is None else per_operation)

    def left(self) -> float:
        return self.at - time.monotonic()


_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("neuron_dra_api_deadline", default=None)


@contextmanager
def applied(deadline: Deadline) -> Iterator[None]:
    """Socket operations of this thread within the block wait at most until `deadline`."""
    token = _current.set(deadline)
    try:
        yield
    finally:
        _current.reset(token)


class DeadlineSSLSocket(ssl.SSLSocket):
    """An SSLSocket whose blocking operations end at the current deadline (outside a deadline: as configured)."""

    def _bound(self) -> Deadline | None:
        deadline = _current.get()
        if deadline is not None:
            left = deadline.left()
            if left <= 0:
                raise DeadlineExceeded(f"the request deadline of {deadline.seconds:g} s passed")
            self.settimeout(min(left, deadline.per_operation))
        return deadline

    def _timed_out(self, deadline: Deadline | None, error: TimeoutError) -> Exception:
        if deadline is not None and deadline.left() <= 0:
            return DeadlineExceeded(f"the request deadline of {deadline.seconds:g} s passed")
        return error

    def do_handshake(self, block: bool = False) -> None:
        deadline = self._bound()
        try:
            super().do_handshake(block)
        except TimeoutError as e:
            raise self._timed_out(deadline, e) from e

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        deadline = self._bound()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError as e:
            raise self._timed_out(deadline, e) from e

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        deadline = self._bound()
        try:
            return super().recv(buflen, flags)
        except TimeoutError as e:
            raise self._timed_out(deadline, e) from e

    def send(self, data: Any, flags: int = 0) -> int:
        deadline = self._bound()
        try:
            return super().send(data, flags)
        except TimeoutError as e:
            raise self._timed_out(deadline, e) from e
