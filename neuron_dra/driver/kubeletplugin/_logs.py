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
    def format(self, record: logging.LogRecord) -> str:
        # The timestamp as datetime's isoformat(timespec="milliseconds") in UTC writes it, built without datetime
        # (a log line per claim: its cost is part of every prepare and unprepare, bench/profile_prepare.py).
        out: dict[str, Any] = {
            "ts": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(record.created))}.{int(record.msecs):03d}+00:00",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


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
