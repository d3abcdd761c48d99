"""Structured logging: one JSON object per line, never message text or credentials.

Call sites pass facts through `extra={...}`; the formatter writes them as fields.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

from proxy.config import Logging

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


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
