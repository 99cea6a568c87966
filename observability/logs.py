"""Log records carrying the task they are about, printed once, as JSON lines or as readable text.

Where a record says which task it is about: either the caller passes ``extra={"task_id": …, "task_version": …,
"op_key": …}``, or the code around it is inside ``bound(task_id=…)`` (a Celery wake-up is bound to its task by
observability/apps.py), and ``ContextFilter`` copies what is bound onto every record. The formatters print those
fields when known and nothing otherwise.

The format is chosen by ``RECKON_LOG_FORMAT``: ``text`` (the default: ``./dev demo`` and a developer's terminal are read
by people) or ``json`` (one JSON object per line, for a log shipper). This module is loaded while settings are
configured: it imports nothing of Django's models.
"""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

CONTEXT_FIELDS = ("task_id", "task_version", "op_key")
_BOUND: ContextVar[dict[str, Any]] = ContextVar("reckon_log_context", default={})  # noqa: B039  (never mutated)


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Within the block, every record carries these fields (unless the call's ``extra`` names its own)."""
    token = _BOUND.set(_BOUND.get() | {k: v for k, v in fields.items() if v is not None})
    try:
        yield
    finally:
        _BOUND.reset(token)


def bind(**fields: Any) -> object:
    """As ``bound`` without a block, for a pair of signals (Celery's prerun and postrun); ``unbind`` with the
    returned token."""
    return _BOUND.set(_BOUND.get() | {k: v for k, v in fields.items() if v is not None})


def unbind(token: object) -> None:
    _BOUND.reset(token)  # type: ignore[arg-type]


class ContextFilter(logging.Filter):
    """Puts the bound task fields on the record; a field the call passed itself wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _BOUND.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the task fields when known, the
    process id, and the exception's traceback when there is one. A line never spans two lines."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
            "process": record.process,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``2026-12-01 03:55:46,123 INFO tasks.jobs: message [task_id=7 task_version=12 op_key=rk-…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = _context(record)
        if not context:
            return text
        first, newline, rest = text.partition("\n")
        tail = " ".join(f"{k}={v}" for k, v in context.items())
        return f"{first} [{tail}]{newline}{rest}"


def logging_config(*, log_format: str, level: str) -> dict[str, Any]:
    """settings.LOGGING. Every record is printed by the root's one handler, once: Django's own "django" logger
    (whose default handler prints under DEBUG, and which propagates to the root as well: the doubled lines of
    issue 11) and "django.server" get no handlers of their own here and propagate to the root instead."""
    if log_format not in ("text", "json"):
        raise ValueError(f"RECKON_LOG_FORMAT must be text or json, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"task_context": {"()": "observability.logs.ContextFilter"}},
        "formatters": {
            "text": {"()": "observability.logs.TextFormatter"},
            "json": {"()": "observability.logs.JsonFormatter"},
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["task_context"]},
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django": {"handlers": [], "level": level, "propagate": True},
            "django.server": {"handlers": [], "level": level, "propagate": True},
        },
    }
