"""compare_and_set: the only way a task's state changes.

One conditional UPDATE on the task row, guarded by the expected version, the caller's lease epoch and
the lease's expiry on the database server's clock, plus any guards of the change (no cancel, budget
left…); then the node/operation rows of the change and the event, all in one transaction.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.errors import LeaseExpired, LeaseLost
from leases.models import Lease
from tasks.errors import InvalidTransition, TaskError, TaskNotFound, VersionConflict
from tasks.events import NODE_DEFAULTS, NODE_FIELDS, OPERATION_FIELDS, append_event, jsonable, node_ref
from tasks.lifecycle import node_can_move, operation_can_move, task_can_move
from tasks.models import Node, Operation, Task


@dataclass(frozen=True)
class Guard:
    """An extra condition on the task row; ``error`` builds the refusal when it does not hold."""

    condition: Q
    error: Callable[[], TaskError]


@dataclass
class Change:
    event: str
    task: dict[str, Any] = field(default_factory=dict)
    # (row, fields) pairs: unsaved rows are inserted, saved ones updated.
    nodes: list[tuple[Node, dict[str, Any]]] = field(default_factory=list)
    operations: list[tuple[Operation, dict[str, Any]]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    guards: list[Guard] = field(default_factory=list)


@dataclass(frozen=True)
class Applied:
    version: int
    at: datetime


def lease_guard(lease: Lease, now: datetime) -> Q:
    live = Lease.objects.filter(
        task_id=OuterRef("pk"),
        pk=lease.pk,
        epoch=lease.epoch,
        released_at__isnull=True,
        expires_at__gt=now,
    )
    return Q(Exists(live))


type ChangeBuilder = Callable[[Task, datetime], Change]


def compare_and_set(
    task_id: int,
    expected_version: int,
    change: Change | ChangeBuilder,
    *,
    lease: Lease | None,
    before_event: Callable[[Task, datetime], None] | None = None,
) -> Applied:
    """Apply ``change`` if the task is still at ``expected_version`` and ``lease`` is still the live lease.

    ``change`` may be a builder called with the task row (at ``expected_version``) and the database
    server's time, for changes that depend on either (backoff, counters). Unsaved nodes and operations
    in the change are inserted; saved ones are updated only if their status is still the one the
    caller read. ``lease=None`` is only for changes any principal may make whoever
    holds the task (a cancel request, quarantine). ``before_event`` runs inside the transaction once the
    task row is won, for rows outside the projection (a receipt). On refusal it raises a named error
    and writes nothing.
    """
    with transaction.atomic():
        if lease is not None:
            # Lock the lease row first: a concurrent force-release or re-grant waits for us, or we for it,
            # so the EXISTS below never judges a lease that changed under our statement.
            locked = Lease.objects.select_for_update().filter(pk=lease.pk).first()
        now = clock.now()
        task = Task.objects.filter(pk=task_id).first()
        if task is None:
            raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
        if task.version != expected_version:
            raise VersionConflict(
                f"task {task_id} is at version {task.version}, not {expected_version}",
                expected=expected_version,
                actual=task.version,
            )
        if lease is not None:
            _check_lease(task_id, lease, locked, now)  # a lost lease is the first thing its holder must hear
        if not isinstance(change, Change):
            change = change(task, now)
        try:
            _check_transitions(task, change)
        except InvalidTransition:
            # A failing guard names the reason better ("a cancel is recorded" beats "stopped → running").
            _raise_failing_guard(task_id, change)
            raise
        condition = Q(pk=task_id, version=expected_version)
        if lease is not None:
            condition &= lease_guard(lease, now)
        for guard in change.guards:
            condition &= guard.condition
        fields = {**change.task, "version": F("version") + 1, "updated_at": now}
        if Task.objects.filter(condition).update(**fields) != 1:
            _raise_refusal(task_id, expected_version, change, lease, now)
        payload: dict[str, Any] = {}
        if change.task:
            payload["task"] = jsonable(change.task)
        if change.nodes:
            payload["nodes"] = {node_ref(node): _write_node(task_id, node, f) for node, f in change.nodes}
        if change.operations:
            payload["operations"] = {op.op_key: _write_operation(task_id, op, f) for op, f in change.operations}
        for name, value in change.task.items():  # the row as the UPDATE left it, without reading it again
            setattr(task, name, value)
        task.version, task.updated_at = expected_version + 1, now
        if before_event is not None:
            before_event(task, now)
        if change.data:
            payload["data"] = jsonable(change.data)
        append_event(task=task, seq=task.version, type=change.event, payload=payload, at=now)
        return Applied(version=task.version, at=now)


def _write_node(task_id: int, node: Node, fields: dict[str, Any]) -> dict[str, Any]:
    """Insert a new node (all projected fields go to the log) or update an existing one (the changed fields)."""
    if node.pk is None:
        for name, value in fields.items():
            setattr(node, name, value)
        node.task_id = task_id
        node.save(force_insert=True)
        logged = {name: jsonable(getattr(node, name)) for name in NODE_FIELDS}
        return {name: value for name, value in logged.items() if value != NODE_DEFAULTS[name]}
    if Node.objects.filter(pk=node.pk, task_id=task_id, status=node.status).update(**fields) != 1:
        raise VersionConflict(f"node {node.key} changed under the task version", node=node.key)
    return {name: jsonable(value) for name, value in fields.items()}


def _write_operation(task_id: int, op: Operation, fields: dict[str, Any]) -> dict[str, Any]:
    if op.pk is None:
        for name, value in fields.items():
            setattr(op, name, value)
        op.task_id = task_id
        op.save(force_insert=True)
        return {"node": node_ref(op.node), **{name: jsonable(getattr(op, name)) for name in OPERATION_FIELDS[1:]}}
    if Operation.objects.filter(pk=op.pk, task_id=task_id, status=op.status).update(**fields) != 1:
        raise VersionConflict(f"operation {op.op_key} changed under the task version", op_key=op.op_key)
    return {name: jsonable(value) for name, value in fields.items()}


def _check_transitions(task: Task, change: Change) -> None:
    target = change.task.get("status")
    if target is not None and not task_can_move(task.status, target):
        raise InvalidTransition(f"task cannot go from {task.status} to {target}", source=task.status, target=target)
    for node, fields in change.nodes:
        target = fields.get("status")
        if node.pk is not None and target is not None and not node_can_move(node.status, target):
            raise InvalidTransition(f"node {node.key} cannot go from {node.status} to {target}")
    for op, fields in change.operations:
        target = fields.get("status")
        if op.pk is not None and target is not None and not operation_can_move(op.status, target):
            raise InvalidTransition(f"operation {op.op_key} cannot go from {op.status} to {target}")


def _raise_refusal(task_id: int, expected_version: int, change: Change, lease: Lease | None, now: datetime) -> None:
    """The conditional UPDATE matched nothing: find out which condition failed and name it."""
    current = Task.objects.filter(pk=task_id).values_list("version", flat=True).first()
    if current != expected_version:
        raise VersionConflict(
            f"task {task_id} is at version {current}, not {expected_version}", expected=expected_version, actual=current
        )
    if lease is not None:
        _check_lease(task_id, lease, Lease.objects.filter(pk=lease.pk).first(), now)
    _raise_failing_guard(task_id, change)
    raise VersionConflict(f"task {task_id} changed concurrently", expected=expected_version)


def _check_lease(task_id: int, lease: Lease, row: Lease | None, now: datetime) -> None:
    if row is None or row.task_id != task_id or row.epoch != lease.epoch or row.released_at is not None:
        raise LeaseLost(task_id, lease.epoch, row.release_reason if row and row.released_at else "")
    if row.expires_at <= now:
        raise LeaseExpired(task_id, lease.epoch, row.expires_at)


def _raise_failing_guard(task_id: int, change: Change) -> None:
    for guard in change.guards:
        if not Task.objects.filter(Q(pk=task_id) & guard.condition).exists():
            raise guard.error()


@dataclass(frozen=True)
class Audit:
    """What the audit row of a change says besides the versions and the time, which the change supplies."""

    actor: Principal
    action: str
    epoch: int | None = None  # the lease epoch concerned, when it is not the writer's own lease
    reason: str = ""
    impact: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def audited_compare_and_set(
    task_id: int,
    expected_version: int,
    change: Change | ChangeBuilder,
    *,
    lease: Lease | None,
    audit: Audit,
    before_event: Callable[[Task, datetime], None] | None = None,
) -> Applied:
    """compare_and_set and its audit row, in one transaction: both land or neither does."""
    with transaction.atomic():
        applied = compare_and_set(task_id, expected_version, change, lease=lease, before_event=before_event)
        audit_append(
            actor=audit.actor,
            action=audit.action,
            at=applied.at,
            task_id=task_id,
            lease_epoch=audit.epoch if audit.epoch is not None else (lease.epoch if lease else None),
            version_before=expected_version,
            version_after=applied.version,
            reason=audit.reason,
            impact=audit.impact,
            details=audit.details,
        )
        return applied
