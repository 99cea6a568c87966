"""Reads for pages and the API: the selectors, on Task.objects (tasks/querysets.py: workable, with_progress,
with_attention, with_holder, needs_attention), the console's queue filters (TaskFilter,
task_queue, attention_queue) and keyset pagination (page)."""

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING

from django.db.models import Exists, OuterRef, Q, QuerySet

from leases.models import HolderKind, Lease
from tasks.core.actions import approval_actions
from tasks.core.errors import TaskError
from tasks.core.kinds import served_kinds
from tasks.core.lifecycle import ENDED_TASK_STATUSES, TaskStatus
from tasks.core.parsing import ascii_int
from tasks.models import Task
from tasks.querysets import Attention, attention_field

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    from tasks.querysets import Overview, TaskQuerySet

# The order of the general task list, newest change first; the pk breaks ties, so a cursor names one place.
RECENT_FIRST = ("-updated_at", "-pk")


class Order(Enum):
    """A keyset order: the fields a cursor holds, the pk last so that a cursor names one place."""

    RECENT_CHANGE_FIRST = ("-updated_at", "-pk")
    # Immutable keys: a task that changes keeps its place, so paging neither repeats nor skips it.
    NEWEST_FIRST = ("-pk",)
    # The needs-attention queue: who has waited longest (since their last change) first.
    OLDEST_CHANGE_FIRST = ("updated_at", "pk")


# Holder filter values besides a holder's id.
HOLDER_AGENT, HOLDER_PERSON, HOLDER_NONE = "agent", "person", "none"
# Attention filter values besides a reason.
ATTENTION_ANY, ATTENTION_NONE = "any", "none"


class InvalidCursor(TaskError):
    code = "invalid_cursor"


@dataclass(frozen=True)
class TaskFilter:
    """What a queue shows: every field left empty selects everything. ``states`` and ``pause_reasons`` select any
    of their values, ``exclude_states`` removes; ``holder`` is agent, person, none or a holder's id; ``attention``
    is any, none or an Attention value; ``text`` is looked for in title, kind and project (and ``#12`` is task 12)."""

    states: frozenset[str] = frozenset()
    pause_reasons: frozenset[str] = frozenset()
    exclude_states: frozenset[str] = frozenset()
    kind: str = ""
    project: str = ""
    holder: str = ""
    attention: str = ""
    text: str = ""

    def shown_states(self) -> frozenset[str]:
        """The statuses a task shown by this filter can be in."""
        states = self.states or frozenset(s.value for s in TaskStatus)
        if self.pause_reasons:
            states &= {TaskStatus.PAUSED.value}
        return states - self.exclude_states

    def only_ended(self) -> bool:
        """Every task it can show has ended (completed, failed, stopped, quarantined): nothing shown will change."""
        return self.shown_states() <= {s.value for s in ENDED_TASK_STATUSES}


def task_overview() -> "TaskQuerySet[WithAnnotations[Task, Overview]]":
    """Tasks, newest change first, with progress on their current plan, their open operations, their lease holder
    and what needs a person (attention_reasons). Page it with page()."""
    inputs = (approval_actions(), tuple(served_kinds()))
    built = _overviews.get(inputs)
    if built is None:
        built = Task.objects.with_progress().with_holder().with_attention().order_by(*RECENT_FIRST)
        _overviews.clear()
        _overviews[inputs] = built
    # A clone: the built queryset is never evaluated, only copied, so every caller gets a fresh one.
    return built.all()


# Building the overview's expressions costs more than running its query on a page (tens of correlated
# subqueries): it is built once per process, set of approval actions and set of kinds with a connector here (the
# inputs it is built from).
_overviews: dict[tuple[tuple[str, ...], tuple[str, ...]], "TaskQuerySet[WithAnnotations[Task, Overview]]"] = {}


def task_queue(task_filter: TaskFilter) -> "TaskQuerySet[WithAnnotations[Task, Overview]]":
    """The work queue: task_overview() narrowed by ``task_filter``. Restrict it to what the reader may see
    (viewable_condition) and page it with page(order=Order.NEWEST_FIRST)."""
    return task_overview().filter(filter_condition(task_filter))


def attention_queue(task_filter: TaskFilter) -> "TaskQuerySet[WithAnnotations[Task, Overview]]":
    """The needs-attention queue: tasks with at least one Attention reason, narrowed by ``task_filter``. Page it
    with page(order=Order.OLDEST_CHANGE_FIRST)."""
    return task_queue(task_filter).filter(any_attention())


def any_attention() -> Q:
    """A task read with with_attention() has at least one reason."""
    return reduce(or_, (Q(**{attention_field(reason): True}) for reason in Attention))


def filter_condition(task_filter: TaskFilter) -> Q:
    """``task_filter`` as a condition on tasks read with with_attention()."""
    f = task_filter
    condition = Q()
    if f.states:
        condition &= Q(status__in=sorted(f.states))
    if f.pause_reasons:
        condition &= Q(status=TaskStatus.PAUSED.value, status_reason__in=sorted(f.pause_reasons))
    if f.exclude_states:
        condition &= ~Q(status__in=sorted(f.exclude_states))
    if f.kind:
        condition &= Q(kind=f.kind)
    if f.project:
        condition &= Q(project=f.project)
    if f.holder:
        condition &= _holder_condition(f.holder)
    if f.attention:
        condition &= _attention_condition(f.attention)
    if f.text:
        condition &= _text_condition(f.text)
    return condition


def _holder_condition(holder: str) -> Q:
    held = Lease.objects.open().filter(task_id=OuterRef("pk"))
    if holder == HOLDER_NONE:
        return ~Q(Exists(held))
    if holder == HOLDER_AGENT:
        return Q(Exists(held.filter(holder_kind=HolderKind.AGENT.value)))
    if holder == HOLDER_PERSON:
        return Q(Exists(held.filter(holder_kind=HolderKind.OPERATOR.value)))
    return Q(Exists(held.filter(holder_id=holder)))


def _attention_condition(attention: str) -> Q:
    if attention == ATTENTION_ANY:
        return any_attention()
    if attention == ATTENTION_NONE:
        return ~any_attention()
    return Q(**{attention_field(Attention(attention)): True})


def _text_condition(text: str) -> Q:
    words = Q(title__icontains=text) | Q(kind__icontains=text) | Q(project__icontains=text)
    if (number := ascii_int(text.removeprefix("#"))) is not None:
        words |= Q(pk=number)
    return words


def attention_reasons(task: Task) -> list[Attention]:
    """Why ``task`` needs a person, from the annotations of with_attention() / needs_attention(): no query."""
    try:
        return [reason for reason in Attention if getattr(task, attention_field(reason))]
    except AttributeError:
        raise ValueError("attention_reasons needs a task read with Task.objects.with_attention()") from None


def page[T: Task](
    qs: QuerySet[T], *, after: str | None, size: int, order: Order = Order.RECENT_CHANGE_FIRST
) -> tuple[list[T], str | None]:
    """Up to ``size`` rows of ``qs`` after the cursor ``after`` (None: from the start) in ``order``, and the
    cursor of the next page (None on the last). Keyset, not offset: a task created while someone pages sorts
    before every cursor already handed out (newest first orders), so it neither repeats nor pushes a row off a
    later page. In a change order a task that changes moves (to the front, newest change first; to the back,
    oldest change first); in NEWEST_FIRST it keeps its place. Raises InvalidCursor."""
    if size < 1:
        raise ValueError("a page holds at least one row")
    rows = qs.order_by(*order.value)
    window = rows if after is None else rows.filter(_after(order, *_decode(after)))
    # The page's keys first, in a subquery of the same statement: the annotations (correlated subqueries) are
    # then computed for these rows only — given the whole table, PostgreSQL may hash a subquery over all of it.
    found = list(rows.filter(pk__in=window.values("pk")[: size + 1]))
    if len(found) <= size:
        return found, None
    last = found[size - 1]
    return found[:size], _encode(last.updated_at, last.pk)


def cursor_of(updated_at: datetime, pk: int) -> str:
    """The cursor that pages after the row (updated_at, pk): what page() hands out for its last row."""
    return _encode(updated_at, pk)


def _after(order: Order, updated_at: datetime, pk: int) -> Q:
    """The rows past the cursor (updated_at, pk) in ``order``; the redundant ``lte``/``gte`` bounds an index range
    scan on updated_at."""
    if order is Order.NEWEST_FIRST:
        return Q(pk__lt=pk)
    if order is Order.OLDEST_CHANGE_FIRST:
        return Q(updated_at__gte=updated_at) & (Q(updated_at__gt=updated_at) | Q(pk__gt=pk))
    return Q(updated_at__lte=updated_at) & (Q(updated_at__lt=updated_at) | Q(pk__lt=pk))


def _encode(updated_at: datetime, pk: int) -> str:
    return base64.urlsafe_b64encode(f"{updated_at.isoformat()}|{pk}".encode()).decode().rstrip("=")


def _decode(cursor: str) -> tuple[datetime, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, pk = text.split("|")
        updated_at = datetime.fromisoformat(moment)
        if updated_at.tzinfo is None:
            raise ValueError("a cursor's time names its zone")
        if (number := ascii_int(pk)) is None:
            raise ValueError("a cursor's id is a positive number")
        return updated_at, number
    except (binascii.Error, UnicodeDecodeError, ValueError) as error:
        raise InvalidCursor(f"not a cursor of this list: {cursor[:40]!r}") from error
