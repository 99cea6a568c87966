"""The step protocol of DESIGN §4: one node in two commits.

    snap = snapshot_at(task_id=…, lease=…, expected_version=…)     # three reads: task+lease+time, nodes, operations
    d = next_directive(task_id=…, lease=…, snapshot=snap)         # reconcile / execute / wait / stop / done (*)
    step = operation_start(snap, d.node_key, lease=…)             # commit 1: the operation, "may have been sent"
    outcome = connector.submit(step.operation.op_key, step.operation.request)  # outside any transaction
    step = record_outcome(step.snapshot, op_key, outcome, lease=…)  # commit 2: receipt, node, task

(*) A read, decided purely — but the first time it stops awaiting an approval for a request, it records what is
asked (approval_proposed). A gated node's start is judged by the approval rule and records approval_executed in its
own write (tasks/decide/approval_binding.py).

A worker running a chain of nodes shares commits: ``record_outcome(…, start_next=True)`` writes a node's receipt
and, when that advances the node and the next directive is to start a fresh node, that node's operation ("may have
been sent") in the same commit — commit 2 of one node is commit 1 of the next; nothing happens outside between the
two.

Every write takes the snapshot it was decided on and returns the next one; each is a compare_and_set on the task
version and the caller's lease epoch; the decision of what it writes is tasks/decide/decisions.py's. A refusal
raises a named error and writes nothing; the caller stops and leaves its op keys to the reconciler.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db.models import Model

from leases.services import LeaseRef
from tasks.core.errors import InvalidTransition, TaskNotFound, VersionConflict
from tasks.core.outcomes import Outcome
from tasks.decide import approval_binding, decisions
from tasks.decide.change import Snapshot
from tasks.decide.decisions import Directive, resolved_input
from tasks.engine.cas import Applied, compare_and_set, project
from tasks.engine.cleanup import CLEANABLE, CleanupWork, cleanup_work
from tasks.engine.snapshot import task_snapshot
from tasks.engine.verification import approval_binding_verified, operation_request_verified
from tasks.models import Node, Operation, Task

__all__ = [
    "Directive",
    "Step",
    "agent_directive",
    "inputs_confirm",
    "next_directive",
    "operation_start",
    "record_outcome",
    "resolve_input",
    "snapshot_at",
]


def snapshot_at(
    *, task_id: int, lease: LeaseRef | None, expected_version: int, known: Snapshot | None = None
) -> Snapshot:
    """The task's snapshot if it is still at ``expected_version`` (the version the caller decided on), else
    VersionConflict: the start of every write made on a version read earlier (the agent API's If-Match). ``known``:
    an earlier snapshot of the task (task_snapshot)."""
    snap = task_snapshot(task_id=task_id, lease=lease, known=known)
    if snap.version != expected_version:
        raise VersionConflict(
            f"task {task_id} is at version {snap.version}, not {expected_version}",
            expected=expected_version,
            actual=snap.version,
        )
    return snap


def next_directive(*, task_id: int, lease: LeaseRef, snapshot: Snapshot | None = None) -> Directive:
    """What the lease holder should do next (tasks.decide.decisions.directive; a start an approval does not bind is
    a stop awaiting_approval: tasks.decide.approval_binding). A read, but for one write: the first time it stops
    awaiting an approval for a request, it records what is asked (event approval_proposed, under the lease) and
    answers at the version that left."""
    snap = snapshot if snapshot is not None else task_snapshot(task_id=task_id, lease=lease)
    d = approval_binding.gated_directive(snap, decisions.directive(snap))
    asked = approval_binding.proposal_change(snap, d)
    if asked is None:
        return d
    return replace(
        d, task_version=compare_and_set(snap.task.pk, snap.version, asked, lease=lease, snapshot=snap).version
    )


def agent_directive(
    *, task_id: int, lease: LeaseRef, snapshot: Snapshot | None = None
) -> tuple[Directive, CleanupWork | None]:
    """What an agent over the API does next: ``next_directive``, and once it says the task has ended (done, or stop
    with the end status) the cleanup of its temp resources (tasks.engine.cleanup.cleanup_work: a delete registered
    and marked sent under the lease before the answer, a lookup of one in flight, or a wait for a backoff). The
    directive's version is the one read; the cleanup's writes, if any, move the task on."""
    d = next_directive(task_id=task_id, lease=lease, snapshot=snapshot)
    if d.kind not in ("done", "stop") or d.reason not in ("", *CLEANABLE):
        return d, None
    return d, cleanup_work(task_id=task_id, lease=lease, expected_version=d.task_version)


@dataclass(frozen=True)
class Step:
    """What one write of the protocol left: the operation it wrote, the snapshot of the new version (the next step
    of the same holder reads nothing again) and, when a settlement started the next node in the same commit, that
    node's operation, to be sent next."""

    operation: Operation
    snapshot: Snapshot
    started: Operation | None = None


def operation_start(snap: Snapshot, node_key: str, *, lease: LeaseRef) -> Step:
    """Commit 1 of a node, on ``snap``: its operation registered and marked sent (or an intent sent again), before
    the external call (tasks.decide.decisions.start). ``step.operation.op_key`` is the idempotency key."""
    change, op = decisions.start(snap, node_key)
    if op.pk is not None:  # sent again: the stored request must be the one the log registered
        operation_request_verified(op)
    # A fresh start an approval gates: the rule refuses it by name, or its execution is recorded in the same write.
    executed = approval_binding.executed_change(snap, op) if op.pk is None else None
    if executed is not None:
        approval_binding_verified(approval_binding.gates_of(snap.by_key, op.node))
    applied = compare_and_set(snap.task.pk, snap.version, change, lease=lease, snapshot=snap, then=executed)
    new = applied.next_snapshot()
    return Step(new.operation(op.op_key) or op, new)


def record_outcome(
    snap: Snapshot,
    op_key: str,
    outcome: Outcome,
    *,
    lease: LeaseRef,
    settled_by: str = "",
    start_next: bool = False,
    asked_at: datetime | None = None,
    also: Callable[[Step], tuple[type[Model], dict[str, Any]]] | None = None,
) -> Step:
    """Commit 2 of a node, on ``snap``: what the remote said for ``op_key`` (from the call or a query by op key). A
    receipt that satisfies the node's evidence advances it in the same transaction; failures branch by class
    (DESIGN §6). ``start_next``: in the same commit, the start of the next node when the outcome advances this one
    and the directive on the snapshot it leaves is to execute a node not yet registered
    (tasks.decide.decisions.next_start) — ``step.started``, to be sent next. ``also``: a row inserted in the same
    write, made from the step it will leave (compare_and_set's ``also``); not called when nothing is written."""
    op = snap.operation(op_key)
    if op is None:
        raise _not_outstanding(op_key)
    change = decisions.settle(snap, op, outcome, settled_by=settled_by, asked_at=asked_at)
    if change is None:
        return Step(op, snap)
    following = None
    if start_next and decisions.shares_next_start(change):
        following = decisions.next_start(project(snap, change))
        if following is not None and approval_binding.starts_under_approval(snap, following[1].node):
            following = None  # judged by the approval rule, and its execution recorded, in a start of its own
    then = following[0] if following is not None else None

    def step_of(applied: Applied) -> Step:
        settled = applied.operations[0] if applied.operations else op
        started = applied.operations[-1] if following is not None else None
        return Step(settled, applied.next_snapshot(), started)

    row = (lambda applied: also(step_of(applied))) if also is not None else None
    applied = compare_and_set(snap.task.pk, snap.version, change, lease=lease, snapshot=snap, then=then, also=row)
    return step_of(applied)


def _not_outstanding(op_key: str) -> Exception:
    status = Operation.objects.filter(op_key=op_key).values_list("status", flat=True).first()
    if status is None:
        return TaskNotFound(f"no operation with op key {op_key!r}", op_key=op_key)
    return InvalidTransition(f"operation {op_key} is {status}: nothing outstanding to record")


def inputs_confirm(snap: Snapshot, current_versions: dict[str, str], *, lease: LeaseRef) -> Snapshot:
    """After a person handed the task back, the agent reports each input ref's current version as read from the
    real source (by name, as in ``task.input_refs``). All unchanged: the agent may go on. Any changed: the task
    pauses ``input_changed`` and goes on only by an explicit choice (re-plan, or approval). Returns the new version's
    snapshot."""
    change = decisions.confirm_inputs(snap, current_versions)
    return compare_and_set(snap.task.pk, snap.version, change, lease=lease, snapshot=snap).next_snapshot()


def resolve_input(task: Task, node: Node) -> dict[str, Any]:
    """The node's input with every ``from`` replaced by the earlier node's output (reads the plan's nodes)."""
    return resolved_input(list(Node.objects.filter(task=task, plan_version=node.plan_version)), node)
