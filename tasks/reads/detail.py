"""Every read the task detail page needs, in a fixed number of queries whatever the number of nodes, operations or
events (tests/test_detail_reads.py pins them). Reads only: nothing here writes.

- ``task_detail(task)``: the current plan's nodes with the receipt that satisfied each, the operations (unknown and
  unprovable first), the temp resources, and what the task's state waits for, computed from these live rows.
- ``lease_view(task)``: who holds the task now (or who held it last), on the database server's clock.
- ``timeline_page(task, before=…)``: the task's events merged with its audit rows, newest first, by keyset.
- ``chain_check(task)``: the task's hash chain verified now, or not checked on open when the log is long.
- ``remote_down(task)``: whether the task's remote stays unreachable — since when, how many tries, when it is asked
  next (also for the work queue's rows, read with the page, and the API's task).
"""

import base64
import binascii
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from audit.models import AuditEvent
from leases import clock
from leases.models import ForcedRelease, Lease, LeaseReservation
from leases.state import LeaseState, lease_state
from tasks.core.errors import TaskError
from tasks.core.lifecycle import (
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
    TempResourceStatus,
    task_ended,
)
from tasks.decide.evidence import evidence_problems
from tasks.decide.receipts import receipt_summary
from tasks.engine.verification import task_verify_log
from tasks.models import Event, Node, Operation, OperationPurpose, Receipt, Task, TaskWakeUp, TempResource
from tasks.querysets import UNPROVABLE
from tasks.reads.state import task_state_sentence
from tasks.reads.takeover import takeover_package

# Above this many events the page does not verify the chain on open (task_verify_log reads the whole log five
# times: measured ~40 ms at 100 events, ~60-85 ms at 200-500, ~290 ms at 2,000 on this machine's SQLite; PostgreSQL
# alike); a "check now" button does it on request, however long the log.
CHECK_ON_OPEN_MAX_EVENTS = 200
TIMELINE_PAGE_SIZE = 25

# Unknown operations first (unprovable among them first), then what is still in flight, then intents, then settled.
_OPERATION_RANK = {
    OperationStatus.UNKNOWN.value: 1,
    OperationStatus.DISPATCHED.value: 2,
    OperationStatus.ACCEPTED.value: 2,
    OperationStatus.INTENT.value: 3,
}
_IN_FLIGHT = (OperationStatus.DISPATCHED.value, OperationStatus.ACCEPTED.value)
_NOT_CLEANED = (TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value, TempResourceStatus.STUCK.value)
_UNDONE = (TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value)


class InvalidTimelineCursor(TaskError):
    code = "invalid_cursor"


@dataclass(frozen=True)
class InputLine:
    """One input of a node as a person reads it: a versioned ref, another node's output, or a literal value."""

    name: str
    kind: Literal["ref", "from", "value"]
    text: str
    version: str = ""


@dataclass(frozen=True)
class NodeRow:
    node: Node
    inputs: list[InputLine]
    evidence: list[str]
    on_failure: list[tuple[str, str]]
    receipt: Receipt | None
    receipt_op_key: str
    # Every way the receipt falls short of the node's evidence spec; empty when it satisfies it.
    receipt_problems: list[str]

    @property
    def satisfied(self) -> bool:
        return self.receipt is not None and not self.receipt_problems and self.node.status == NodeStatus.SUCCEEDED

    @property
    def receipt_fields(self) -> list[tuple[str, Any]]:
        """The receipt's fields as the log records them (tasks.decide.receipts.receipt_summary), the empty ones left
        out."""
        if self.receipt is None:
            return []
        return [(name, value) for name, value in receipt_summary(self.receipt).items() if value not in (None, "")]


@dataclass(frozen=True)
class OperationRow:
    op: Operation
    node_key: str
    receipt: Receipt | None
    unprovable: bool

    @property
    def in_flight(self) -> bool:
        return self.op.status in _IN_FLIGHT


@dataclass(frozen=True)
class Waiting:
    """What the task's state waits for, from live rows: the operations it awaits (stopping: in flight; stopped with
    pending reconciliation: unknown), and for a completed task whether every node's receipt satisfied its evidence."""

    in_flight: list[OperationRow]
    to_reconcile: list[OperationRow]
    unprovable: list[OperationRow]
    unsatisfied_nodes: list[NodeRow]
    temp_to_clean: list[TempResource]
    failed_nodes: list[NodeRow]
    backing_off_until: datetime | None
    # The page's sentence on the task's temp resources (cleanup_sentence, from their rows).
    cleanup: str = ""


@dataclass(frozen=True)
class TaskDetail:
    task: Task
    nodes: list[NodeRow]
    operations: list[OperationRow]
    temp_resources: list[TempResource]
    waiting: Waiting
    terminal: bool

    @property
    def nodes_done(self) -> int:
        return sum(1 for row in self.nodes if row.node.status == NodeStatus.SUCCEEDED)


def task_detail(task: Task) -> TaskDetail:
    """The detail of ``task`` (a row already read): 3 queries — nodes, operations with receipts, temp resources."""
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))
    operations = list(
        Operation.objects.filter(task=task).select_related("node", "receipt").order_by("registered_at", "pk")
    )
    temps = list(
        TempResource.objects.filter(task=task)
        .select_related("node", "cleanup_operation", "cleanup_receipt")
        .order_by("created_at", "pk")
    )
    paused_unprovable = task.status == TaskStatus.PAUSED and task.status_reason == PauseReason.UNPROVABLE
    op_rows = sorted(
        (_operation_row(op, paused_unprovable) for op in operations),
        key=lambda row: (0 if row.unprovable else _OPERATION_RANK.get(row.op.status, 4), row.op.registered_at),
    )
    node_rows = [_node_row(node, operations) for node in nodes]
    return TaskDetail(
        task=task,
        nodes=node_rows,
        operations=op_rows,
        temp_resources=temps,
        waiting=_waiting(node_rows, op_rows, temps),
        terminal=task_ended(task.status),
    )


def _operation_row(op: Operation, paused_unprovable: bool) -> OperationRow:
    unknown = op.status == OperationStatus.UNKNOWN
    return OperationRow(
        op=op,
        node_key=op.node.key,
        receipt=_receipt_of(op),
        unprovable=unknown and (op.failure_class == UNPROVABLE or paused_unprovable),
    )


def _receipt_of(op: Operation) -> Receipt | None:
    try:
        return op.receipt
    except Receipt.DoesNotExist:
        return None


def _node_row(node: Node, operations: list[Operation]) -> NodeRow:
    op = _satisfying_operation(node, operations)
    receipt = _receipt_of(op) if op is not None else None
    problems = evidence_problems(node, op, receipt) if op is not None and receipt is not None else []
    return NodeRow(
        node=node,
        inputs=[_input_line(name, value) for name, value in node.input.items()],
        evidence=[_evidence_line(name, spec) for name, spec in node.evidence.items()],
        on_failure=sorted((str(k), str(v)) for k, v in node.on_failure.items()),
        receipt=receipt,
        receipt_op_key=op.op_key if op is not None else "",
        receipt_problems=problems,
    )


def _satisfying_operation(node: Node, operations: list[Operation]) -> Operation | None:
    """The effect operation whose receipt the node holds as its output (a node carried over by a re-plan holds a
    receipt of its namesake in an earlier plan); else the node's latest effect receipt, if any."""
    candidates = [
        op
        for op in operations
        if op.purpose == OperationPurpose.EFFECT and op.node.key == node.key and _receipt_of(op) is not None
    ]
    if not candidates:
        return None
    if node.status == NodeStatus.SUCCEEDED:
        for op in reversed(candidates):
            receipt = _receipt_of(op)
            if receipt is not None and receipt_summary(receipt) == node.output:
                return op
    same_plan = [op for op in candidates if op.node_id == node.pk]
    return (same_plan or candidates)[-1]


def _input_line(name: str, value: Any) -> InputLine:
    if isinstance(value, dict) and isinstance(value.get("ref"), dict):
        ref = value["ref"]
        digest = f" ({ref['digest']})" if ref.get("digest") else ""
        text = f"{ref.get('source', '?')}:{ref.get('locator', '?')} at version {ref.get('version', '?')}{digest}"
        return InputLine(name, "ref", text, str(ref.get("version", "")))
    if isinstance(value, dict) and "from" in value:
        return InputLine(name, "from", f"the {value.get('field')} of node {value.get('from')}'s receipt")
    return InputLine(name, "value", _short(value))


def _evidence_line(name: str, spec: Any) -> str:
    if name == "remote_id":
        return "remote id present"
    if isinstance(spec, dict):
        source = f"input {spec.get('input')}" + (f" {spec['field']}" if spec.get("field") else "")
        return f"{name} equals the {source}"
    return f"{name} = {_short(spec)}"


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _waiting(nodes: list[NodeRow], ops: list[OperationRow], temps: list[TempResource]) -> Waiting:
    not_before = [row.node.not_before for row in nodes if row.node.not_before is not None]
    return Waiting(
        in_flight=[row for row in ops if row.in_flight],
        to_reconcile=[row for row in ops if row.op.status == OperationStatus.UNKNOWN],
        unprovable=[row for row in ops if row.unprovable],
        unsatisfied_nodes=[row for row in nodes if not row.satisfied],
        temp_to_clean=[temp for temp in temps if temp.status in _NOT_CLEANED],
        failed_nodes=[row for row in nodes if row.node.status == NodeStatus.FAILED],
        backing_off_until=min(not_before) if not_before else None,
        cleanup=cleanup_sentence(temps),
    )


def cleanup_sentence(temps: Sequence[TempResource]) -> str:
    """What the task's temp resources (all its rows) say of its cleanup, in one sentence: how many are still to
    delete — being deleted, refused for now and when they are asked again, stuck for a person — and how many are
    deleted with their cleanup receipt. It states only what the rows hold: a task shown as done does not mean its
    temp resources are gone, and "nothing left" is said only when every row is deleted."""
    if not temps:
        return "This task recorded no temp resource: nothing to clean up."
    count = Counter(str(temp.status) for temp in temps)
    deleted, stuck = count[TempResourceStatus.DELETED.value], count[TempResourceStatus.STUCK.value]
    cleaning = count[TempResourceStatus.CLEANING.value]
    left = count[TempResourceStatus.ACTIVE.value] + cleaning + stuck
    gone = f"{deleted} deleted, each with its cleanup receipt"
    if not left:
        return f"No temp resource is left to clean up: {gone}."
    waits = [t.not_before for t in temps if t.not_before is not None and t.status in _UNDONE]
    details = [f"{cleaning} being deleted"] if cleaning else []
    if waits:
        details.append(f"the remote refused for now; asked again from {min(waits):%Y-%m-%d %H:%M:%S %Z}")
    if stuck:
        details.append(f"{stuck} stuck: every delete was refused, a person must decide")
    details.append(gone)
    noun = "temp resource" if left == 1 else "temp resources"
    return f"Temp resource cleanup is still pending: {left} {noun} to delete ({'; '.join(details)})."


# --- the lease panel ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseView:
    """The task's newest lease — the open one, or the last one closed — and its state at ``now`` (database clock,
    leases.state)."""

    now: datetime
    lease: Lease | None
    reservation: LeaseReservation | None
    forced: ForcedRelease | None = None
    state: LeaseState | None = None  # the newest lease's, when there is one

    @property
    def open(self) -> bool:
        """The newest lease is not closed: live, in its grace or lapsed."""
        return self.state is not None and not self.state.closed

    @property
    def held(self) -> bool:
        """Live: its holder may write."""
        return self.state is not None and self.state.live

    @property
    def in_grace(self) -> bool:
        return self.state is not None and self.state.in_grace

    @property
    def lapsed(self) -> bool:
        return self.state is not None and self.state.lapsed

    @property
    def expires_in_seconds(self) -> int | None:
        return self.state.seconds_left if self.open and self.state else None

    @property
    def expired_seconds_ago(self) -> int | None:
        return self.state.seconds_since_expiry if self.open and self.state else None

    @property
    def grace_left_seconds(self) -> int | None:
        return self.state.grace_left_seconds if self.state else None

    @property
    def grace_seconds(self) -> int | None:
        return int(self.state.grace.total_seconds()) if self.state else None


def lease_view(task: Task) -> LeaseView:
    """2 queries (the newest lease with its forced release, the reservation) and one clock read."""
    lease = Lease.objects.filter(task=task).select_related("forced_release").order_by("-epoch").first()
    reservation = LeaseReservation.objects.filter(task=task).first()
    now = clock.now()
    if lease is None:
        return LeaseView(now=now, lease=None, reservation=reservation)
    state = lease_state(expires_at=lease.expires_at, released_at=lease.released_at, now=now)
    return LeaseView(now=now, lease=lease, reservation=reservation, forced=_forced_release_of(lease), state=state)


def _forced_release_of(lease: Lease) -> ForcedRelease | None:
    try:
        return lease.forced_release
    except ForcedRelease.DoesNotExist:
        return None


# --- the timeline ------------------------------------------------------------------------------------------------

# Within one instant an event sorts after (newer than) the audit row written beside it: the audit row records the
# decision, the event the change it made.
_EVENT, _AUDIT = 1, 0


@dataclass(frozen=True)
class TimelineEntry:
    source: Literal["event", "audit"]
    seq: int
    at: datetime
    name: str
    summary: list[str]
    actor: str = ""

    @property
    def key(self) -> tuple[datetime, int, int]:
        return (self.at, _EVENT if self.source == "event" else _AUDIT, self.seq)


def timeline_page(
    task: Task, *, before: str | None, size: int = TIMELINE_PAGE_SIZE
) -> tuple[list[TimelineEntry], str | None]:
    """Up to ``size`` entries older than the cursor ``before`` (None: the newest), newest first: the task's events
    and its audit rows, in one order by (time, source, seq). 2 queries. Keyset: an entry written while someone pages
    is newer than every cursor handed out, so no page repeats or skips one. Raises InvalidTimelineCursor."""
    if size < 1:
        raise ValueError("a page holds at least one entry")
    events = Event.objects.filter(task=task)
    audits = AuditEvent.objects.filter(task_id=task.pk)
    if before is not None:
        at, source, seq = _decode(before)
        # Older than (at, source, seq): an earlier instant, or the same instant and a lower (source, seq).
        events = events.filter(created_at__lte=at).exclude(created_at=at, seq__gte=seq if source == _EVENT else 0)
        audits = audits.filter(at__lte=at)
        if source == _AUDIT:
            audits = audits.exclude(at=at, seq__gte=seq)
    newest_events = [_event_entry(e) for e in events.order_by("-created_at", "-seq")[: size + 1]]
    newest_audits = [_audit_entry(a) for a in audits.order_by("-at", "-seq")[: size + 1]]
    merged = sorted(newest_events + newest_audits, key=lambda entry: entry.key, reverse=True)
    if len(merged) <= size:
        return merged, None
    page = merged[:size]
    return page, _encode(page[-1].key)


def _event_entry(event: Event) -> TimelineEntry:
    return TimelineEntry("event", event.seq, event.created_at, event.type, event_summary(event.payload))


def _audit_entry(row: AuditEvent) -> TimelineEntry:
    lines = []
    if row.version_before is not None or row.version_after is not None:
        lines.append(f"version {row.version_before} → {row.version_after}")
    if row.lease_epoch is not None:
        lines.append(f"lease epoch {row.lease_epoch}")
    if row.reason:
        lines.append(f"reason: {_short(row.reason, 300)}")
    if row.impact:
        lines.append(f"impact: {_short(row.impact, 300)}")
    lines += [f"{key}: {_value(value, 120)}" for key, value in sorted(row.details.items())]
    return TimelineEntry("audit", row.seq, row.at, row.action, lines, actor=f"{row.actor_kind}:{row.actor_id}")


def event_summary(payload: Any) -> list[str]:
    """An event's payload as short lines a person reads: the task's fields it set, each node's and operation's
    fields, and the references it carries."""
    if not isinstance(payload, dict):
        return [_short(payload)]
    lines = []
    task_fields = payload.get("task")
    if isinstance(task_fields, dict) and task_fields:
        lines.append("task: " + _fields(task_fields))
    for label in ("nodes", "operations"):
        rows = payload.get(label)
        for ref, fields in rows.items() if isinstance(rows, dict) else ():
            name = "node" if label == "nodes" else "operation"
            lines.append(f"{name} {ref}: " + (_fields(fields) if isinstance(fields, dict) else _short(fields)))
    data = payload.get("data")
    if isinstance(data, dict):
        lines += [f"{key}: {_value(value, 120)}" for key, value in sorted(data.items())]
    return lines


def _fields(fields: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_value(value, 60)}" for name, value in fields.items())


def _value(value: Any, limit: int) -> str:
    """A payload value in a few characters: empty as a dash, a digest by its head, JSON compact."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str) and value.startswith("sha256:"):
        return value[:19] + "…"
    if isinstance(value, dict | list):
        return _short(json.dumps(value, separators=(",", ":"), default=str), limit)
    return _short(value if isinstance(value, str) else str(value), limit)


def _encode(key: tuple[datetime, int, int]) -> str:
    at, source, seq = key
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{source}|{seq}".encode()).decode().rstrip("=")


def _decode(cursor: str) -> tuple[datetime, int, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, source, seq = text.split("|")
        at = datetime.fromisoformat(moment)
        if at.tzinfo is None or int(source) not in (_EVENT, _AUDIT):
            raise ValueError("not a timeline cursor")
        return at, int(source), int(seq)
    except (binascii.Error, UnicodeDecodeError, ValueError) as error:
        raise InvalidTimelineCursor(f"not a cursor of this timeline: {cursor[:40]!r}") from error


# --- the hash chain ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainCheck:
    checked: bool
    events: int
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.checked and self.problem is None


def chain_check(task: Task, *, force: bool = False) -> ChainCheck:
    """The task's record verified now (tasks.engine.verification, without quarantining: a page only reads), unless its
    log
    is longer than CHECK_ON_OPEN_MAX_EVENTS and ``force`` is not given. The log holds ``task.version`` events."""
    if task.version > CHECK_ON_OPEN_MAX_EVENTS and not force:
        return ChainCheck(checked=False, events=task.version)
    verdict = task_verify_log(task_id=task.pk, quarantine=False)
    return ChainCheck(checked=True, events=task.version, problem=verdict.problem)


# --- a remote that stays down -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteDown:
    """The task's remote could not be reached ``tries`` wake-ups in a row since ``since``; the next wake-up asks it
    no earlier than ``next_ask_at`` (tasks.engine.recovery.remote_down_record: growing, jittered, capped; the database
    clock). What a person on call needs to see that the task is not stuck but waiting, and until when."""

    since: datetime
    tries: int
    next_ask_at: datetime

    def wait_seconds(self, now: datetime) -> int:
        """Seconds until the next ask at ``now`` (database clock); 0 when it is due."""
        return max(0, int((self.next_ask_at - now).total_seconds()))


def remote_down(task: Task) -> RemoteDown | None:
    """The outage of the task's remote, or None (it answered last, was never tried, or the task has ended): one
    query, by primary key."""
    if task_ended(task.status):
        return None
    row = TaskWakeUp.objects.filter(task_id=task.pk, remote_down_tries__gt=0).first()
    return _remote_down(row)


def remote_down_of_row(task: Task) -> RemoteDown | None:
    """As remote_down, from a task read with ``select_related("wake_up")`` (a page of the work queue): no query."""
    if task_ended(task.status):
        return None
    try:
        row: TaskWakeUp | None = task.wake_up
    except TaskWakeUp.DoesNotExist:
        row = None
    return _remote_down(row)


def _remote_down(row: TaskWakeUp | None) -> RemoteDown | None:
    if row is None or not row.remote_down_tries or row.remote_down_since is None or row.remote_next_ask_at is None:
        return None
    return RemoteDown(since=row.remote_down_since, tries=row.remote_down_tries, next_ask_at=row.remote_next_ask_at)


def shows_takeover_package(task: Task, lease: LeaseView) -> bool:
    """A person needs the package when the task waits for one: held or last held by a person, paused, stopped with
    operations to reconcile, or a person waiting to take it over."""
    waits_for_a_person = {TaskStatus.HUMAN, TaskStatus.PAUSED, TaskStatus.STOPPED_PENDING}
    return TaskStatus(task.status) in waits_for_a_person or lease.reservation is not None


# --- the whole page ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DetailPage:
    """Everything the detail page shows of a task but its timeline (paged on its own) and its retained objects
    (the retention app sits above tasks)."""

    detail: TaskDetail
    lease: LeaseView
    check: ChainCheck
    package: dict[str, Any] | None
    remote: RemoteDown | None = None
    sentence: str = ""  # the task's state in one sentence (tasks.reads.state), from the rows read here


def detail_page(task: Task, *, force_check: bool = False) -> DetailPage:
    """task_detail, lease_view, chain_check, remote_down and, when a person is needed, the takeover package: a fixed
    number of queries (tests/test_console_detail.py pins the page's)."""
    lease = lease_view(task)
    detail = task_detail(task)
    sentence = task_state_sentence(
        task,
        nodes=[row.node for row in detail.nodes],
        operations=[row.op for row in detail.operations],
        lease=lease.lease,
        now=lease.now,
    )
    return DetailPage(
        detail=detail,
        lease=lease,
        sentence=sentence,
        check=chain_check(task, force=force_check),
        package=takeover_package(task.pk) if shows_takeover_package(task, lease) else None,
        remote=remote_down(task),
    )
