"""A version-stamped read of one task: everything a step decides on, in three queries.

The compare-and-set that applies a change guards it with the snapshot's version, so every decision made on a
snapshot is made on what the database holds at that version (every change of the rows read here bumps it).
After a write the compare-and-set returns the snapshot of the new version, built from the rows it wrote — the
next step of the same holder reads nothing again.
"""

import json
import threading
from collections import Counter, OrderedDict
from dataclasses import replace
from datetime import datetime
from functools import cache
from typing import Any, NamedTuple

from django.db import connection

from leases import clock
from leases.db import step_cursor
from leases.services import LeaseRef
from leases.state import open_sql
from tasks import rows
from tasks.core.errors import TaskNotFound, VersionConflict
from tasks.core.lifecycle import UNSETTLED_OPERATION_STATUSES, OperationStatus
from tasks.decide.change import PlanNodes, Snapshot
from tasks.engine.events import PLAN_ACCEPTED
from tasks.models import Node, Operation, Task

_UNSETTLED = [s.value for s in UNSETTLED_OPERATION_STATUSES]


def task_snapshot(*, task_id: int, lease: LeaseRef | None = None, known: Snapshot | None = None) -> Snapshot:
    """Read the task with its lease, reservation and the database time (one query), its unsettled operations (one)
    and the current plan's nodes (one). Raises TaskNotFound.

    ``known``: a snapshot of this task read or written earlier (RecentSnapshots). When the task row just read is
    still at its version, its nodes and operations are the ones the database holds (every change of them moves the
    version), so the two reads are skipped: the row, the time, the reservation and the lease are always read anew.

    The three reads are one snapshot of one version: every change of these rows moves the task's version in the
    same commit, and the last read also reads the version again — if another commit landed after the task row was
    read, the version differs and the snapshot is read again (a torn read would pair one version with another's
    rows: a wrong directive, or a refusal naming a condition no version showed)."""
    for _attempt in range(_ATTEMPTS):
        snap = _read(task_id, lease, known)
        if snap is not None:
            return snap
    raise VersionConflict(f"task {task_id} kept changing while it was read; read it again", task_id=task_id)


_ATTEMPTS = 5


class RecentSnapshots:
    """The last snapshot a process read or wrote of each task, as ``task_snapshot(known=…)`` takes it: a holder's next
    request over HTTP then reads one row, not the task's nodes and operations, as a worker in process reads nothing
    again after its own write. Bounded by the rows it holds (least recently kept dropped first); thread-safe.

    Keep only what a commit made visible (``transaction.on_commit``): a snapshot a rolled-back write left would name
    a version a later commit reuses with other rows. A kept snapshot is never changed (every write copies the rows it
    changes, tasks.engine.cas and ``after_write``)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._by_task: OrderedDict[int, tuple[Snapshot, int]] = OrderedDict()
        self._rows = 0
        self._database: tuple[str, str] | None = None  # the last connection's (vendor, name)

    def clear(self, **_signal: Any) -> None:
        """Forget every snapshot."""
        with self._lock:
            self._by_task.clear()
            self._rows = 0

    def connected(self, connection: Any, **_signal: Any) -> None:
        """A new database connection (``connection_created``): on a server, it may reach another one — a failover to
        a standby that may not hold the versions kept here — so every snapshot is forgotten. A SQLite file has no
        other server: its snapshots are kept while the connection opens the same file (a process that opens one
        connection per request thread, as ``runserver`` does, would otherwise keep nothing)."""
        database = (connection.vendor, str(connection.settings_dict.get("NAME")))
        with self._lock:
            if connection.vendor == "sqlite" and database == self._database:
                return
            self._database = database
        self.clear()

    def get(self, task_id: int) -> Snapshot | None:
        with self._lock:
            kept = self._by_task.get(task_id)
            return kept[0] if kept is not None else None

    def take(self, task_id: int) -> Snapshot | None:
        """The task's snapshot, no longer held: whoever takes it keeps the one it ends at, if it ends well."""
        with self._lock:
            kept = self._by_task.pop(task_id, None)
            if kept is None:
                return None
            self._rows -= kept[1]
            return kept[0]

    def keep(self, snap: Snapshot) -> None:
        """Hold ``snap`` for its task unless a later version of the same task is held already."""
        size = 1 + len(snap.nodes) + len(snap.unsettled)
        with self._lock:
            held = self._by_task.get(snap.task.id)
            if held is not None:
                if held[0].task.uid == snap.task.uid and held[0].version > snap.version:
                    return
                self._rows -= held[1]
                del self._by_task[snap.task.id]
            if size > self.max_rows:
                return
            self._by_task[snap.task.id] = (snap, size)
            self._rows += size
            while self._rows > self.max_rows:
                _task, (_snap, dropped) = self._by_task.popitem(last=False)
                self._rows -= dropped


def _read(task_id: int, lease: LeaseRef | None, known: Snapshot | None) -> Snapshot | None:
    now_sql, clock_params = clock.now_sql()
    now_params: list[Any] = [connection.ops.adapt_datetimefield_value(value) for value in clock_params]
    if not clock_params:  # the database's clock: SQLite's expression holds % signs, doubled in a statement with params
        now_sql = now_sql.replace("%", "%%")
    lease_params = [lease.pk, lease.epoch] if lease is not None else [None, None]
    statements = _statements()
    with step_cursor() as cursor:
        cursor.execute(statements.task.format(now=now_sql), [*now_params, *lease_params, task_id])
        row = cursor.fetchone()
        if row is None:
            raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
        task = rows.Columns.of(Task).instance(row)
        extra = row[len(rows.Columns.of(Task).fields) :]
        now = clock.as_utc(extra[0])
        reserved_for: str = extra[1]
        lease_expires_at = clock.as_utc(extra[2]) if lease is not None and extra[2] is not None else None
        if known is not None and known.task.uid == task.uid and known.version == task.version:
            return replace(known, task=task, now=now, lease_expires_at=lease_expires_at, reserved_for=reserved_for)
        cursor.execute(statements.operations, [task_id, *_UNSETTLED])
        operations = rows.Columns.of(Operation)
        nodes_of_ops = rows.Columns.of(Node)
        unsettled = []
        for row in cursor.fetchall():
            op = operations.instance(row)
            op.node = nodes_of_ops.instance(row[len(operations.fields) :])
            unsettled.append(op)
        if known is not None and _nodes_unchanged_since(cursor, known, task):
            # The log between the two versions changed no node (and rejected no operation: a node's retries): the
            # known snapshot's nodes are this version's. A commit after the task row was read is caught below.
            cursor.execute(statements.version, [task_id])
            found = cursor.fetchone()
            if found is None or found[0] != task.version:
                return None
            by_id = known.positions.by_id
            for op in unsettled:
                position = by_id.get(op.node_id)
                if position is not None:
                    op.node = known.nodes[position]
            return replace(
                known,
                task=task,
                unsettled=tuple(unsettled),
                now=now,
                lease_expires_at=lease_expires_at,
                reserved_for=reserved_for,
            )
        cursor.execute(statements.nodes, [OperationStatus.REJECTED.value, task_id, task_id, task.plan_version])
        node_rows = rows.Columns.of(Node)
        nodes = []
        version_now = None
        for row in cursor.fetchall():
            node = node_rows.instance(row)
            node.retries, version_now = row[len(node_rows.fields) :]  # type: ignore[attr-defined]
            nodes.append(node)
        if not nodes:  # no plan yet: ask the version itself
            cursor.execute(statements.version, [task_id])
            found = cursor.fetchone()
            version_now = found[0] if found else None
    if version_now != task.version:
        return None
    by_pk = {n.pk: n for n in nodes}
    for op in unsettled:
        if op.node_id in by_pk:
            op.node = by_pk[op.node_id]
    return Snapshot(
        task=task,
        nodes=tuple(nodes),
        unsettled=tuple(unsettled),
        now=now,
        lease_expires_at=lease_expires_at,
        reserved_for=reserved_for,
    )


# How many versions back a known snapshot may be and still lend its nodes (its log read between): a holder's next
# request after a cleanup's writes, not a task someone else moved on far.
DELTA_VERSIONS = 16


def _nodes_unchanged_since(cursor: Any, known: Snapshot, task: Task) -> bool:
    """Whether no event after ``known``'s version up to ``task``'s changed a node of the plan or rejected an
    operation (what a node's ``retries`` counts): read from the log, which every change of those rows writes."""
    if known.task.uid != task.uid or known.task.plan_version != task.plan_version:
        return False
    if not known.version < task.version <= known.version + DELTA_VERSIONS:
        return False
    cursor.execute(_statements().events, [task.id, known.version, task.version])
    found = cursor.fetchall()
    if len(found) != task.version - known.version:
        return False
    return all(
        lends_nodes(event_type, json.loads(payload) if isinstance(payload, str | bytes) else payload)
        for event_type, payload in found
    )


def lends_nodes(event_type: str, payload: Any) -> bool:
    """Whether an event leaves every node of the plan as it was: it writes no node, accepts no plan and rejects no
    operation (a node's ``retries`` counts its rejected operations)."""
    if event_type == PLAN_ACCEPTED or not isinstance(payload, dict) or payload.get("nodes"):
        return False
    changed = payload.get("operations") or {}
    if not isinstance(changed, dict):
        return False
    rejected = OperationStatus.REJECTED.value
    return all(isinstance(fields, dict) and fields.get("status") != rejected for fields in changed.values())


class _Statements(NamedTuple):
    task: str
    operations: str
    nodes: str
    version: str
    events: str


@cache
def _statements() -> _Statements:
    """The reads, in SQL made once from the models' columns (the ORM compiled them on every read: most of a
    snapshot's cost)."""
    task, op, node = rows.Columns.of(Task), rows.Columns.of(Operation), rows.Columns.of(Node)
    statuses = ", ".join(["%s"] * len(_UNSETTLED))
    # Only column names from the models' own metadata are formatted in: no text from outside.
    task_sql = (
        f"SELECT {task.columns('t')}, {{now}},"  # noqa: S608
        " COALESCE((SELECT r.holder_id FROM leases_leasereservation r WHERE r.task_id = t.id LIMIT 1), ''),"
        " (SELECT l.expires_at FROM leases_lease l WHERE l.id = %s AND l.task_id = t.id AND l.epoch = %s"
        f" AND {open_sql('l')})"  # open: the decision judges it live or not (Snapshot.lease_live)
        " FROM tasks_task t WHERE t.id = %s"
    ).replace("{{now}}", "{now}")
    operations_sql = (
        f"SELECT {op.columns('o')}, {node.columns('n')}"  # noqa: S608
        " FROM tasks_operation o JOIN tasks_node n ON n.id = o.node_id"
        f" WHERE o.task_id = %s AND o.status IN ({statuses}) ORDER BY o.registered_at, o.id"
    )
    nodes_sql = (
        f"SELECT {node.columns('n')},"  # noqa: S608
        " (SELECT COUNT(*) FROM tasks_operation o WHERE o.node_id = n.id AND o.status = %s),"
        " (SELECT t.version FROM tasks_task t WHERE t.id = %s)"
        " FROM tasks_node n WHERE n.task_id = %s AND n.plan_version = %s ORDER BY n.position"
    )
    events_sql = "SELECT type, payload FROM tasks_event_log WHERE task_id = %s AND seq > %s AND seq <= %s ORDER BY seq"
    return _Statements(task_sql, operations_sql, nodes_sql, "SELECT version FROM tasks_task WHERE id = %s", events_sql)


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
    # An operation the write rejected is one more of its node's retries: its next op key is a new one.
    was_unsettled = {op.id for op in snap.unsettled}
    rejected = Counter(
        op.node_id for op in operations if op.status == OperationStatus.REJECTED and op.id in was_unsettled
    )
    # Only the nodes the write changed are copied (the old snapshot stays as it was); the others are shared, at the
    # positions the old snapshot's plan gave them: the cost is the write's, not the plan's.
    positions = snap.positions
    copied: dict[int, Node] = {}
    succeeded_from = snap.succeeded_from
    for node_id in nodes.keys() | rejected.keys():
        position = positions.by_id.get(node_id)
        if position is None:
            continue
        node = rows.clone(snap.nodes[position])
        for name, value in (nodes.get(node_id) or {}).items():
            setattr(node, name, value)
        if node_id in rejected:
            node.retries = getattr(node, "retries", 0) + rejected[node_id]  # type: ignore[attr-defined]
        copied[position] = node
        succeeded_from = min(succeeded_from, position)
    laid = snap.nodes if isinstance(snap.nodes, PlanNodes) else PlanNodes(snap.nodes)
    new_nodes = laid.replaced(copied) if copied else snap.nodes
    written = {op.id: op for op in operations}
    was_written = set(written)
    kept = [written.pop(op.id, op) for op in snap.unsettled]  # the ones written replace the ones read
    unsettled = []
    for op in [*kept, *written.values()]:  # then the ones the write inserted
        position = positions.by_id.get(op.node_id)
        its_node = copied.get(position, snap.nodes[position]) if position is not None else None
        if its_node is not None and op._state.fields_cache.get("node") is not its_node:
            if op.id not in was_written:  # the old snapshot's row: a copy points to the new node, not the row itself
                op = rows.clone(op)
            op.node = its_node
        if op.status in UNSETTLED_OPERATION_STATUSES:
            unsettled.append(op)
    return replace(
        snap,
        task=task,
        nodes=new_nodes,
        unsettled=tuple(unsettled),
        now=now,
        lease_expires_at=lease_expires_at if lease_expires_at is not None else snap.lease_expires_at,
        known_positions=positions,
        succeeded_from=succeeded_from,
    )
