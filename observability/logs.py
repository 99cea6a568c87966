"""Log records carrying the task they are about, printed once, as JSON lines or as readable text.

Where a record says which task it is about: either the caller passes ``extra={"task_id": …, "task_version": …,
"op_key": …}``, or the code around it is inside ``bound(task_id=…)`` (a Celery wake-up is bound to its task by
observability/apps.py), and ``ContextFilter`` copies what is bound onto every record. The formatters print those
fields when known and nothing otherwise.

The format is chosen by ``RECKON_LOG_FORMAT``: ``text`` (the default: ``./dev demo`` and a developer's terminal are read
by people) or ``json`` (one JSON object per line, for a log shipper). This module is loaded while settings are
configured: it imports nothing of Django's models.

State changes are logged from the event log, not from the domain code: ``log_state_change`` observes the events
every change appends (tasks.engine.events.observe, once the change is written) and prints one line per event — an intent
registered (its op key), an outcome recorded (op key, outcome; the node advanced with it), the task's other changes —
with the task id, the version the change made and the op key as fields.
"""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.models import Event, Task

CONTEXT_FIELDS = ("task_id", "task_version", "op_key")
# What a state change's line says besides the task fields (JSON keys when present; in the text format they are in
# the message already).
DOMAIN_FIELDS = ("event", "outcome", "failure_class", "node", "node_status", "task_status", "op_keys", "refusal")
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
            **{name: getattr(record, name) for name in DOMAIN_FIELDS if getattr(record, name, None) is not None},
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
    (whose default handler prints under DEBUG, and which propagates to the root as well: every line
    printed twice) and "django.server" get no handlers of their own here and propagate to the root instead."""
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


# --- state changes, from the event log ----------------------------------------------------------------------------

STATE_LOGGER = "reckon.state"
# Commit 1 of a step (and of a compensation or a temp resource's delete): the operation registered, "may have been
# sent" from here on; its op key is what a reconciler asks the remote by.
INTENT_EVENTS = frozenset(
    {"operation_dispatched", "compensation_registered", "cleanup_registered", "cleanup_dispatched"}
)
# Commit 2: what the remote said (from the call, or from a query by op key), and the node it moved.
OUTCOME_EVENTS = frozenset(
    {
        "node_succeeded",
        "evidence_insufficient",
        "operation_accepted",
        "operation_rejected",
        "operation_unknown",
        "operation_unprovable",
        "operation_not_found",
        "operation_not_found_yet",
        "operation_fenced",
        "operation_refused_again",
        "operation_resolved_not_done",
        "operation_cancelled",
        "compensation_committed",
        "compensation_rejected",
        "cleanup_committed",
        "cleanup_not_found",
        "cleanup_fenced",
        "cleanup_unprovable",
        "cleanup_unknown",
        "cleanup_rejected",
        "cleanup_accepted",
    }
)
# The task's other changes: made by people, plans, verification.
OTHER_EVENTS = frozenset(
    {
        "task_created",
        "plan_proposed",
        "plan_accepted",
        "inputs_confirmed",
        "cancel_requested",
        "approval_proposed",
        "node_approved",
        "approval_executed",
        "takeover_requested",
        "takeover_granted",
        "takeover_result_submitted",
        "lease_forced_release",
        "receipts_contradicted",
        "quarantined",
        "temp_resource_reset",
        "cleanup_needs_person",
    }
)
STATE_EVENTS = INTENT_EVENTS | OUTCOME_EVENTS | OTHER_EVENTS


def state_change_line(
    *, task_id: int, version: int, event_type: str, payload: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The message and the fields of one event's line. Pure: what the event's payload says, nothing read."""
    operations: dict[str, dict[str, Any]] = payload.get("operations") or {}
    nodes: dict[str, dict[str, Any]] = payload.get("nodes") or {}
    data: dict[str, Any] = payload.get("data") or {}
    task_status = (payload.get("task") or {}).get("status")
    op_keys = list(operations) or ([data["op_key"]] if isinstance(data.get("op_key"), str) else [])
    op_key = op_keys[0] if len(op_keys) == 1 else None
    op = operations.get(op_key, {}) if op_key else {}
    node = next(iter(nodes), None) if len(nodes) == 1 else op.get("node") or data.get("node")
    node_status = nodes[node].get("status") if node in nodes else None
    fields: dict[str, Any] = {
        "task_id": task_id,
        "task_version": version,
        "op_key": op_key,
        "event": event_type,
        "outcome": op.get("status") if event_type in OUTCOME_EVENTS else None,
        "failure_class": op.get("failure_class") or None,
        "node": node,
        "node_status": node_status,
        "task_status": task_status,
        "op_keys": op_keys if len(op_keys) > 1 else None,
    }
    if event_type == "cleanup_dispatched":  # a temp resource's delete: registered, then marked sent on its own
        message = f"intent marked sent: {op_key or ', '.join(op_keys)}"
    elif event_type in INTENT_EVENTS:
        message = f"intent registered: {op_key or ', '.join(op_keys)}" + (f" for node {node}" if node else "")
    elif event_type in OUTCOME_EVENTS:
        message = f"outcome recorded: {op_key or ', '.join(op_keys)} {fields['outcome'] or event_type}"
        if fields["failure_class"]:
            message += f" ({fields['failure_class']})"
        if node and node_status:
            message += f"; node advanced: {node} {node_status}"
    else:
        message = f"task changed: {event_type}"
    if task_status:
        message += f"; task {task_status}"
    return message, {k: v for k, v in fields.items() if v is not None}


def _follow(task_id: int, version: int) -> None:
    """The bound task version moves with the bound task's changes. Only where a wake-up bound this task (Celery's
    prerun; its postrun resets the binding, so nothing outlives the job); a request thread binds nothing and is left
    alone."""
    fields = _BOUND.get()
    if fields.get("task_id") == task_id:
        _BOUND.set(fields | {"task_version": version})


def log_state_change(task: "Task", event: "Event") -> None:
    """tasks.engine.events observer: one line for ``event``, printed once the change is written — after its commit where
    the change commits on its own; inside the caller's transaction where the change is part of one (a person's
    decision with its audit row), so a transaction rolled back after its change leaves a line with no event behind
    it: the event log is the record, these lines are its echo. Costs nothing when the logger is off
    (RECKON_LOG_LEVEL above INFO).

    Inside a wake-up bound to this task, the bound version follows the change (``_follow``): what is logged and
    traced after it (a connector's call, the runner's lines) carries the version the task is at, not the one the
    wake-up was sent for."""
    _follow(task.pk, event.seq)
    logger = logging.getLogger(STATE_LOGGER)
    if not logger.isEnabledFor(logging.INFO):
        return
    message, fields = state_change_line(
        task_id=task.pk, version=event.seq, event_type=event.type, payload=event.payload
    )
    logger.info(message, extra=fields)
