"""``Task.objects``: the named selections every reader builds on (tasks/reads/queries.py, the console, the agent API).

tasks/models.py attaches this QuerySet, so this module does not import tasks.models: the other row classes are
found by name in Django's app registry when a method runs (``_rows``).
"""

from datetime import datetime
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Any, Self, TypedDict, TypeVar

from django.apps import apps
from django.db import NotSupportedError, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    BooleanField,
    Count,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce
from django.db.models.sql.compiler import SQLCompiler

from leases import clock
from leases.models import Lease, LeaseReservation
from leases.state import held_q, lapsed_q
from tasks.core.actions import approval_actions
from tasks.core.kinds import served_kinds
from tasks.core.lifecycle import (
    ENDED_TASK_STATUSES,
    NOT_ENDED,
    OPEN_OPERATION_STATUSES,
    UNSETTLED_OPERATION_STATUSES,
    WORKABLE_TASK_STATUSES,
    Actor,
    ChangeKind,
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
    TempResourceStatus,
    permitted,
)

if TYPE_CHECKING:
    from django.db.models.sql.compiler import _AsSqlType
    from django_stubs_ext import WithAnnotations

    from tasks.models import Task

_Task = TypeVar("_Task", bound="Task", covariant=True)

WORKABLE = sorted(s.value for s in WORKABLE_TASK_STATUSES)
# Operation.failure_class of an unknown operation the remote can neither dedupe nor answer for (tasks.decide.decisions).
UNPROVABLE = "unprovable"
# In these, next_directive never reaches the plan's nodes (tasks.decide.decisions.directive).
_DIRECTIVE_STOPS_BEFORE_NODES = sorted(ENDED_TASK_STATUSES | {TaskStatus.HUMAN, TaskStatus.PAUSED})


class Attention(models.TextChoices):
    """Why a task needs a person, as the console names it. A task may have several."""

    HUMAN = "human", "a person holds it"
    PAUSED = "paused", "paused"
    AWAITING_APPROVAL = "awaiting_approval", "awaiting approval"
    STOPPED_PENDING = "stopped_pending", "stopped, operations to reconcile"
    QUARANTINED = "quarantined", "quarantined"
    UNKNOWN_OPERATION = "unknown_operation", "operation outcome unknown"
    UNPROVABLE_OPERATION = "unprovable_operation", "operation unprovable"
    BUDGET_EXHAUSTED = "budget_exhausted", "attempt budget exhausted"
    TEMP_RESOURCE_STUCK = "temp_resource_stuck", "temp resource stuck"
    TEMP_RESOURCE_LEFT = "temp_resource_left", "temp resources left"
    TAKEOVER_REQUESTED = "takeover_requested", "takeover requested"


class Progress(TypedDict):
    """What with_progress() annotates."""

    nodes_total: int
    nodes_done: int
    open_operations: int


class Holding(TypedDict):
    """What with_holder() annotates: the open lease's holder, None when no lease is open; the newest lease's."""

    holder_kind: str | None
    holder_id: str | None
    last_holder_kind: str | None  # the newest lease's, open or closed
    last_holder_id: str | None
    holder_lapsed: bool  # the open lease is past its expiry and grace at the statement's clock: it holds nothing


class Overview(Progress, Holding):
    """What tasks.reads.queries.task_overview() annotates (besides with_attention()'s booleans)."""


def attention_field(reason: Attention) -> str:
    """The boolean annotation with_attention() sets for ``reason``."""
    return f"attention_{reason.value}"


def _rows(model: str) -> QuerySet[Any]:
    """Every row of the tasks model named ``model``."""
    rows: QuerySet[Any] = apps.get_model("tasks", model)._default_manager.all()
    return rows


class TaskQuerySet(models.QuerySet[_Task]):
    def workable(self, now: datetime | None = None) -> Self:
        """What the recovery scan hands to a worker: workable tasks, and ended tasks with temp resources left to
        delete, that nobody holds (no lease still inside its grace) and no person waits for."""
        now = now or clock.now()
        held = Lease.objects.filter(held_q(now), task_id=OuterRef("pk"))
        reserved = LeaseReservation.objects.filter(task_id=OuterRef("pk"))
        # Where cleanup may run: the permit table's statuses (never a quarantined task's: tasks.engine.cleanup).
        ended = sorted(s.value for s in permitted(ChangeKind.CLEANUP, Actor.AGENT))
        # A UNION of two index range reads (task_status_idx; temp_resource_status_idx): an OR with an EXISTS would
        # read every task row, finished ones included, and the scan would slow as history grows (bench scan).
        undone = [TempResourceStatus.ACTIVE, TempResourceStatus.CLEANING]
        litter = _rows("TempResource").filter(status__in=undone, task__status__in=ended).values("task_id")
        candidates = _rows("Task").filter(status__in=WORKABLE).values("pk").union(litter)
        # A delete the remote refused for now waits out its backoff, and the task's cleanup with it (it stops at
        # the first: tasks.engine.cleanup): not woken before. Judged once per candidate task, not once per temp
        # resource (a finished task of 10,000 nodes has 10,000: per row, the scan read 10,000 times 10,000 of them).
        backing_off = _rows("TempResource").filter(task_id=OuterRef("pk"), status__in=undone, not_before__gt=now)
        return (
            self.filter(pk__in=candidates)
            .exclude(Exists(held))
            .exclude(Exists(reserved))
            .exclude(Q(status__in=ended) & Exists(backing_off))
        )

    def with_progress(self) -> "TaskQuerySet[WithAnnotations[Task, Progress]]":
        """Annotates ``nodes_total`` and ``nodes_done`` (on the current plan) and ``open_operations`` (dispatched,
        accepted or unknown), each a correlated COUNT: no JOIN, so no row fan-out to undo with DISTINCT."""
        plan = _rows("Node").filter(task_id=OuterRef("pk"), plan_version=OuterRef("plan_version"))
        open_operations = _rows("Operation").filter(
            task_id=OuterRef("pk"), status__in=sorted(s.value for s in OPEN_OPERATION_STATUSES)
        )
        return self.annotate(
            nodes_total=_count(plan),
            nodes_done=_count(plan.filter(status=NodeStatus.SUCCEEDED.value)),
            open_operations=_count(open_operations),
        )

    def with_holder(self) -> "TaskQuerySet[WithAnnotations[Task, Holding]]":
        """Annotates ``holder_kind`` (agent or operator) and ``holder_id`` of the task's open lease (at most one:
        a partial unique index), None when nobody holds it, and ``holder_lapsed`` when that lease lapsed (open, but
        past its grace: it can write nothing); correlated subqueries, no JOIN."""
        held = Lease.objects.open().filter(task_id=OuterRef("pk"))
        last = Lease.objects.filter(task_id=OuterRef("pk")).order_by("-epoch")
        return self.annotate(
            holder_kind=Subquery(held.values("holder_kind")[:1]),
            holder_id=Subquery(held.values("holder_id")[:1]),
            # Who held it last, once nobody does: a task a person has is never shown as held by "nobody".
            last_holder_kind=Subquery(last.values("holder_kind")[:1]),
            last_holder_id=Subquery(last.values("holder_id")[:1]),
            holder_lapsed=Exists(Lease.objects.filter(lapsed_q(ClockNow()), task_id=OuterRef("pk"))),
        )

    def with_attention(self) -> Self:
        """Annotates one boolean per Attention reason (``attention_field(reason)``); read them with
        tasks.reads.queries.attention_reasons. Part of the same query: no query per task."""
        return self.annotate(
            **{
                attention_field(reason): ExpressionWrapper(condition, output_field=BooleanField())
                for reason, condition in _attention_conditions().items()
            }
        )

    def needs_attention(self) -> Self:
        """Tasks a person should look at, with their reasons annotated (with_attention)."""
        annotated = self.with_attention()
        return annotated.filter(reduce(or_, (Q(**{attention_field(reason): True}) for reason in Attention)))


def _count(rows: QuerySet[Any]) -> Coalesce:
    """COUNT(*) of ``rows`` (filtered on ``task_id=OuterRef("pk")``) as a correlated subquery."""
    counted = rows.order_by().values("task_id").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def _attention_conditions() -> dict[Attention, Q]:
    def exists(rows: QuerySet[Any]) -> Q:
        return Q(Exists(rows.filter(task_id=OuterRef("pk"))))

    unknown = _rows("Operation").filter(status=OperationStatus.UNKNOWN.value)
    # An operation already unknown when its lookup came back unprovable keeps its failure class: the task's pause
    # says it (tasks.decide.decisions.settle).
    paused_unprovable = Q(status=TaskStatus.PAUSED.value, status_reason=PauseReason.UNPROVABLE.value)
    spent_node = _rows("Node").filter(
        plan_version=OuterRef("plan_version"), status=NodeStatus.PENDING.value, attempts__gte=F("max_attempts")
    )
    budget_exhausted = Q(status=TaskStatus.PAUSED.value, status_reason=PauseReason.BUDGET_EXHAUSTED.value) | (
        Q(status__in=sorted(s.value for s in NOT_ENDED))
        & (Q(attempts_used__gte=F("attempt_budget")) | exists(spent_node))
    )
    return {
        Attention.HUMAN: Q(status=TaskStatus.HUMAN.value),
        Attention.PAUSED: Q(status=TaskStatus.PAUSED.value),
        Attention.AWAITING_APPROVAL: _awaiting_approval(),
        Attention.STOPPED_PENDING: Q(status=TaskStatus.STOPPED_PENDING.value),
        Attention.QUARANTINED: Q(status=TaskStatus.QUARANTINED.value),
        Attention.UNKNOWN_OPERATION: exists(unknown.exclude(failure_class=UNPROVABLE)) & ~paused_unprovable,
        Attention.UNPROVABLE_OPERATION: exists(unknown.filter(failure_class=UNPROVABLE))
        | (paused_unprovable & exists(unknown)),
        Attention.BUDGET_EXHAUSTED: budget_exhausted,
        Attention.TEMP_RESOURCE_STUCK: exists(_rows("TempResource").filter(status=TempResourceStatus.STUCK.value)),
        Attention.TEMP_RESOURCE_LEFT: _temp_resources_left(),
        Attention.TAKEOVER_REQUESTED: exists(LeaseReservation.objects.all()),
    }


def _temp_resources_left() -> Q:
    """An ended task's temp resources wait to be deleted and nobody will: its kind has no connector on this server
    (tasks.engine.registry: no worker of ours can delete them; its agent over the API must) and nobody holds a
    lease on it now, its grace included (its agent never came back). Where cleanup may run (the permit table's
    statuses: never a quarantined task's); a kind with a connector here is cleaned by the recovery scan's workers
    instead."""
    ended = sorted(s.value for s in permitted(ChangeKind.CLEANUP, Actor.AGENT))
    undone = _rows("TempResource").filter(
        task_id=OuterRef("pk"), status__in=[TempResourceStatus.ACTIVE, TempResourceStatus.CLEANING]
    )
    held = Lease.objects.filter(held_q(ClockNow()), task_id=OuterRef("pk"))
    return Q(status__in=ended) & ~Q(kind__in=served_kinds()) & Q(Exists(undone)) & ~Q(Exists(held))


def _awaiting_approval() -> Q:
    """next_directive would say ``stop: awaiting_approval``: nothing comes before the plan's nodes (no pause, no
    person, no cancel, no takeover request, no recheck, no unsettled operation), and the first ready node — the
    lowest position among pending nodes of the current plan whose dependencies all succeeded — is an approval, or a
    step it would start that an approval it depends on does not bind (tasks.decide.approval_binding: no approval
    given, given under another plan revision, not covering this step, expired at the database clock's reading).
    A request changed under an approval of the same revision is not seen here (only a rewrite of the rows can do
    that: the start refuses it, verify_log finds it)."""
    approvals = list(approval_actions())
    plan_of_outer = {"task_id": OuterRef("task_id"), "plan_version": OuterRef("plan_version")}
    ready_before = _rows("Node").filter(**plan_of_outer, position__lt=OuterRef("position")).filter(_ready())
    first_ready = (
        _rows("Node")
        .filter(task_id=OuterRef("pk"), plan_version=OuterRef("plan_version"))
        .filter(_ready(), ~Exists(ready_before))
    )
    first_ready_approval = first_ready.filter(action__in=approvals)
    now = ClockNow()  # compiled with each query: the overview queryset is built once per process
    unbinding = (
        _rows("Node")
        .filter(**plan_of_outer, action__in=approvals)
        .filter(JsonArrayHas(OuterRef("depends_on"), F("key")))
        .filter(
            Q(approval_seq__isnull=True)
            | ~Q(approval_plan_version=OuterRef("plan_version"))
            | ~Q(JsonObjectHasKey(F("approval_requests"), OuterRef("key")))
            | Q(approval_expires_at__lte=now)
        )
    )
    first_ready_unbound = (
        first_ready.exclude(action__in=approvals)
        .filter(Exists(unbinding), attempts__lt=F("max_attempts"))
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
    )
    unsettled = _rows("Operation").filter(
        task_id=OuterRef("pk"), status__in=sorted(s.value for s in UNSETTLED_OPERATION_STATUSES)
    )
    reserved = LeaseReservation.objects.filter(task_id=OuterRef("pk"))
    return (
        ~Q(status__in=[s.value for s in _DIRECTIVE_STOPS_BEFORE_NODES])
        & Q(cancel_requested_at__isnull=True, inputs_recheck_required=False)
        & ~Q(Exists(unsettled))
        & ~Q(Exists(reserved))
        & (
            Q(Exists(first_ready_approval))
            | (Q(attempts_used__lt=F("attempt_budget")) & Q(Exists(first_ready_unbound)))
        )
    )


def _ready() -> Q:
    """The node of the enclosing query is pending and every node it depends on (same task and plan) succeeded."""
    unmet = (
        _rows("Node")
        .filter(task_id=OuterRef("task_id"), plan_version=OuterRef("plan_version"))
        .exclude(status=NodeStatus.SUCCEEDED.value)
        .filter(JsonArrayHas(OuterRef("depends_on"), F("key")))
    )
    return Q(status=NodeStatus.PENDING.value) & ~Q(Exists(unmet))


class _JsonHas(Func):
    """``json`` (a JSON value) has ``member`` — written per database: Django's JSON lookups test object keys
    (has_key) or are missing on SQLite (contains). On PostgreSQL jsonb's ``?`` tests both an array's string element
    and an object's key; on SQLite ``json_each`` yields the ``column`` named here (an element's value, a key)."""

    arity = 2
    output_field = BooleanField()
    sqlite_column = "value"

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> "_AsSqlType":
        (json, json_params), (member, member_params) = (compiler.compile(e) for e in self.get_source_expressions())
        params = (*json_params, *member_params)
        if connection.vendor == "postgresql":
            return f"({json} ? {member})", params
        if connection.vendor == "sqlite":
            column = self.sqlite_column
            return f"EXISTS (SELECT 1 FROM json_each({json}) WHERE json_each.{column} = {member})", params  # noqa: S608
        name = type(self).__name__
        raise NotSupportedError(f"{name} is written for SQLite and PostgreSQL, not {connection.vendor}")


class JsonArrayHas(_JsonHas):
    """``array`` (a JSON array of strings) has ``item`` as an element."""

    sqlite_column = "value"


class JsonObjectHasKey(_JsonHas):
    """``obj`` (a JSON object) has the key ``key``."""

    sqlite_column = "key"


class ClockNow(Func):
    """The clock's time as the statement reads it (leases.clock.now_sql): the database's own clock, or a test's
    controllable one — compiled afresh with each query, never frozen in a queryset built once."""

    arity = 0
    output_field = DateTimeField()

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> "_AsSqlType":
        sql, params = clock.now_sql()
        if params:
            adapted: Any = tuple(
                connection.ops.adapt_datetimefield_value(p) for p in params
            )  # a datetime on PostgreSQL
            return sql, adapted
        return sql.replace("%", "%%"), ()  # SQLite's expression: a query with parameters doubles its % signs
