"""Structured logs: one JSON object per line on stderr (stdlib logging, no extra dependency).

Fields passed as `extra={...}` become keys of the object, e.g.
`log.info("prepared claim", extra={"claim": "ns/name (uid)", "seconds": 0.002})`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    # One encoder for every line (json.dumps with `default` builds a new one per call), the same bytes.
    _encode = json.JSONEncoder(default=str).encode

    def __init__(self) -> None:
        super().__init__()
        self._stamp = (-1, "")  # (whole second, its text): one strftime per second, not per line

    def format(self, record: logging.LogRecord) -> str:
        # The timestamp as datetime's isoformat(timespec="milliseconds") in UTC writes it, built without datetime
        # (a log line per claim: its cost is part of every prepare and unprepare, bench/profile_prepare.py).
        second, stamp = self._stamp  # one tuple: threads racing here each see a matching pair
        if int(record.created) != second:
            second = int(record.created)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._stamp = (second, stamp)
        out: dict[str, Any] = {
            "ts": f"{stamp}.{int(record.msecs):03d}+00:00",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key[0] != "_":
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return self._encode(out)


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Route the root logger to JSON lines on `stream` (stderr by default). The record attributes the lines never
    show (the caller's file and line, thread and process names) are not collected: the stdlib's own switches
    for it (docs.python.org, Logging HOWTO, "Optimization")."""
    logging._srcfile = None  # no stack walk per record (findCaller)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
