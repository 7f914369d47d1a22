"""Structured logs for the worker, the router and the KV-tier sidecar: one JSON object per line.

A hand-written format string breaks on a quote in a message and spreads a traceback over many
lines; a formatter that builds a dict and ``json.dumps`` it cannot. The request id of the request
being handled (``REQUEST_ID``, set by the HTTP layer) goes on every line logged on its behalf, so
router, worker and sidecar lines of one request can be joined.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is logged.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class CurrentStderr(logging.StreamHandler[Any]):
    """Writes to ``sys.stderr`` as it is when a line is logged, not as it was at set-up: a
    handler bound to a stream that was later replaced and closed (a test's captured stderr, a
    redirected one) fails every line after, from every thread."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass  # StreamHandler.__init__ and setStream set it: always the current stderr instead


def setup(level: str) -> None:
    """JSON lines on stderr for the whole process, replacing any handler set before."""
    handler = CurrentStderr()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
