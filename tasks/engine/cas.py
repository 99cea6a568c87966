"""compare_and_set: the only way a task's state changes. It applies a change; it decides nothing.

The database time is read first (``leases.clock``); then one write — on PostgreSQL a single statement
(``tasks.engine.sql.Batch``), committed on its own when it is the whole change, else one transaction:
1. the caller's lease (tasks with a lease): locked and checked — open, this epoch, not expired on the database
   clock at the write itself (``leases.services.lease_check``);
2. the task row, in one conditional UPDATE: at the expected version, in a status in which this actor may make this
   kind of change (``tasks.core.lifecycle.PERMITS``, the one table), with the change's own field conditions; it moves
   the version by one and the event chain's head;
3. the node, operation, receipt and temp-resource rows of the change (each update conditional on the status the
   caller read), then the event, chained to the head the task row held; then the lease is extended (a write is a
   heartbeat).
On refusal it names the condition that failed (VersionConflict, LeaseLost/LeaseExpired, TaskNotRunnable, …) and
nothing is written. Given the snapshot the change was computed on, it returns the snapshot of the new version.
"""

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Model, Q

from audit.principals import Principal
from audit.services import audit_append, audit_check
from leases import clock
from leases.models import Lease
from leases.services import LeaseRef, lease_check, lease_live, lease_refusal
from leases.state import held_sql
from tasks import rows
from tasks.core.errors import (
    BudgetExhausted,
    CancelRequested,
    InputsRecheckRequired,
    InvalidTransition,
    TaskError,
    TaskNotFound,
    TaskNotRunnable,
    VersionConflict,
)
from tasks.core.lifecycle import (
    NEEDS_FREE_TASK,
    Actor,
    ChangeKind,
    node_can_move,
    operation_can_move,
    permitted,
    status_refusal,
    task_can_move,
)
from tasks.decide.change import AtCommit, Change, Snapshot
from tasks.engine import sql
from tasks.engine.events import (
    DERIVED_TASK_FIELDS,
    NODE_DEFAULTS,
    NODE_FIELDS,
    OPERATION_FIELDS,
    chain_event,
    event_appended,
    event_written,
    jsonable,
    listeners_of,
)
from tasks.engine.failpoints import failpoint
from tasks.engine.snapshot import after_write
from tasks.models import Event, Node, Operation, Receipt, Task, TempResource
from tasks.rows import node_ref

NODE_INSERT_BATCH = 1000


@dataclass(frozen=True)
class _Condition:
    value: Any  # what a change asks for under this key (the key is the ORM lookup the refusal is diagnosed with)
    sql: str  # the same condition in the task row's UPDATE
    error: Callable[[], TaskError]  # the refusal it names when it fails


# Field conditions a change may add to the task row's UPDATE (``Change.requires``): a closed vocabulary.
TASK_CONDITIONS: dict[str, _Condition] = {
    "cancel_requested_at__isnull": _Condition(
        True, "cancel_requested_at IS NULL", lambda: CancelRequested("a cancel is recorded: no new side effect")
    ),
    "inputs_recheck_required": _Condition(
        False,
        "NOT inputs_recheck_required",
        lambda: InputsRecheckRequired("the task was handed back by a person: confirm the inputs' versions first"),
    ),
    "attempts_used__lt": _Condition(
        F("attempt_budget"),
        "attempts_used < attempt_budget",
        lambda: BudgetExhausted("the task's attempt budget is used up", scope="task"),
    ),
}


@dataclass(frozen=True)
class Applied:
    version: int
    at: datetime
    snapshot: Snapshot | None = None  # the new version's snapshot, when the change was computed on one
    operations: tuple[Operation, ...] = ()  # the operation rows as the change left them, in the change's order

    def next_snapshot(self) -> Snapshot:
        """The new version's snapshot (the change was computed on one, so there is one)."""
        if self.snapshot is None:  # pragma: no cover - compare_and_set returns one when given one
            raise RuntimeError("compare_and_set was given no snapshot, so it returned none")
        return self.snapshot


type ChangeBuilder = Callable[[Task, datetime], Change]
# A row to insert with a write, made from what the write will leave: (model, fields).
type AlsoRow = Callable[[Applied], tuple[type[Model], dict[str, Any]]]


def _resolve(value: Any, now: datetime) -> Any:
    return now + value.offset if isinstance(value, AtCommit) else value


def _resolved(fields: dict[str, Any], now: datetime) -> dict[str, Any]:
    return {name: _resolve(value, now) for name, value in fields.items()}


def compare_and_set(
    task_id: int,
    expected_version: int,
    change: Change | ChangeBuilder,
    *,
    lease: LeaseRef | None,
    actor: Actor | None = None,
    snapshot: Snapshot | None = None,
    before_event: Callable[[Task, datetime], None] | None = None,
    then: Change | None = None,
    also: AlsoRow | None = None,
) -> Applied:
    """Apply ``change`` if the task is still at ``expected_version``, ``lease`` is still its live lease and the
    table allows this actor this kind of change in the task's status.

    ``actor`` is the lease holder's kind when there is a lease; without one it must be given (a person or the
    system). ``change`` may be a builder called with the task row and the database time (paths that are not
    the step's hot path; it runs in the write's transaction); ``snapshot``, when the change was computed on one,
    spares the task read and is returned for the new version. ``before_event`` runs inside the transaction once the
    task row is won, for rows outside the projection. On refusal it raises a named error and nothing is written;
    a refusal for a lease that is no longer live is named first.

    ``then``: a second change, computed on ``project(snapshot, change)``, applied in the same write as the next
    version (its own event): both land or neither. Its conditions on the task row are judged on the row as read,
    so it may not ask for a field ``change`` sets (a programming error, refused).

    ``also``: a row that is no part of the task's state (the API's record of its answer to an Idempotency-Key),
    inserted in the same write — both land or neither does. It is made by ``also`` from the write's result as it
    will be, before the write runs (the lease's new expiry not known yet: the snapshot keeps the old one; inserted
    operations without their ids); a refusal it raises writes nothing.
    """
    call = _Call(task_id, expected_version, lease, _actor(lease, actor), before_event)
    if snapshot is None or not isinstance(change, Change):
        if then is not None or also is not None:
            raise ValueError("a second change or row is applied only on the snapshot the change was computed on")
        with transaction.atomic():
            return _write(call, change, snapshot, None)
    return _write(call, change, snapshot, then, also)


def project(snapshot: Snapshot, change: Change) -> Snapshot:
    """The snapshot ``change`` would leave, without writing it (times it takes at the write are the snapshot's):
    what a second change applied with it (``compare_and_set(then=…)``) is decided on. Updates only: a change that
    inserts rows cannot be projected."""
    if any(node.pk is None for node, _fields in change.nodes) or any(op.pk is None for op, _f in change.operations):
        raise ValueError("a change that inserts rows cannot be projected")
    now = snapshot.now
    task = _applied(snapshot.task, _resolved(change.task, now))
    task.version = snapshot.version + 1
    operations = [_applied(op, _resolved(fields, now)) for op, fields in change.operations]
    nodes = {node.pk: _resolved(fields, now) for node, fields in change.nodes}
    return after_write(snapshot, task=task, nodes=nodes, operations=operations, now=now, lease_expires_at=None)


@dataclass(frozen=True, slots=True)
class _Call:
    """Who writes what where: the part of a compare-and-set every phase of its write reads."""

    task_id: int
    expected_version: int
    lease: LeaseRef | None
    actor: Actor
    before_event: Callable[[Task, datetime], None] | None


@dataclass(slots=True)
class _Staged:
    """A judged write before it runs: the task (its working copy), the write's time, the changes and every row they
    set, resolved at that time, with their events chained from the task's head."""

    task: Task
    now: datetime
    changes: list[Change]
    version: int  # the version the write leaves
    statuses: frozenset[Any]
    requires: dict[str, Any]
    task_fields: dict[str, Any]
    nodes: list[tuple[Change, Node, dict[str, Any]]]
    operations: list[tuple[Operation, dict[str, Any]]]
    events: list[Event]


@dataclass(slots=True)
class _Batch:
    """The staged write as one batch of statements, and where each part's result is."""

    batch: sql.Batch
    guard: int | None  # the lease's check (its row matched or not)
    renew: int | None  # the lease's renewal (its new expiry)
    task: int
    nodes: list[int | None]
    operations: list[int]
    inserted: list[bool]  # per operation of the change: a new row
    receipts: list[Receipt]
    temp_resources: list[TempResource]


def _write(
    call: _Call,
    first: Change | ChangeBuilder,
    snapshot: Snapshot | None,
    then: Change | None,
    also: AlsoRow | None = None,
) -> Applied:
    """Judge, stage, batch, run, report: each phase below, in the order the module's docstring tells."""
    staged = _staged(call, *_judged(call, first, snapshot, then))
    batch = _batched(call, staged)
    if also is not None:  # gated on the task row's UPDATE, as the change's own rows
        model, row = also(_result(staged, batch, None, snapshot))
        batch.batch.insert(model, row, returning=False)
    results = _run(call, staged, batch)
    return _result(staged, batch, results, snapshot)


def _judged(
    call: _Call, first: Change | ChangeBuilder, snapshot: Snapshot | None, then: Change | None
) -> tuple[Task, datetime, list[Change]]:
    """The task at the expected version (a working copy), the write's time and the changes, refused by name here
    when the permit table or a transition forbids them — a lease that is no longer live named first."""
    # The time the write records, on the database clock (estimated without a round trip: clock.write_time) and
    # never before the task's last write, so a task's times follow its versions across processes. The write judges
    # the lease on the database clock at its own statement (lease_check), not on this.
    now = clock.write_time()
    task_id = call.task_id
    try:
        if snapshot is not None:
            if snapshot.version != call.expected_version:
                raise _conflict(task_id, call.expected_version, snapshot.version)
            task = rows.clone(snapshot.task)  # the caller's snapshot stays as it was read
        else:
            task = _task_at(task_id, call.expected_version)
        if task.updated_at is not None and task.updated_at > now:
            now = task.updated_at
        change = first if isinstance(first, Change) else first(task, now)
        if task.status not in permitted(change.kind, call.actor):
            raise _not_permitted(task_id, task.status, change.kind, call.actor)
        _check_transitions(task, change)
        if then is not None:
            _check_then(task_id, task, change, then, call.actor, now)
    except TaskError:
        if call.lease is not None and not lease_live(lease=call.lease, task_id=task_id):
            _raise_version_conflict_if_moved(task_id, call.expected_version)
            raise lease_refusal(lease=call.lease, task_id=task_id) from None
        raise
    return task, now, [change] if then is None else [change, then]


def _staged(call: _Call, task: Task, now: datetime, changes: list[Change]) -> _Staged:
    """Every row the changes set and their events. The payloads are known before any row is written, so the task
    row's UPDATE — the point where concurrent writers serialise — comes first and carries the new head of the chain."""
    staged = _Staged(
        task=task,
        now=now,
        changes=changes,
        version=call.expected_version + len(changes),
        statuses=permitted(changes[0].kind, call.actor),
        requires={},
        task_fields={},
        nodes=[],
        operations=[],
        events=[],
    )
    lease = call.lease
    for offset, each in enumerate(changes, start=1):
        staged.requires |= each.requires
        fields = _resolved(each.task, now)
        nodes = [(node, _resolved(values, now)) for node, values in each.nodes]
        ops = [(op, _resolved(values, now)) for op, values in each.operations]
        payload: dict[str, Any] = {}
        logged = (
            {name: value for name, value in fields.items() if name not in DERIVED_TASK_FIELDS}
            if each.derived
            else fields
        )
        if logged:
            payload["task"] = jsonable(logged)
        if nodes and not each.derived:
            payload["nodes"] = {node_ref(node): _logged_node(node, values) for node, values in nodes}
        if ops:
            payload["operations"] = {op.op_key: _logged_operation(op, values) for op, values in ops}
        data = each.data
        if lease is not None and "by" not in data:  # who wrote it: the lease's holder (an agent names itself)
            data = {**data, "by": f"{lease.holder_kind}:{lease.holder_id}"}
        if data:
            payload["data"] = jsonable(_resolved(data, now))
        event = chain_event(task=task, seq=call.expected_version + offset, type=each.event, payload=payload, at=now)
        task.log_head = event.digest  # the next event chains to this one (the working copy: set again in _run)
        staged.events.append(event)
        staged.task_fields |= fields
        staged.nodes += [(each, node, values) for node, values in nodes]
        staged.operations += ops
    return staged


def _batched(call: _Call, staged: _Staged) -> _Batch:
    """The staged write as one batch: the lease's check, the task row's conditional UPDATE, then the node,
    operation, receipt and event rows, then the lease's renewal."""
    task_id, change, now = call.task_id, staged.changes[0], staged.now
    where, params = _task_condition(task_id, call.expected_version, staged.statuses, staged.requires)
    if (change.kind, call.actor) in NEEDS_FREE_TASK:
        held, held_params = held_sql(clock.now(), alias="l")  # a judgement: the clock read, not the write's estimate
        where += f" AND NOT EXISTS (SELECT 1 FROM leases_lease l WHERE l.task_id = tasks_task.id AND {held})"  # noqa: S608 - fixed text
        params += held_params
    update = {**staged.task_fields, "updated_at": now, "log_head": staged.events[-1].digest}
    batch = sql.Batch()
    check = lease_check(lease=call.lease, task_id=task_id, at=now) if call.lease is not None else None
    guard = batch.guard(check.guard, check.guard_params) if check is not None else None
    if len(staged.changes) == 1:
        task_part = batch.update(Task, update, where=where, params=params, increments=("version",))
    else:
        task_part = batch.update(Task, {**update, "version": staged.version}, where=where, params=params)
    inserted = [op.pk is None for op, _fields in staged.operations]
    node_parts = [_node_part(batch, task_id, node, fields, each) for each, node, fields in staged.nodes]
    op_parts = [_operation_part(batch, task_id, op, fields, now) for op, fields in staged.operations]
    receipts = [receipt for each in staged.changes for receipt in each.receipts]
    for receipt in receipts:
        receipt.received_at = now
        if receipt.operation_id is None:  # pragma: no cover - a receipt names an operation that exists
            raise ValueError("a receipt is recorded for an operation already registered")
        batch.insert(Receipt, rows.row_values(receipt, _RECEIPT_COLUMNS), returning=False)
    for event in staged.events:
        row = rows.row_values(event, _EVENT_COLUMNS)
        row["payload"] = sql.RawJSON(event.canonical_payload)  # type: ignore[attr-defined]
        batch.insert(Event, row, returning=False)
    renew = batch.returning(check.renew, check.renew_params, value="expires_at") if check and check.renew else None
    return _Batch(
        batch=batch,
        guard=guard,
        renew=renew,
        task=task_part,
        nodes=node_parts,
        operations=op_parts,
        inserted=inserted,
        receipts=receipts,
        temp_resources=[temp for each in staged.changes for temp in each.temp_resources],
    )


def _run(call: _Call, staged: _Staged, batch: _Batch) -> list[Any]:
    """Run the batch — alone when it is the whole change (one statement commits on its own on PostgreSQL outside
    any transaction: no BEGIN and COMMIT round trips), else with the rows outside it in one transaction; on a part
    that matched nothing, name why (nothing was written). The task's working copy becomes the row as written."""
    task_id, task, now = call.task_id, staged.task, staged.now
    new_nodes = any(node.pk is None for _each, node, _fields in staged.nodes)
    listeners = [listeners_of(event) for event in staged.events]
    alone = (
        connection.vendor == "postgresql"
        and connection.get_autocommit()
        and not new_nodes
        and not batch.temp_resources
        and call.before_event is None
        and not any(listeners)
    )
    try:
        with nullcontext() if alone else transaction.atomic():
            if batch.receipts:
                failpoint("after_receipt", task_id=task_id)
            results = batch.batch.run()
            if batch.guard is not None and results[batch.guard] is None:  # the lease matched nothing: no write
                _raise_version_conflict_if_moved(task_id, call.expected_version)
                raise lease_refusal(lease=call.lease, task_id=task_id)  # type: ignore[arg-type]
            if results[batch.task] != 1:  # the task row matched nothing: nothing was written
                _raise_refusal(call, staged)
            _insert_new_nodes(task_id, [(node, fields) for _each, node, fields in staged.nodes])
            for (op, _fields), part in zip(staged.operations, batch.operations, strict=True):
                if op.pk is None:
                    op.pk, op._state.adding = results[part], False
            for name, value in staged.task_fields.items():  # the row as the UPDATE left it, without reading it again
                setattr(task, name, value)
            task.version, task.updated_at, task.log_head = staged.version, now, staged.events[-1].digest
            if batch.temp_resources:
                retention: timedelta = settings.RECKON_TEMP_RETENTION
                for temp in batch.temp_resources:
                    temp.created_at, temp.retention_until = now, now + retention
                TempResource.objects.bulk_create(batch.temp_resources, ignore_conflicts=True)
            if call.before_event is not None:
                call.before_event(task, now)
            for event, told in zip(staged.events, listeners, strict=True):
                event_appended(task, event, told)
    except sql.PartRefused as refused:  # nothing was written (named once out of the aborted statement's transaction)
        _raise_part_refusal(refused.part, staged, batch)
    for event in staged.events:
        event_written(task, event)
    return results


def _result(staged: _Staged, batch: _Batch, results: list[Any] | None, snapshot: Snapshot | None) -> Applied:
    """What the write left: its version and time, the operation rows as written (copies of updated ones: the
    caller's stay as read) and, given the snapshot the change was computed on, the new version's snapshot.
    Without ``results``, what it will leave, before it runs (``also``): the task as the UPDATE will set it, the
    lease's expiry as read."""
    lease_expires_at: datetime | None = None
    task = staged.task
    if results is None:
        task = _applied(task, staged.task_fields)
        task.version, task.updated_at, task.log_head = staged.version, staged.now, staged.events[-1].digest
    elif batch.guard is not None:
        lease_expires_at = clock.as_utc(results[batch.renew] if batch.renew is not None else results[batch.guard])
    written = [
        op if new else _applied(op, fields) for (op, fields), new in zip(staged.operations, batch.inserted, strict=True)
    ]
    new_snapshot = None
    if snapshot is not None:
        changed: dict[int, dict[str, Any]] = {}
        for _each, node, fields in staged.nodes:
            if node.pk is not None:
                changed[node.pk] = changed.get(node.pk, {}) | fields
        new_snapshot = after_write(
            snapshot,
            task=task,
            nodes=changed,
            operations=written,
            now=staged.now,
            lease_expires_at=lease_expires_at,
        )
    return Applied(version=staged.version, at=staged.now, snapshot=new_snapshot, operations=tuple(written))


def _applied[M: Model](row: M, fields: dict[str, Any]) -> M:
    """A copy of ``row`` with ``fields`` set (the caller's row stays as it was read)."""
    row = rows.clone(row)
    for name, value in fields.items():
        setattr(row, name, value)
    return row


def _check_then(task_id: int, task: Task, change: Change, then: Change, actor: Actor, now: datetime) -> None:
    """``then`` is permitted on the task as ``change`` leaves it, and asks nothing of a field ``change`` sets."""
    after = _applied(task, _resolved(change.task, now))
    if after.status not in permitted(then.kind, actor):
        raise _not_permitted(task_id, after.status, then.kind, actor)
    _check_transitions(after, then)
    asked = {lookup.split("__")[0] for lookup in then.requires}
    if asked & set(change.task) or (then.kind, actor) in NEEDS_FREE_TASK or then.temp_resources:
        raise ValueError(f"{then.event} cannot follow {change.event} in one write")


def lock_for_write(task_id: int, lease: LeaseRef | None) -> None:
    """Inside the caller's transaction: lock the rows a write to ``task_id`` locks, in the order every write locks
    them (the lease, then the task row), before the caller reads its snapshot. No other write can then land between
    that read and the caller's compare-and-set: a rare writer that must not lose every race to a stream of fast ones
    (a cancel against a busy agent) waits its turn once instead of retrying. SQLite's writers are serialised by its
    write lock already."""
    if lease is not None:
        Lease.objects.select_for_update().filter(pk=lease.pk).values_list("pk").first()
    Task.objects.select_for_update().filter(pk=task_id).values_list("pk").first()


def _actor(lease: LeaseRef | None, actor: Actor | None) -> Actor:
    if lease is not None:
        holder = Actor(lease.holder_kind)
        if actor is not None and actor != holder:
            raise InvalidTransition(f"a {lease.holder_kind} lease cannot write as {actor}")
        return holder
    if actor not in (Actor.PERSON, Actor.SYSTEM):
        raise InvalidTransition("a write without a lease is made by a person or the system, named as such")
    return actor


def _task_at(task_id: int, expected_version: int) -> Task:
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    if task.version != expected_version:
        raise _conflict(task_id, expected_version, task.version)
    return task


def _conflict(task_id: int, expected: int, actual: int | None) -> VersionConflict:
    return VersionConflict(f"task {task_id} is at version {actual}, not {expected}", expected=expected, actual=actual)


def _raise_version_conflict_if_moved(task_id: int, expected_version: int) -> None:
    current = Task.objects.filter(pk=task_id).values_list("version", flat=True).first()
    if current is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    if current != expected_version:
        raise _conflict(task_id, expected_version, current)


def _not_permitted(task_id: int, status: str, kind: ChangeKind, actor: Actor) -> TaskError:
    """The permit table's refusal (tasks.core.lifecycle.status_refusal), named as every prediction names it."""
    refusal = status_refusal(task_id, status, kind, actor)
    if refusal is None:  # pragma: no cover - called only where the table refused
        raise ValueError(f"{actor} may {kind} in {status}: nothing to refuse")
    return refusal


def _logged_node(node: Node, fields: dict[str, Any]) -> dict[str, Any]:
    """What the log records of a node write: a new node's projected fields that differ from the defaults (its
    definition is in the plan revision), or the fields an update changes."""
    if node.pk is None:
        logged = {name: jsonable(fields.get(name, getattr(node, name))) for name in NODE_FIELDS}
        return {name: value for name, value in logged.items() if value != NODE_DEFAULTS[name]}
    return {name: jsonable(value) for name, value in fields.items()}


def _logged_operation(op: Operation, fields: dict[str, Any]) -> dict[str, Any]:
    if op.pk is None:
        return {
            "node": node_ref(op.node),
            **{name: jsonable(fields.get(name, getattr(op, name))) for name in OPERATION_FIELDS[1:]},
        }
    return {name: jsonable(value) for name, value in fields.items()}


def _node_part(batch: sql.Batch, task_id: int, node: Node, fields: dict[str, Any], change: Change) -> int | None:
    """The node's UPDATE in the batch (conditional on the status read, and on budget when it spends an attempt)."""
    if node.pk is None:
        return None  # inserted once the task row is won (_insert_new_nodes)
    requires = change.node_requires.get(node.pk, {})
    where = "id = %s AND task_id = %s AND status = %s"
    if requires:
        if requires != {"attempts__lt": F("max_attempts")}:
            raise ValueError(f"unknown node condition {requires!r}")
        where += " AND attempts < max_attempts"
    return batch.update(Node, fields, where=where, params=[node.pk, task_id, node.status])


def _insert_new_nodes(task_id: int, node_fields: list[tuple[Node, dict[str, Any]]]) -> None:
    """A newly accepted plan's nodes, inserted after the task row's UPDATE won: a concurrent acceptance waits on
    that row and is refused by name, never by the nodes' unique constraint."""
    new: list[Node] = []
    for node, fields in node_fields:
        if node.pk is None:
            for name, value in fields.items():
                setattr(node, name, value)
            node.task_id = task_id
            new.append(node)
    if new:  # a plan of 10,000 nodes: a statement per thousand, not per node
        Node.objects.bulk_create(new, batch_size=NODE_INSERT_BATCH)


def _raise_part_refusal(part: int, staged: _Staged, batch: _Batch) -> NoReturn:
    """A node or operation row of the change matched nothing although the task row did: name why."""
    for (change, node, _fields), index in zip(staged.nodes, batch.nodes, strict=True):
        if index == part:
            if (
                change.node_requires.get(node.pk, {})
                and Node.objects.filter(pk=node.pk, attempts__gte=F("max_attempts")).exists()
            ):
                raise BudgetExhausted(
                    f"node {node.key} used its {node.max_attempts} attempts", scope="node", node=node.key
                )
            raise VersionConflict(f"node {node.key} changed under the task version", node=node.key)
    for (op, _fields), index in zip(staged.operations, batch.operations, strict=True):
        if index == part:
            raise VersionConflict(f"operation {op.op_key} changed under the task version", op_key=op.op_key)
    raise VersionConflict("a row of the change changed under the task version")  # pragma: no cover


def _operation_part(batch: sql.Batch, task_id: int, op: Operation, fields: dict[str, Any], now: datetime) -> int:
    if op.pk is None:
        for name, value in fields.items():
            setattr(op, name, value)
        op.task_id = task_id
        if op.registered_at is None:
            op.registered_at = now
        row = rows.row_values(op, _OPERATION_COLUMNS)
        canonical = getattr(op, "canonical_request", None)  # the request's JSON, made once by its decision
        if canonical is not None and "request" not in fields:
            row["request"] = sql.RawJSON(canonical)
        return batch.insert(Operation, row)
    where = "id = %s AND task_id = %s AND status = %s"
    return batch.update(Operation, fields, where=where, params=[op.pk, task_id, op.status])


def _concrete(model: type[Any]) -> tuple[str, ...]:
    return tuple(f.attname for f in model._meta.concrete_fields if not f.primary_key)


_OPERATION_COLUMNS = _concrete(Operation)
_RECEIPT_COLUMNS = _concrete(Receipt)
_EVENT_COLUMNS = _concrete(Event)


def _task_condition(
    task_id: int, expected_version: int, statuses: frozenset[Any], requires: dict[str, Any]
) -> tuple[str, list[Any]]:
    """The task row's UPDATE condition: version, the table's statuses, and the change's own conditions
    (TASK_CONDITIONS)."""
    ordered = sorted(s.value for s in statuses)
    where = f"id = %s AND version = %s AND status IN ({', '.join(['%s'] * len(ordered))})"
    for lookup, value in requires.items():
        condition = TASK_CONDITIONS.get(lookup)
        if condition is None or condition.value != value:
            raise ValueError(f"unknown task condition {lookup}={value!r}: add it to TASK_CONDITIONS")
        where += f" AND {condition.sql}"
    return where, [task_id, expected_version, *ordered]


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


def _raise_refusal(call: _Call, staged: _Staged) -> NoReturn:
    """The task row's conditional UPDATE matched nothing: find out which condition failed and name it."""
    task_id, expected_version, change = call.task_id, call.expected_version, staged.changes[0]
    row = Task.objects.filter(pk=task_id).first()
    if row is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    if row.version != expected_version:
        raise _conflict(task_id, expected_version, row.version)
    if row.status not in permitted(change.kind, call.actor):
        raise _not_permitted(task_id, row.status, change.kind, call.actor)
    for lookup, value in staged.requires.items():
        if not Task.objects.filter(Q(pk=task_id) & Q(**{lookup: value})).exists():
            raise TASK_CONDITIONS[lookup].error()
    if (change.kind, call.actor) in NEEDS_FREE_TASK:
        raise TaskNotRunnable(
            f"task {task_id} is held by a lease: its holder makes this change, or it is released first"
        )
    raise VersionConflict(f"task {task_id} changed concurrently", expected=expected_version)


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
    lease: LeaseRef | None,
    audit: Audit,
    actor: Actor | None = None,
    snapshot: Snapshot | None = None,
    before_event: Callable[[Task, datetime], None] | None = None,
) -> Applied:
    """compare_and_set and its audit row, in one transaction: both land or neither does. The audit row's hygiene
    (``audit_check``) is judged before the change is written: a refusal writes nothing and tells no observer."""
    audit_check(action=audit.action, reason=audit.reason, impact=audit.impact, details=audit.details)
    with transaction.atomic():
        applied = compare_and_set(
            task_id, expected_version, change, lease=lease, actor=actor, snapshot=snapshot, before_event=before_event
        )
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
