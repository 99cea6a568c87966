"""Conditions a change may add to the task row's conditional UPDATE, each with the error it raises."""

from datetime import datetime

from django.db.models import Exists, F, OuterRef, Q

from leases.models import LeaseReservation
from tasks.cas import Guard
from tasks.errors import (
    BackoffActive,
    BudgetExhausted,
    CancelRequested,
    InputsRecheckRequired,
    OperationsOpen,
    TakeoverRequested,
    TaskNotRunnable,
)
from tasks.lifecycle import OPEN_OPERATION_STATUSES, OperationStatus, TaskStatus
from tasks.models import Node, Operation


def no_cancel() -> Guard:
    return Guard(
        Q(cancel_requested_at__isnull=True), lambda: CancelRequested("a cancel is recorded: no new side effect")
    )


def status_in(statuses: frozenset[TaskStatus], message: str) -> Guard:
    return Guard(Q(status__in=[s.value for s in statuses]), lambda: TaskNotRunnable(message))


def task_budget_left() -> Guard:
    return Guard(
        Q(attempts_used__lt=F("attempt_budget")),
        lambda: BudgetExhausted("the task's attempt budget is used up", scope="task"),
    )


def no_open_operations() -> Guard:
    open_ops = Operation.objects.filter(task_id=OuterRef("pk"), status__in=[s.value for s in OPEN_OPERATION_STATUSES])
    return Guard(
        ~Q(Exists(open_ops)),
        lambda: OperationsOpen("an operation is dispatched, accepted or unknown: reconcile it by op key first"),
    )


def no_unsettled_operations() -> Guard:
    """Nothing registered and not yet settled: one side effect of a task in flight at a time."""
    unsettled = Operation.objects.filter(
        task_id=OuterRef("pk"), status__in=[OperationStatus.INTENT.value, *(s.value for s in OPEN_OPERATION_STATUSES)]
    )
    return Guard(
        ~Q(Exists(unsettled)),
        lambda: OperationsOpen("another operation is registered or in flight: settle it first"),
    )


def no_takeover_requested() -> Guard:
    reserved = LeaseReservation.objects.filter(task_id=OuterRef("pk"))
    return Guard(
        ~Q(Exists(reserved)),
        lambda: TakeoverRequested("a person asked to take this task over: no new side effect"),
    )


def inputs_rechecked() -> Guard:
    return Guard(
        Q(inputs_recheck_required=False),
        lambda: InputsRecheckRequired("the task was handed back by a person: confirm the inputs' versions first"),
    )


def node_budget_left(node: Node) -> Guard:
    left = Node.objects.filter(pk=node.pk, attempts__lt=F("max_attempts"))
    return Guard(
        Q(Exists(left)),
        lambda: BudgetExhausted(f"node {node.key} used its {node.max_attempts} attempts", scope="node", node=node.key),
    )


def node_backoff_passed(node: Node, now: datetime) -> Guard:
    passed = Node.objects.filter(Q(not_before__isnull=True) | Q(not_before__lte=now), pk=node.pk)
    return Guard(
        Q(Exists(passed)),
        lambda: BackoffActive(f"node {node.key} may not run before {node.not_before}", until=node.not_before),
    )
