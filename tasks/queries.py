"""Reads for pages and the API: the selectors, on Task.objects (tasks/querysets.py: workable, with_progress,
with_attention, needs_attention, operable_by), and keyset pagination."""

import base64
import binascii
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet

from tasks.errors import TaskError, TaskNotFound
from tasks.models import Task
from tasks.querysets import Attention, attention_field

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    from tasks.querysets import Progress, TaskQuerySet

# The order of every task list, newest change first; the pk breaks ties, so a cursor names one place.
RECENT_FIRST = ("-updated_at", "-pk")


class InvalidCursor(TaskError):
    code = "invalid_cursor"


def get_task(task_id: int) -> Task:
    """The task row, or TaskNotFound."""
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    return task


def task_overview() -> "TaskQuerySet[WithAnnotations[Task, Progress]]":
    """Tasks, newest change first, with progress on their current plan, their open operations and what needs a
    person (attention_reasons). Page it with page()."""
    return Task.objects.with_progress().with_attention().order_by(*RECENT_FIRST)


def attention_reasons(task: Task) -> list[Attention]:
    """Why ``task`` needs a person, from the annotations of with_attention() / needs_attention(): no query."""
    try:
        return [reason for reason in Attention if getattr(task, attention_field(reason))]
    except AttributeError:
        raise ValueError("attention_reasons needs a task read with Task.objects.with_attention()") from None


def page[T: Task](qs: QuerySet[T], *, after: str | None, size: int) -> tuple[list[T], str | None]:
    """Up to ``size`` rows of ``qs`` after the cursor ``after`` (None: from the start), newest change first, and
    the cursor of the next page (None on the last). Keyset, not offset: a task created while someone pages sorts
    before every cursor already handed out, so it neither repeats nor pushes a row off a later page. (A task that
    changes moves to the front, as in any list ordered by change.) Raises InvalidCursor."""
    if size < 1:
        raise ValueError("a page holds at least one row")
    rows = qs.order_by(*RECENT_FIRST)
    window = rows
    if after is not None:
        updated_at, pk = _decode(after)
        # (updated_at, pk) < the cursor's; the redundant ``lte`` bounds an index range scan on updated_at.
        window = rows.filter(Q(updated_at__lte=updated_at), Q(updated_at__lt=updated_at) | Q(pk__lt=pk))
    # The page's keys first, in a subquery of the same statement: the annotations (correlated subqueries) are
    # then computed for these rows only — given the whole table, PostgreSQL may hash a subquery over all of it.
    found = list(rows.filter(pk__in=window.values("pk")[: size + 1]))
    if len(found) <= size:
        return found, None
    last = found[size - 1]
    return found[:size], _encode(last.updated_at, last.pk)


def _encode(updated_at: datetime, pk: int) -> str:
    return base64.urlsafe_b64encode(f"{updated_at.isoformat()}|{pk}".encode()).decode().rstrip("=")


def _decode(cursor: str) -> tuple[datetime, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, pk = text.split("|")
        updated_at = datetime.fromisoformat(moment)
        if updated_at.tzinfo is None:
            raise ValueError("a cursor's time names its zone")
        return updated_at, int(pk)
    except (binascii.Error, UnicodeDecodeError, ValueError) as error:
        raise InvalidCursor(f"not a cursor of this list: {cursor[:40]!r}") from error
