"""What a task's state is, in one sentence a person reads: the one place every page takes it from.

``state_sentence`` is a pure function of what the database holds about the task at one reading of its clock — its
status and pause reason, how many of its current plan's steps are done, the approvals a person is asked for now
(tasks.decide.approval_binding.awaited: the one rule of what waits for an approval), who holds or last held its
lease and in which state that lease is (leases.state.lease_state), and its open operations with, for those that wait
for a final "not found", the moment it becomes final (tasks.decide.decisions.not_found_final_at). It says nothing the
rows do not hold: no "first step" once a step is done, no "an agent is working" when nothing may run until a person
approves, no "nobody" for a task a person has (it names who has it, or had it), and a stopped task that waits for a
final "not found" says for which op key, until when, or a fence.

``task_state_sentence`` reads those inputs from rows a page has already read (no query of its own);
``progress_state_sentence`` from the plan's steps counted by the database instead of its rows (a page that shows
one page of a long plan's nodes).
tests/test_state_sentence.py is its table of cases.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from leases import clock
from leases.models import Lease
from leases.state import Phase, lease_state
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, NodeStatus, OperationStatus, PauseReason, TaskStatus
from tasks.core.outcomes import AWAITING_FINAL, NOT_FOUND_NOT_FINAL
from tasks.decide.approval_binding import Awaited, awaited, gated_by
from tasks.decide.decisions import not_found_final_at
from tasks.models import Node, Operation, Task

# Unknown operations whose outcome waits for a final "not found" (a fence, or the request's deadline plus skew).
_WAITS_FOR_FINAL = (AWAITING_FINAL, NOT_FOUND_NOT_FINAL)
_OPEN = {s.value for s in OPEN_OPERATION_STATUSES}


@dataclass(frozen=True)
class Holder:
    """Who holds, or last held, the task's lease, and that lease's state (leases.state.Phase) at the reading."""

    kind: str  # "agent" or "operator"
    id: str
    phase: Phase
    seconds_since_expiry: int = 0  # negative while live
    grace_left_seconds: int | None = None
    release_reason: str = ""  # a closed lease: released, forced, expired, …

    @property
    def name(self) -> str:
        return f"{'operator' if self.kind == 'operator' else 'agent'} {self.id}"


@dataclass(frozen=True)
class ApprovalWait:
    """An approval a person is asked for now (tasks.decide.approval_binding.awaited) and the steps it gates."""

    approval: str  # the approval node's key
    gated: tuple[str, ...]  # the steps that may not start until it is given
    code: str = "approval_missing"  # why: approval_missing (not given yet), approval_expired, approval_plan_moved, …


@dataclass(frozen=True)
class OpenOperation:
    op_key: str
    status: str  # an open OperationStatus
    node: str
    failure_class: str = ""
    final_at: datetime | None = None  # for an unknown one that waits for a final "not found": from when it is


_WORD = {
    TaskStatus.PENDING: "Pending",
    TaskStatus.RUNNING: "Running",
    TaskStatus.OBSERVING: "Observing",
    TaskStatus.BACKING_OFF: "Backing off",
}


def _steps(done: int, total: int) -> str:
    if total == 0:
        return "no step planned"
    return f"{done} of {total} step{'' if total == 1 else 's'} done"


def _keys(ops: Iterable[OpenOperation]) -> str:
    return ", ".join(op.op_key for op in ops)


def _at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


# Why an approval given before is asked for again (the approval rule's refusal codes).
_AGAIN = {
    "approval_expired": "the last one expired",
    "approval_plan_moved": "the last one was given under an earlier plan",
    "approval_request_changed": "the last one permits another request",
}


def _approvals(waits: Sequence[ApprovalWait]) -> str:
    """'delete-temp-copies waits for a person's approval (approve-cleanup)', for each wait."""
    parts = []
    for wait in waits:
        what = ", ".join(wait.gated) if wait.gated else "the steps after it"
        verb = "waits" if len(wait.gated) == 1 else "wait"
        if wait.code == "approval_missing":
            parts.append(f"{what} {verb} for a person's approval of {wait.approval}")
        else:
            why = _AGAIN.get(wait.code, "the last one no longer holds")
            parts.append(f"{what} {verb} for a person's new approval of {wait.approval} ({why})")
    return "; ".join(parts)


def _holder_clause(holder: Holder | None) -> str:
    """The lease as it stands, for a task that is not a person's."""
    if holder is None or holder.phase is Phase.CLOSED:
        return "no one holds its lease"
    if holder.phase is Phase.LIVE:
        return f"{holder.name} holds its lease"
    if holder.phase is Phase.GRACE:
        return f"{holder.name}'s lease expired {holder.seconds_since_expiry} s ago and is in its grace"
    return f"{holder.name}'s lease lapsed {holder.seconds_since_expiry} s ago: no one holds it"


def _person(holder: Holder | None) -> str:
    """A task taken over: who has it, or who had it — never 'nobody'."""
    if holder is None:
        return "Taken over by a person (no lease of theirs is recorded); waiting for a person to take it over"
    if holder.kind != "operator":
        return f"Taken over by a person, but {_holder_clause(holder)}"
    if holder.phase is Phase.LIVE:
        return f"Taken over by {holder.name}, who holds it now; waiting for their result and decision"
    if holder.phase is Phase.GRACE:
        return (
            f"Taken over by {holder.name}, whose lease expired {holder.seconds_since_expiry} s ago and is in its grace "
            f"for {holder.grace_left_seconds} s more: only they may renew it; waiting for their result and decision"
        )
    if holder.phase is Phase.LAPSED:
        return (
            f"Taken over by {holder.name}, whose lease lapsed {holder.seconds_since_expiry} s ago: it can write "
            "nothing; waiting for a person to take it over again and decide"
        )
    how = "force-released" if holder.release_reason == "forced" else "released"
    return (
        f"Taken over by {holder.name}, who no longer holds it (lease {how}); waiting for a person to take it over "
        "and decide"
    )


def state_sentence(
    *,
    status: str,
    reason: str = "",
    detail: str = "",
    nodes_done: int = 0,
    nodes_total: int = 0,
    approval_waits: Sequence[ApprovalWait] = (),
    holder: Holder | None = None,
    operations: Sequence[OpenOperation] = (),
    cancel_requested: bool = False,
    retry_at: datetime | None = None,
) -> str:
    """The task's state in one sentence, from what the database holds (see the module's docstring)."""
    s = TaskStatus(status)
    steps = _steps(nodes_done, nodes_total)
    in_flight = [op for op in operations if op.status in (OperationStatus.DISPATCHED, OperationStatus.ACCEPTED)]
    unknown = [op for op in operations if op.status == OperationStatus.UNKNOWN]
    tail = f" Detail: {detail}" if detail else ""
    approvals = _approvals(approval_waits)

    if s is TaskStatus.COMPLETED:
        return f"Completed: every step ({nodes_total}) succeeded with a receipt. Nothing more will happen."
    if s is TaskStatus.FAILED:
        return f"Failed: ended without completing, {steps}. Nothing more will happen.{tail}"
    if s is TaskStatus.STOPPED:
        return f"Stopped after a cancel: every operation is settled, {steps} (they stay done). Nothing more runs."
    if s is TaskStatus.QUARANTINED:
        return f"Quarantined: its event log and its stored state disagree; nothing runs until it is examined.{tail}"
    if s is TaskStatus.STOPPING:
        waits = f"{len(in_flight)} operation{'' if len(in_flight) == 1 else 's'} in flight"
        waits = f"{waits}: {_keys(in_flight)}" if in_flight else "the next worker run to record the stop"
        return f"Stopping: a cancel is recorded, nothing new starts; waiting for {waits} ({steps})."
    if s is TaskStatus.STOPPED_PENDING:
        final = [op for op in unknown if op.failure_class in _WAITS_FOR_FINAL and op.final_at is not None]
        other = [op for op in unknown if op not in final]
        parts = [f"waits for op {op.op_key} until {_at(op.final_at)} or a fence" for op in final if op.final_at]
        if other:
            count = f"{len(other)} operation{'' if len(other) == 1 else 's'}"
            parts.append(f"{count} of unknown outcome to reconcile by op key: {_keys(other)}")
        waits = "; ".join(parts) if parts else "nothing of unknown outcome is left: the next worker run stops it"
        return f"Stopped after a cancel, not yet settled: nothing runs; {waits} ({steps})."
    if s is TaskStatus.HUMAN:
        sentence = _person(holder)
        if approvals:
            sentence += f"; {approvals}"
        extra = " A cancel is recorded: nothing new starts." if cancel_requested else ""
        return f"{sentence} ({steps}).{extra}"
    if s is TaskStatus.PAUSED:
        why = {
            PauseReason.NEEDS_REPLAN.value: "the plan no longer says what is true; waiting for a re-plan",
            PauseReason.PERMISSION_REVOKED.value: "the remote refused for lack of permission; waiting for access "
            "and a person's decision",
            PauseReason.INPUT_CHANGED.value: "an input's version changed; waiting for a re-plan or an approval",
            PauseReason.BUDGET_EXHAUSTED.value: "its attempts are spent; waiting for a person to take it over",
            PauseReason.VERSION_CONFLICT.value: "the remote's version moved under it; waiting for a person's decision",
            PauseReason.UNPROVABLE.value: "the remote can neither dedupe nor answer for "
            + (f"op {_keys(unknown)}" if unknown else "an operation")
            + "; waiting for a person to settle it",
        }.get(reason, "stopped before its next step; waiting for a person's decision")
        return f"Paused: {why} ({steps}).{tail}"

    # pending, running, observing, backing off: the agent's side.
    if unknown:
        return (
            f"{_WORD[s]}: {_keys(unknown)} of unknown outcome must be reconciled by op key before "
            f"anything new starts ({steps}; {_holder_clause(holder)})."
        )
    if approvals:
        return f"Nothing runs until a person approves: {approvals} ({steps}; {_holder_clause(holder)})."
    if s is TaskStatus.OBSERVING:
        running = f"op {_keys(in_flight)} was" if in_flight else "an operation was"
        return f"Observing: {running} accepted by the remote and is still running; waiting for its result ({steps})."
    if s is TaskStatus.BACKING_OFF:
        when = f" from {_at(retry_at)}" if retry_at is not None else " later"
        return f"Backing off: a step failed and is tried again{when} ({steps}; {_holder_clause(holder)})."
    if in_flight:
        return f"{_WORD[s]}: op {_keys(in_flight)} is sent, waiting for the remote's answer ({steps})."
    if s is TaskStatus.RUNNING and holder is not None and holder.kind == "agent" and holder.phase is Phase.LIVE:
        return f"Running: {holder.name} is working through its steps ({steps})."
    if nodes_total and nodes_done == nodes_total:
        return f"{_WORD[s]}: every step is done; waiting for a worker to record the completion."
    if nodes_done == 0:
        return f"{_WORD[s]}: waiting for a worker to start its first step ({_holder_clause(holder)})."
    return f"{_WORD[s]}: {steps}; waiting for a worker to start the next ({_holder_clause(holder)})."


# --- from rows ----------------------------------------------------------------------------------------------------


def holder_of(lease: Lease | None, now: datetime) -> Holder | None:
    """The newest lease of a task (open, or the last one closed) as the sentence needs it, judged at ``now``."""
    if lease is None:
        return None
    state = lease_state(expires_at=lease.expires_at, released_at=lease.released_at, now=now)
    return Holder(
        kind=lease.holder_kind,
        id=lease.holder_id,
        phase=state.phase,
        seconds_since_expiry=state.seconds_since_expiry,
        grace_left_seconds=state.grace_left_seconds,
        release_reason=lease.release_reason or "",
    )


def approval_waits_of(found: Sequence[Awaited], nodes: list[Node]) -> list[ApprovalWait]:
    """The approvals ``awaited`` found, each with the pending steps it gates."""
    return [
        ApprovalWait(
            approval=a.approval.key,
            gated=tuple(n.key for n in gated_by(nodes, a.approval) if n.status != NodeStatus.SUCCEEDED),
            code=a.code,
        )
        for a in found
    ]


def open_operations_of(operations: Iterable[Operation]) -> list[OpenOperation]:
    """The open operations among ``operations`` (their ``node`` read with them), with when a "not found" becomes
    final for those that wait for one."""
    return [
        OpenOperation(
            op_key=op.op_key,
            status=op.status,
            node=op.node.key,
            failure_class=op.failure_class,
            final_at=not_found_final_at(op) if op.failure_class in _WAITS_FOR_FINAL else None,
        )
        for op in operations
        if op.status in _OPEN
    ]


@dataclass(frozen=True)
class Progress:
    """What the sentence reads of the current plan's nodes: how many steps are done of how many, the approvals a
    person is asked for now, and when a pending step may be tried again (the earliest ``not_before`` of a pending
    step). A page that shows one page of nodes counts these in the database (tasks.reads.detail)."""

    done: int
    total: int
    approval_waits: Sequence[ApprovalWait] = ()
    retry_at: datetime | None = None


def progress_of(task: Task, nodes: Sequence[Node], now: datetime) -> Progress:
    """The Progress of ``task`` from every node of its current plan."""
    ordered = sorted(nodes, key=lambda n: n.position)
    not_before = [n.not_before for n in ordered if n.not_before is not None and n.status == NodeStatus.PENDING]
    return Progress(
        done=sum(1 for n in ordered if n.status == NodeStatus.SUCCEEDED),
        total=len(ordered),
        approval_waits=approval_waits_at(task, ordered, now),
        retry_at=min(not_before) if not_before else None,
    )


def approval_waits_at(task: Task, nodes: Sequence[Node], now: datetime) -> list[ApprovalWait]:
    """The approvals ``task`` waits for at ``now``. ``nodes``: the current plan's nodes in plan order — every one of
    them when the plan holds an approval node (the rule reads the dependency graph); none are needed when it holds
    none."""
    ordered = list(nodes)
    return approval_waits_of(awaited(plan_version=task.plan_version, nodes=ordered, now=now), ordered)


def task_state_sentence(
    task: Task, *, nodes: Sequence[Node], operations: Iterable[Operation], lease: Lease | None, now: datetime
) -> str:
    """``state_sentence`` for ``task`` from rows already read: the current plan's ``nodes``, the task's
    ``operations`` (with their nodes), its newest ``lease`` (open or last closed) and ``now`` (the database clock)."""
    return progress_state_sentence(
        task, progress=progress_of(task, nodes, now), operations=operations, lease=lease, now=now
    )


def progress_state_sentence(
    task: Task, *, progress: Progress, operations: Iterable[Operation], lease: Lease | None, now: datetime
) -> str:
    """``state_sentence`` for ``task`` from its plan's ``progress`` (counted, not its rows), its ``operations`` (the
    open ones are read; with their nodes), its newest ``lease`` and ``now`` (the database clock)."""
    return state_sentence(
        status=task.status,
        reason=task.status_reason,
        detail=task.status_detail,
        nodes_done=progress.done,
        nodes_total=progress.total,
        approval_waits=progress.approval_waits,
        holder=holder_of(lease, now),
        operations=open_operations_of(operations),
        cancel_requested=task.cancel_requested_at is not None,
        retry_at=progress.retry_at,
    )


def read_state_sentence(task: Task) -> str:
    """``task_state_sentence`` reading its rows: the current plan's nodes, the open operations with their nodes, the
    newest lease and the database clock (3 queries and a clock read, whatever the number of rows)."""
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version))
    operations = list(Operation.objects.filter(task=task, status__in=sorted(_OPEN)).select_related("node"))
    lease = Lease.objects.filter(task=task).order_by("-epoch").first()
    return task_state_sentence(task, nodes=nodes, operations=operations, lease=lease, now=clock.now())
