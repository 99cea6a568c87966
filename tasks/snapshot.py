"""A version-stamped read of one task: everything a step decides on, in three queries.

The compare-and-set that applies a change guards it with the snapshot's version, so every decision made on a
snapshot is made on what the database holds at that version (every change of the rows read here bumps it).
After a write the compare-and-set returns the snapshot of the new version, built from the rows it wrote — the
next step of the same holder reads nothing again.
"""

from dataclasses import dataclass, replace
from datetime import datetime

from django.db.models import Count, DateTimeField, Func, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce

from leases import clock
from leases.models import Lease, LeaseReservation
from leases.services import LeaseRef
from tasks import sql
from tasks.errors import TaskNotFound, VersionConflict
from tasks.lifecycle import OPEN_OPERATION_STATUSES, UNSETTLED_OPERATION_STATUSES, NodeStatus, OperationStatus
from tasks.models import Node, Operation, Task

_UNSETTLED = [s.value for s in UNSETTLED_OPERATION_STATUSES]


@dataclass(frozen=True)
class Snapshot:
    task: Task  # the row at ``version``
    nodes: tuple[Node, ...]  # the current plan's nodes by position; ``node.retries`` = its rejected operations
    unsettled: tuple[Operation, ...]  # intent, dispatched, accepted and unknown operations, oldest first
    now: datetime  # the database clock when it was read (or last written)
    lease_expires_at: datetime | None = None  # the caller's lease, if it is the open one at its epoch
    reserved_for: str = ""  # the operator a takeover is reserved for

    @property
    def version(self) -> int:
        return self.task.version

    def node(self, key: str) -> Node | None:
        return next((n for n in self.nodes if n.key == key), None)

    def operation(self, op_key: str) -> Operation | None:
        return next((op for op in self.unsettled if op.op_key == op_key), None)

    def open_operations(self) -> list[Operation]:
        """Dispatched, accepted or unknown: settled only by a query by op key (safe handover)."""
        return [op for op in self.unsettled if op.status in OPEN_OPERATION_STATUSES]

    def intents(self) -> list[Operation]:
        return [op for op in self.unsettled if op.status == OperationStatus.INTENT]

    def succeeded(self) -> set[str]:
        return {n.key for n in self.nodes if n.status == NodeStatus.SUCCEEDED}

    def lease_live(self) -> bool:
        return self.lease_expires_at is not None and self.lease_expires_at > self.now


def _now_expression() -> Func | Value:
    sql, params = clock.now_sql()
    if params:
        return Value(params[0], output_field=DateTimeField())
    # The template is %-formatted by the expression, then again with the query's parameters: double twice.
    return Func(template=sql.replace("%", "%%%%"), output_field=DateTimeField())  # the database server's clock


def task_snapshot(*, task_id: int, lease: LeaseRef | None = None) -> Snapshot:
    """Read the task with its lease, reservation and the database time (one query), its unsettled operations (one)
    and the current plan's nodes (one). Raises TaskNotFound.

    The three reads are one snapshot of one version: every change of these rows moves the task's version in the
    same commit, and the last read also reads the version again — if another commit landed after the task row was
    read, the version differs and the snapshot is read again (a torn read would pair one version with another's
    rows: a wrong directive, or a refusal naming a condition no version showed)."""
    for _attempt in range(_ATTEMPTS):
        snap = _read(task_id, lease)
        if snap is not None:
            return snap
    raise VersionConflict(f"task {task_id} kept changing while it was read; read it again", task_id=task_id)


_ATTEMPTS = 5


def _read(task_id: int, lease: LeaseRef | None) -> Snapshot | None:
    rows = Task.objects.filter(pk=task_id).annotate(
        db_now=_now_expression(),
        reserved_for=Coalesce(
            Subquery(LeaseReservation.objects.filter(task_id=OuterRef("pk")).values("holder_id")[:1]), Value("")
        ),
    )
    if lease is not None:
        live = Lease.objects.filter(pk=lease.pk, task_id=OuterRef("pk"), epoch=lease.epoch, released_at__isnull=True)
        rows = rows.annotate(lease_expires_at=Subquery(live.values("expires_at")[:1]))
    task = rows.first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    unsettled = tuple(
        Operation.objects.filter(task_id=task_id, status__in=_UNSETTLED)
        .select_related("node")
        .order_by("registered_at", "pk")
    )
    version_now = Subquery(Task.objects.filter(pk=task_id).values("version")[:1])
    nodes = tuple(
        Node.objects.filter(task_id=task_id, plan_version=task.plan_version)
        .annotate(
            retries=Count("operations", filter=Q(operations__status=OperationStatus.REJECTED.value)),
            task_version_now=version_now,
        )
        .order_by("position")
    )
    if nodes:
        moved = nodes[0].task_version_now != task.version
    else:  # no plan yet: ask the version itself
        moved = Task.objects.filter(pk=task_id).values_list("version", flat=True).first() != task.version
    if moved:
        return None
    by_pk = {n.pk: n for n in nodes}
    for op in unsettled:
        if op.node_id in by_pk:
            op.node = by_pk[op.node_id]
    now: datetime = task.db_now
    return Snapshot(
        task=task,
        nodes=nodes,
        unsettled=unsettled,
        now=now,
        lease_expires_at=getattr(task, "lease_expires_at", None),
        reserved_for=task.reserved_for,
    )


def after_write(
    snap: Snapshot,
    *,
    task: Task,
    nodes: dict[int, dict[str, object]],
    operations: list[Operation],
    now: datetime,
    lease_expires_at: datetime | None,
) -> Snapshot:
    """The snapshot of the version a write produced, from the rows it wrote: ``task`` and ``operations`` as the write
    left them (inserted or updated), the changed fields of ``nodes`` (copies: the old snapshot stays as it was)."""
    new_nodes = []
    for node in snap.nodes:
        if node.pk in nodes:
            node = sql.clone(node)
            for name, value in nodes[node.pk].items():
                setattr(node, name, value)
        new_nodes.append(node)
    by_pk = {n.pk: n for n in new_nodes}
    written = {op.pk: op for op in operations}
    rows = [written.pop(op.pk, op) for op in snap.unsettled]  # the ones written replace the ones read
    unsettled = []
    for op in [*rows, *written.values()]:  # then the ones the write inserted
        if op.node_id in by_pk:
            op.node = by_pk[op.node_id]
        if op.status in UNSETTLED_OPERATION_STATUSES:
            unsettled.append(op)
    return replace(
        snap,
        task=task,
        nodes=tuple(new_nodes),
        unsettled=tuple(unsettled),
        now=now,
        lease_expires_at=lease_expires_at if lease_expires_at is not None else snap.lease_expires_at,
    )
