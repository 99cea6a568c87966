"""Operator notes on a task: a person who may operate the task writes what they saw or did.

A note is an audit row (action ``task_note``) and nothing else: no new table, no task version, no event — it changes
no state, so the task's own log is untouched; the detail page's timeline merges the task's audit rows and shows it.
The text passes checkpoint hygiene (no credentials, capped) before anything is written.
"""

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from tasks.access.permissions import require_operate
from tasks.core.errors import TaskError
from tasks.rows import get_task

if TYPE_CHECKING:
    from tasks.models import Task

NOTE_ACTION = "task_note"
NOTE_MAX_CHARS = 2000


class NoteRefused(TaskError):
    """An empty note, or one longer than NOTE_MAX_CHARS."""

    code = "note_refused"


def task_note_add(*, actor: Principal, task_id: int, text: str) -> AuditEvent:
    """Record ``text`` as ``actor``'s note on the task, audited. Refused (nothing written): a person who may not
    operate the task (PermissionDenied), a missing task (TaskNotFound), an empty or over-long note (NoteRefused),
    credential-like text (SecretInPayload) or text over the checkpoint cap (PayloadTooLarge)."""
    text = text.strip()
    if not text:
        raise NoteRefused("a note needs some text")
    if len(text) > NOTE_MAX_CHARS:
        raise NoteRefused(f"a note holds at most {NOTE_MAX_CHARS} characters, not {len(text)}")
    task = get_task(task_id)
    require_operate(actor, task)
    with transaction.atomic():  # audit_append judges the text's hygiene before it writes
        return audit_append(
            actor=actor,
            action=NOTE_ACTION,
            at=clock.now(),
            task_id=task.pk,
            version_before=task.version,
            version_after=task.version,
            details={"text": text},
        )


def with_note_count[Q: QuerySet[Any]](tasks: Q) -> Q:
    """Annotates ``note_count``: the task's notes, as a correlated COUNT over its audit rows (the audit_task_idx
    index) in the same statement — a page of tasks costs no query more."""
    notes = (
        AuditEvent.objects.filter(task_id=OuterRef("pk"), action=NOTE_ACTION)
        .order_by()
        .values("task_id")
        .annotate(n=Count("*"))
        .values("n")
    )
    return tasks.annotate(note_count=Coalesce(Subquery(notes, output_field=IntegerField()), 0))


def task_notes(task: "Task", limit: int = 100) -> list[AuditEvent]:
    """The task's newest ``limit`` notes, newest first: one query (the timeline of the detail page shows them all)."""
    return list(AuditEvent.objects.filter(task_id=task.pk, action=NOTE_ACTION).order_by("-seq")[:limit])
