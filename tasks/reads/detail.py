"""Every read the task detail page needs, in a fixed number of queries whatever the number of nodes, operations or
events (tests/test_detail_reads.py pins them). Reads only: nothing here writes.

- ``task_detail(task, nodes_page=…, operations_page=…)``: a page of the current plan's nodes with the receipt that
  satisfied each, a page of the operations (unknown and unprovable first), the temp resources, and what the task's
  state waits for, from live rows and counts the database makes — never from the page shown.
- ``lease_view(task)``: who holds the task now (or who held it last), on the database server's clock.
- ``timeline_page(task, before=…)``: the task's events merged with its audit rows, newest first, by keyset.
- ``chain_check(task)``: the task's hash chain verified now, or not checked on open when the log or the plan is long.
- ``remote_down(task)``: whether the task's remote stays unreachable — since when, how many tries, when it is asked
  next (also for the work queue's rows, read with the page, and the API's task).
- ``node_receipt(task_id=…, node_key=…)``: a node of the current plan and the last receipt of its effect (the API's
  ``GET …/nodes/{node_key}/receipt``: what an agent reads back of a step, e.g. after a crash).
"""

import base64
import binascii
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from django.db.models import Case, Count, DateTimeField, Exists, F, IntegerField, Min, Q, Sum, Value, When, Window

from audit.models import AuditEvent
from leases import clock
from leases.models import ForcedRelease, Lease, LeaseReservation
from leases.state import LeaseState, lease_state
from tasks.core.actions import approval_actions
from tasks.core.errors import TaskError
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
    TempResourceStatus,
    task_ended,
)
from tasks.core.parsing import ascii_int
from tasks.decide.approval_binding import ApprovalView, approval_views
from tasks.decide.evidence import evidence_problems
from tasks.decide.receipts import receipt_summary
from tasks.engine.verification import task_verify_log
from tasks.models import LoggedEvent, Node, Operation, OperationPurpose, Receipt, Task, TaskWakeUp, TempResource
from tasks.querysets import UNPROVABLE
from tasks.reads.state import Progress, approval_waits_at, progress_state_sentence
from tasks.reads.takeover import takeover_package

if TYPE_CHECKING:
    from django.db.models import QuerySet

# Above this many events the page does not verify the chain on open (task_verify_log reads the whole log five
# times: measured ~40 ms at 100 events, ~60-85 ms at 200-500, ~290 ms at 2,000 on this machine's SQLite; PostgreSQL
# alike); a "check now" button does it on request, however long the log.
CHECK_ON_OPEN_MAX_EVENTS = 200
# Nor above this many nodes in the current plan: the check reads every node of every plan and validates each plan
# document again (measured ~1.3 s for a plan of 10,000 nodes and 2 events on this machine's SQLite, ~0.13 ms a node).
CHECK_ON_OPEN_MAX_NODES = 500
TIMELINE_PAGE_SIZE = 25
# The page shows the current plan's nodes and the task's operations this many at a time, whatever their number: its
# queries and its size do not grow with the plan (tests/test_console_task_page_size.py).
NODES_PAGE_SIZE = 50
OPERATIONS_PAGE_SIZE = 50
# The state section names at most this many nodes of a kind (failed, short of their evidence), beside their count.
NAMED_NODES_MAX = 20
# The page lists at most this many of a task's temp resources (stuck first, then being deleted, then the others
# still to delete, then the deleted; by creation within each); the cleanup sentence counts them all in the database.
TEMP_NAMED_MAX = 20

# Unknown operations first (unprovable among them first), then what is still in flight, then intents, then settled.
_OPERATION_RANK = {
    OperationStatus.UNKNOWN.value: 1,
    OperationStatus.DISPATCHED.value: 2,
    OperationStatus.ACCEPTED.value: 2,
    OperationStatus.INTENT.value: 3,
}
_IN_FLIGHT = (OperationStatus.DISPATCHED.value, OperationStatus.ACCEPTED.value)
_OPEN = {status.value for status in OPEN_OPERATION_STATUSES}
_NOT_CLEANED = (TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value, TempResourceStatus.STUCK.value)
_UNDONE = (TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value)


class InvalidTimelineCursor(TaskError):
    code = "invalid_cursor"


class InvalidPageNumber(TaskError):
    code = "invalid_cursor"  # a link to a page, as a list's cursor: one sentence and status for both


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
    pending reconciliation: unknown), and for a completed task whether every node's receipt satisfied its evidence.
    Nodes are named up to NAMED_NODES_MAX of a kind, with their whole count beside them."""

    in_flight: list[OperationRow]
    to_reconcile: list[OperationRow]
    unprovable: list[OperationRow]
    unsatisfied_nodes: list[Node]
    unsatisfied_count: int
    temp_to_clean: list[TempResource]  # those of the named temp resources not yet deleted
    failed_nodes: list[Node]
    failed_count: int
    backing_off_until: datetime | None
    # The page's sentence on the task's temp resources (cleanup_sentence, from their rows).
    cleanup: str = ""

    @property
    def unsatisfied_unnamed(self) -> int:
        return self.unsatisfied_count - len(self.unsatisfied_nodes)

    @property
    def failed_unnamed(self) -> int:
        return self.failed_count - len(self.failed_nodes)


@dataclass(frozen=True)
class TempCounts:
    """A task's temp resources as the database counts them, by status, and the earliest moment one still to delete
    may be asked again (its not_before)."""

    active: int = 0
    cleaning: int = 0
    stuck: int = 0
    deleted: int = 0
    retry_from: datetime | None = None

    @property
    def total(self) -> int:
        return self.active + self.cleaning + self.stuck + self.deleted

    @property
    def left(self) -> int:
        return self.active + self.cleaning + self.stuck


@dataclass(frozen=True)
class Paged:
    """Where one page sits among the rows it is cut from: its number (from 1), the rows a page holds and the rows
    of every page, counted by the database."""

    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def first(self) -> int:
        """The position (from 1) of the page's first row; 0 when there is none."""
        return (self.number - 1) * self.size + 1 if self.total else 0

    @property
    def last(self) -> int:
        return min(self.total, self.number * self.size)

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def _paged(number: int, size: int, total: int) -> Paged:
    """Page ``number`` of ``total`` rows, clamped to the pages there are: a link made before a re-plan shortened the
    plan shows its last page."""
    if size < 1:
        raise ValueError("a page holds at least one row")
    pages = Paged(number=1, size=size, total=total).pages
    return Paged(number=min(max(number, 1), pages), size=size, total=total)


def page_number(text: str | None) -> int:
    """A page's number as a link carries it (``?nodes=3``): absent or empty is the first page; anything but 1 to 19
    ASCII digits raises InvalidPageNumber. A number past the last page is clamped where the rows are counted."""
    if not text:
        return 1
    number = ascii_int(text)
    if number is None:
        raise InvalidPageNumber(f"not a page number: {text[:40]!r}")
    return number


@dataclass(frozen=True)
class TaskDetail:
    """One page of the current plan's nodes and one of the task's operations, with what the whole task counts: the
    header and the state section say what the database holds, never what one page shows."""

    task: Task
    nodes: list[NodeRow]
    nodes_paged: Paged
    nodes_done: int
    operations: list[OperationRow]
    operations_paged: Paged
    temp_resources: list[TempResource]  # the first TEMP_NAMED_MAX (stuck first); ``temps`` counts them all
    temps: TempCounts
    waiting: Waiting
    terminal: bool
    # The plan's nodes the approval rule reads: all of them when the plan holds an approval node, else none.
    approval_graph: list[Node]
    # When the earliest pending node may be tried again (the state sentence's retry time).
    retry_at: datetime | None

    @property
    def nodes_total(self) -> int:
        return self.nodes_paged.total

    @property
    def temps_unnamed(self) -> int:
        """The temp resources the page does not list (the database's count less those listed)."""
        return self.temps.total - len(self.temp_resources)


def task_detail(
    task: Task,
    *,
    nodes_page: int = 1,
    operations_page: int = 1,
    nodes_size: int = NODES_PAGE_SIZE,
    operations_size: int = OPERATIONS_PAGE_SIZE,
) -> TaskDetail:
    """The detail of ``task`` (a row already read), its nodes and operations a page at a time (a page past the last
    is the last): 9 queries whatever the number of rows — the plan's counts, a page of nodes, the receipts of those
    nodes, the operations' count, a page of operations, the open operations, the failed nodes, the plan whole if it
    holds an approval node, the first temp resources with all of them counted — and 2 more for a completed task,
    whose every node's receipt is checked again against its evidence spec."""
    plan = Node.objects.filter(task=task, plan_version=task.plan_version)
    counts = plan.aggregate(
        total=Count("pk"),
        done=Count("pk", filter=Q(status=NodeStatus.SUCCEEDED.value)),
        failed=Count("pk", filter=Q(status=NodeStatus.FAILED.value)),
        backing_off_until=Min("not_before"),
        retry_at=Min("not_before", filter=Q(status=NodeStatus.PENDING.value)),
    )
    nodes_paged = _paged(nodes_page, nodes_size, counts["total"])
    offset = (nodes_paged.number - 1) * nodes_size
    nodes = list(plan.order_by("position")[offset : offset + nodes_size])
    receipted = _receipted_effects(
        Operation.objects.filter(task=task, node__key__in=[node.key for node in nodes])
        if nodes
        else Operation.objects.none()
    )
    paused_unprovable = task.status == TaskStatus.PAUSED and task.status_reason == PauseReason.UNPROVABLE
    operations = Operation.objects.filter(task=task).select_related("node", "receipt")
    operations_paged = _paged(operations_page, operations_size, operations.count())
    offset = (operations_paged.number - 1) * operations_size
    shown_ops = _ranked(operations, paused_unprovable)[offset : offset + operations_size]
    open_ops = _ranked(operations.filter(status__in=sorted(_OPEN)), paused_unprovable)
    failed = list(plan.filter(status=NodeStatus.FAILED.value).order_by("position")[:NAMED_NODES_MAX])
    graph = list(plan.filter(Exists(plan.filter(action__in=approval_actions()))).order_by("position"))
    temps, temp_counts = _temps(task)
    unsatisfied = _unsatisfied(task) if task.status == TaskStatus.COMPLETED else []
    open_rows = [_operation_row(op, paused_unprovable) for op in open_ops]
    return TaskDetail(
        task=task,
        nodes=[_node_row(node, receipted.get(node.key, [])) for node in nodes],
        nodes_paged=nodes_paged,
        nodes_done=counts["done"],
        operations=[_operation_row(op, paused_unprovable) for op in shown_ops],
        operations_paged=operations_paged,
        temp_resources=temps,
        temps=temp_counts,
        waiting=Waiting(
            in_flight=[row for row in open_rows if row.in_flight],
            to_reconcile=[row for row in open_rows if row.op.status == OperationStatus.UNKNOWN],
            unprovable=[row for row in open_rows if row.unprovable],
            unsatisfied_nodes=unsatisfied[:NAMED_NODES_MAX],
            unsatisfied_count=len(unsatisfied),
            temp_to_clean=[temp for temp in temps if temp.status in _NOT_CLEANED],
            failed_nodes=failed,
            failed_count=counts["failed"],
            backing_off_until=counts["backing_off_until"],
            cleanup=cleanup_sentence_of(temp_counts),
        ),
        terminal=task_ended(task.status),
        approval_graph=graph,
        retry_at=counts["retry_at"],
    )


def _temps(task: Task) -> tuple[list[TempResource], TempCounts]:
    """The task's first TEMP_NAMED_MAX temp resources (stuck first, then being deleted, then the others still to
    delete, then the deleted; by creation within each) and every one of them counted by status: one query, each row
    carrying the counts over all the task's rows (window aggregates, computed before the limit)."""

    def counted(status: str) -> Window:
        return Window(Sum(Case(When(status=status, then=Value(1)), default=Value(0), output_field=IntegerField())))

    undone_not_before = Case(When(status__in=_UNDONE, then=F("not_before")), output_field=DateTimeField())
    rank = Case(
        When(status=TempResourceStatus.STUCK.value, then=Value(0)),
        When(status=TempResourceStatus.CLEANING.value, then=Value(1)),
        When(status=TempResourceStatus.ACTIVE.value, then=Value(2)),
        default=Value(3),
        output_field=IntegerField(),
    )
    rows = list(
        TempResource.objects.filter(task=task)
        .select_related("node", "cleanup_operation", "cleanup_receipt")
        .annotate(
            n_active=counted(TempResourceStatus.ACTIVE.value),
            n_cleaning=counted(TempResourceStatus.CLEANING.value),
            n_stuck=counted(TempResourceStatus.STUCK.value),
            n_deleted=counted(TempResourceStatus.DELETED.value),
            undone_retry_from=Window(Min(undone_not_before)),
            rank=rank,
        )
        .order_by("rank", "created_at", "pk")[:TEMP_NAMED_MAX]
    )
    if not rows:
        return [], TempCounts()
    first: Any = rows[0]
    named: list[TempResource] = [*rows]
    counts = TempCounts(
        active=first.n_active,
        cleaning=first.n_cleaning,
        stuck=first.n_stuck,
        deleted=first.n_deleted,
        retry_from=first.undone_retry_from,
    )
    return named, counts


def _ranked(operations: "QuerySet[Operation]", paused_unprovable: bool) -> "QuerySet[Operation]":
    """``operations`` unknown first (unprovable among them first), then in flight, then intents, then settled; by
    registration within each. An unknown operation of a task paused as unprovable is unprovable."""
    unknown = Q(status=OperationStatus.UNKNOWN.value)
    unprovable = unknown if paused_unprovable else unknown & Q(failure_class=UNPROVABLE)
    rank = Case(
        When(unprovable, then=Value(0)),
        *(When(status=status, then=Value(rank)) for status, rank in _OPERATION_RANK.items()),
        default=Value(4),
        output_field=IntegerField(),
    )
    return operations.alias(rank=rank).order_by("rank", "registered_at", "pk")


def _unsatisfied(task: Task) -> list[Node]:
    """The current plan's nodes, in plan order, with no receipt meeting their evidence spec now: every node is
    read, with every receipted effect operation of the task (2 queries) — a completed task says every one met it."""
    receipted = _receipted_effects(Operation.objects.filter(task=task))
    nodes = Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position")
    return [node for node in nodes if not _satisfied(node, receipted.get(node.key, []))]


def _satisfied(node: Node, candidates: list[Operation]) -> bool:
    """NodeRow.satisfied, without the rest of the row."""
    _, receipt, problems = _evidence_of(node, candidates)
    return receipt is not None and not problems and node.status == NodeStatus.SUCCEEDED


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


def _receipted_effects(operations: "QuerySet[Operation]") -> dict[str, list[Operation]]:
    """The effect operations among ``operations`` that hold a receipt, by their node's key (a node carried over by
    a re-plan holds a receipt of its namesake in an earlier plan), in registration order: one query."""
    found: dict[str, list[Operation]] = {}
    rows = (
        operations.filter(purpose=OperationPurpose.EFFECT, receipt__isnull=False)
        .select_related("node", "receipt")
        .order_by("registered_at", "pk")
    )
    for op in rows:
        found.setdefault(op.node.key, []).append(op)
    return found


def _evidence_of(node: Node, candidates: list[Operation]) -> tuple[Operation | None, Receipt | None, list[str]]:
    """The operation whose receipt ``node`` is judged by, that receipt, and every way it falls short of the node's
    evidence spec."""
    op = _satisfying_operation(node, candidates)
    receipt = _receipt_of(op) if op is not None else None
    problems = evidence_problems(node, op, receipt) if op is not None and receipt is not None else []
    return op, receipt, problems


def _node_row(node: Node, candidates: list[Operation]) -> NodeRow:
    op, receipt, problems = _evidence_of(node, candidates)
    return NodeRow(
        node=node,
        inputs=[_input_line(name, value) for name, value in node.input.items()],
        evidence=[_evidence_line(name, spec) for name, spec in node.evidence.items()],
        on_failure=sorted((str(k), str(v)) for k, v in node.on_failure.items()),
        receipt=receipt,
        receipt_op_key=op.op_key if op is not None else "",
        receipt_problems=problems,
    )


def _satisfying_operation(node: Node, candidates: list[Operation]) -> Operation | None:
    """Among ``candidates`` (the receipted effect operations of nodes named as ``node`` is, in registration order):
    the one whose receipt the node holds as its output (a node carried over by a re-plan holds a receipt of its
    namesake in an earlier plan); else the node's latest, if any."""
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


def cleanup_sentence(temps: Sequence[TempResource]) -> str:
    """``cleanup_sentence_of`` the task's temp resources given as rows (all of them)."""
    count = Counter(str(temp.status) for temp in temps)
    waits = [t.not_before for t in temps if t.not_before is not None and t.status in _UNDONE]
    return cleanup_sentence_of(
        TempCounts(
            active=count[TempResourceStatus.ACTIVE.value],
            cleaning=count[TempResourceStatus.CLEANING.value],
            stuck=count[TempResourceStatus.STUCK.value],
            deleted=count[TempResourceStatus.DELETED.value],
            retry_from=min(waits) if waits else None,
        )
    )


def cleanup_sentence_of(counts: TempCounts) -> str:
    """What the task's temp resources (all its rows, counted) say of its cleanup, in one sentence: how many are still
    to delete — being deleted, refused for now and when they are asked again, stuck for a person — and how many are
    deleted with their cleanup receipt. It states only what the rows hold: a task shown as done does not mean its
    temp resources are gone, and "nothing left" is said only when every row is deleted."""
    if not counts.total:
        return "This task recorded no temp resource: nothing to clean up."
    deleted, stuck, cleaning, left = counts.deleted, counts.stuck, counts.cleaning, counts.left
    gone = f"{deleted} deleted, each with its cleanup receipt"
    if not left:
        return f"No temp resource is left to clean up: {gone}."
    details = [f"{cleaning} being deleted"] if cleaning else []
    if counts.retry_from is not None:
        details.append(f"the remote refused for now; asked again from {counts.retry_from:%Y-%m-%d %H:%M:%S %Z}")
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
    events = LoggedEvent.objects.filter(task=task)
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


def _event_entry(event: LoggedEvent) -> TimelineEntry:
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
    nodes: int = 0  # the current plan's, when the check was left for a person to ask for

    @property
    def long_plan(self) -> bool:
        return self.nodes > CHECK_ON_OPEN_MAX_NODES

    @property
    def ok(self) -> bool:
        return self.checked and self.problem is None


def chain_check(task: Task, *, force: bool = False, nodes: int = 0) -> ChainCheck:
    """The task's record verified now (tasks.engine.verification, without quarantining: a page only reads), unless its
    log is longer than CHECK_ON_OPEN_MAX_EVENTS or its current plan (``nodes``, counted by the caller) longer than
    CHECK_ON_OPEN_MAX_NODES, and ``force`` is not given. The log holds ``task.version`` events."""
    if (task.version > CHECK_ON_OPEN_MAX_EVENTS or nodes > CHECK_ON_OPEN_MAX_NODES) and not force:
        return ChainCheck(checked=False, events=task.version, nodes=nodes)
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
    approvals: list[ApprovalView]
    remote: RemoteDown | None = None
    sentence: str = ""  # the task's state in one sentence (tasks.reads.state), from the rows and counts read here


def detail_page(task: Task, *, force_check: bool = False, nodes_page: int = 1, operations_page: int = 1) -> DetailPage:
    """task_detail (page ``nodes_page`` of the nodes, ``operations_page`` of the operations), lease_view,
    chain_check, remote_down and, when a person is needed, the takeover package: a fixed number of queries whatever
    the number of nodes (tests/test_console_detail.py and tests/test_console_task_page_size.py pin the page's)."""
    lease = lease_view(task)
    detail = task_detail(task, nodes_page=nodes_page, operations_page=operations_page)
    progress = Progress(
        done=detail.nodes_done,
        total=detail.nodes_total,
        approval_waits=approval_waits_at(task, detail.approval_graph, lease.now),
        retry_at=detail.retry_at,
    )
    sentence = progress_state_sentence(
        task,
        progress=progress,
        operations=[row.op for row in detail.waiting.to_reconcile + detail.waiting.in_flight],
        lease=lease.lease,
        now=lease.now,
    )
    return DetailPage(
        detail=detail,
        lease=lease,
        sentence=sentence,
        check=chain_check(task, force=force_check, nodes=detail.nodes_total),
        package=takeover_package(task.pk) if shows_takeover_package(task, lease) else None,
        approvals=approval_views(plan_version=task.plan_version, nodes=detail.approval_graph, now=lease.now),
        remote=remote_down(task),
    )


@dataclass(frozen=True)
class NodeReceipt:
    node: Node
    # The node's last effect that has a receipt, with it (select_related): once the node succeeded, the one that
    # advanced it (nothing is sent for a node after that). None: no effect of it has a receipt yet.
    operation: Operation | None


def node_receipt(*, task_id: int, node_key: str) -> NodeReceipt | None:
    """The current plan's node ``node_key`` and the last receipt recorded for its effect, under any plan of the task
    (a node a re-plan kept is the same step: its receipt was recorded under the plan it ran in). None: the current
    plan has no such node. Two queries."""
    node = Node.objects.filter(
        task_id=task_id, key=node_key, plan_version=Task.objects.filter(pk=task_id).values("plan_version")[:1]
    ).first()
    if node is None:
        return None
    effects = Operation.objects.filter(
        task_id=task_id, node__key=node_key, purpose=OperationPurpose.EFFECT, receipt__isnull=False
    )
    return NodeReceipt(node, effects.select_related("receipt").order_by("-receipt__received_at", "-pk").first())
