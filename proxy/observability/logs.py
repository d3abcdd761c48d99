"""Structured logging: one JSON object per line, never message text or credentials.

Call sites pass facts through `extra={...}`; the formatter writes them as fields.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

import orjson

from proxy.config import Logging

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
# The innermost frames of a failure: a recursion's thousand say no more than its last.
MAX_FRAMES = 40


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD:
                event[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            event["error"] = record.exc_info[0].__name__
        return orjson.dumps(event, default=str).decode()


def failure(exc: BaseException) -> dict[str, Any]:
    """The fields that say where `exc` was raised: its class, and the file, line and function
    of each of its frames, innermost last. Never its message nor its frames' locals: either
    may hold a request's content."""
    walked = list(traceback.walk_tb(exc.__traceback__))[-MAX_FRAMES:]
    frames = [f"{f.f_code.co_filename}:{line} {f.f_code.co_qualname}" for f, line in walked]
    return {"error": type(exc).__name__, "frames": frames}


def configure(settings: Logging) -> None:
    # Neither format shows where a line was logged from, nor its thread or process: skip
    # finding them for every record (the optimisations of the logging HOWTO), a tenth of a
    # small request's work otherwise.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("compaction_proxy")
    logger.handlers[:] = [handler]
    logger.setLevel(settings.level.upper())
    logger.propagate = False
