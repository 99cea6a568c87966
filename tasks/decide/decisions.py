"""The step's decision rules, once: pure functions of a snapshot (and an outcome) to a directive or a Change.

No database access here. What follows a committed, accepted, failed, unknown or not-found outcome, a cancel, a
pause, an exhausted budget and a compensation is decided in this module and nowhere else; tasks/engine/protocol.py
reads the snapshot, calls these and hands the Change to the compare-and-set. Tested as tables of cases without a
database (tests/test_decisions.py).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from django.conf import settings
from django.db.models import F

from audit.hygiene import canonical_json, check_payload, digest_of
from tasks import rows
from tasks.core import opkeys
from tasks.core.actions import is_approval
from tasks.core.errors import (
    BackoffActive,
    BudgetExhausted,
    CancelRequested,
    EvidenceInsufficient,
    InputsRecheckRequired,
    InvalidTransition,
    NodeNotReady,
    NotFoundNotFinal,
    OperationsOpen,
    TakeoverRequested,
    TaskNotRunnable,
)
from tasks.core.failures import PAUSE_REASON, backoff, destination
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    RUNNABLE_TASK_STATUSES,
    ChangeKind,
    FailureClass,
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
    task_ended,
)
from tasks.core.outcomes import (
    AWAITING_FINAL,
    NOT_FOUND_NOT_FINAL,
    Accepted,
    Committed,
    Failed,
    Fenced,
    NotFound,
    Outcome,
    Unprovable,
    operation_after,
)
from tasks.decide.change import AtCommit, Change, Snapshot
from tasks.decide.evidence import evidence_problems
from tasks.decide.receipts import receipt_of, receipt_summary, succeeded_fields, temp_locators
from tasks.models import Node, Operation, OperationPurpose, Task, TempResource
from tasks.rows import node_ref

type DirectiveKind = Literal["execute", "reconcile", "wait", "stop", "done"]


@dataclass(frozen=True)
class Directive:
    kind: DirectiveKind
    task_version: int
    node_key: str = ""
    op_key: str = ""
    until: datetime | None = None
    reason: str = ""
    # reconcile: ask the remote to fence the op key (a final answer) rather than look it up — a cancel is recorded,
    # so a "not found" must be final before the operation is closed (decisions.not_found_final)
    fence: bool = False


# ------------------------------------------------------------------------------------------------ directive


def directive(snap: Snapshot) -> Directive:
    """What the lease holder should do next. Dispatched, accepted and unknown operations always come first (safe
    handover), then cancel and pauses, then an intent to send again, then the first ready node."""
    task, v = snap.task, snap.version
    if task.status == TaskStatus.COMPLETED:
        return Directive("done", v)
    if task_ended(task.status):  # failed, stopped or quarantined
        return Directive("stop", v, reason=task.status)
    if snap.lease_expires_at is None:
        return Directive("stop", v, reason="lease_lost")
    if not snap.lease_live():
        return Directive("stop", v, reason="lease_expired")
    if task.status == TaskStatus.HUMAN:
        return Directive("stop", v, reason="human_takeover")
    open_ops = snap.open_operations()
    if open_ops:
        op = open_ops[0]
        if op.failure_class == NOT_FOUND_NOT_FINAL and not not_found_final(op, snap.now):
            # Not found, not final yet: nothing to ask the remote before a late request could no longer land.
            until = not_found_final_at(op)
            return Directive("wait", v, node_key=op.node.key, op_key=op.op_key, until=until, reason=NOT_FOUND_NOT_FINAL)
        fence = task.cancel_requested_at is not None or op.failure_class == AWAITING_FINAL
        return Directive("reconcile", v, node_key=op.node.key, op_key=op.op_key, reason=op.status, fence=fence)
    if task.cancel_requested_at is not None:
        return Directive("stop", v, reason="cancel_requested")
    if snap.reserved_for:
        return Directive("stop", v, reason="takeover_requested")
    if task.status == TaskStatus.PAUSED:
        return Directive("stop", v, reason=task.status_reason)
    if task.inputs_recheck_required:
        return Directive("reconcile", v, reason="recheck_inputs")
    intents = snap.intents()
    if intents:
        op = intents[0]
        if op.dispatch_count == 0 and _out_of_budget(task, op.node):
            return Directive("stop", v, node_key=op.node.key, op_key=op.op_key, reason="budget_exhausted")
        return Directive("execute", v, node_key=op.node.key, op_key=op.op_key, reason="intent_registered")
    first = snap.succeeded_before()  # every node before it succeeded: none of them is ready
    by_key = snap.by_key
    for node in snap.nodes_from(first):
        if node.status != NodeStatus.PENDING or not all(
            by_key[dep].status == NodeStatus.SUCCEEDED for dep in node.depends_on
        ):
            continue
        if is_approval(node.action):
            return Directive("stop", v, node_key=node.key, reason="awaiting_approval")
        if _out_of_budget(task, node):
            return Directive("stop", v, node_key=node.key, reason="budget_exhausted")
        if node.not_before is not None and node.not_before > snap.now:
            return Directive("wait", v, node_key=node.key, until=node.not_before, reason=node.last_error_class)
        return Directive("execute", v, node_key=node.key)
    if snap.nodes and first == len(snap.nodes):
        return Directive("done", v)
    return Directive("stop", v, reason="no_ready_node")


def _out_of_budget(task: Task, node: Node) -> bool:
    return node.attempts >= node.max_attempts or task.attempts_used >= task.attempt_budget


# ------------------------------------------------------------------------------------------------ start


def resolved_input(nodes: Sequence[Node] | Mapping[str, Node], node: Node) -> dict[str, Any]:
    """The node's input with every ``from`` replaced by the earlier node's structured output. ``nodes``: the plan's
    nodes, or them by key (``Snapshot.by_key``)."""
    by_key = nodes if isinstance(nodes, Mapping) else {n.key: n for n in nodes}
    resolved: dict[str, Any] = {}
    for name, value in node.input.items():
        if isinstance(value, dict) and "from" in value:
            source = by_key.get(value["from"])
            if source is None or source.status != NodeStatus.SUCCEEDED:
                raise NodeNotReady(f"node {node.key} reads {value['from']}, which has not succeeded")
            resolved[name] = source.output.get(value["field"])
        elif isinstance(value, dict) and "ref" in value:
            resolved[name] = dict(value["ref"])
        else:
            resolved[name] = value
    return resolved


def start(snap: Snapshot, node_key: str) -> tuple[Change, Operation]:
    """Register ``node_key``'s operation and mark it sent, in one change: the operation row exists, as "may have
    been sent", before the call. A crash before the call is settled by a query by op key (not found → sent again
    with the same key). An intent left by such a "not found" is sent again under its own key. The first send of
    an op key spends one attempt of the node's and the task's budgets; sending the same key again does not."""
    task = snap.task
    node = snap.node(node_key)
    intent = next((op for op in snap.intents() if op.node.key == node_key), None)
    if node is None and intent is None:
        raise NodeNotReady(f"plan version {task.plan_version} has no node {node_key!r}")
    _check_startable(snap)
    if intent is not None:
        return _send_again(snap, intent), intent
    if node is None:
        raise NodeNotReady(f"plan version {task.plan_version} has no node {node_key!r}")
    if snap.intents():
        raise OperationsOpen(
            f"operation {snap.intents()[0].op_key} is registered and not sent: send or settle it first"
        )
    if is_approval(node.action):
        raise NodeNotReady(f"node {node_key} is a confirmation point: a person approves it")
    if node.status != NodeStatus.PENDING:
        raise NodeNotReady(f"node {node_key} is {node.status}")
    by_key = snap.by_key
    waiting = [key for key in node.depends_on if by_key[key].status != NodeStatus.SUCCEEDED]
    if waiting:
        raise NodeNotReady(f"node {node_key} waits for {', '.join(waiting)}")
    _check_budget(task, node)
    if node.not_before is not None and node.not_before > snap.now:
        raise BackoffActive(f"node {node.key} may not run before {node.not_before}", until=node.not_before)
    resolved = resolved_input(by_key, node)
    request = {"action": node.action, "input": resolved}
    body = canonical_json(request)  # made once: for the cap, the digest and the stored value (canonical_request)
    # The operation row's request (its event carries the digest only): not covered by the event's append.
    check_payload(request, what=f"request of node {node_key}", canonical=body)
    values = {
        "node_id": node.pk,
        "op_key": opkeys.effect(task.uid, node.plan_version, node.key, getattr(node, "retries", 0)),
        "action": node.action,
        "target": str(resolved.get("target", ""))[:300],
        "request": request,
        "request_digest": digest_of(request, canonical=body),
    }
    op = rows.new_row(Operation, values, {"node": node})
    op.canonical_request = body  # type: ignore[attr-defined]
    change = Change(
        event="operation_dispatched",
        kind=ChangeKind.START,
        task={"attempts_used": task.attempts_used + 1, **_running(task)},
        nodes=[
            (
                node,
                {
                    "status": NodeStatus.RUNNING.value,
                    "attempts": node.attempts + 1,
                    "last_attempt_at": AtCommit(),
                    "next_allowed_action": "",
                },
            )
        ],
        operations=[(op, {"status": OperationStatus.DISPATCHED.value, "dispatch_count": 1, **_deadline()})],
        data={"op_key": op.op_key, "request_digest": op.request_digest, "node": node_ref(node)},
        requires=_START_REQUIRES | _SPENDS,
        node_requires={node.pk: _NODE_SPENDS},
    )
    return change, op


def _send_again(snap: Snapshot, op: Operation) -> Change:
    if digest_of(op.request) != op.request_digest:
        raise EvidenceInsufficient(
            f"operation {op.op_key}'s stored request does not match its registered digest: it is not sent",
            op_key=op.op_key,
        )
    first = op.dispatch_count == 0  # a compensation a person registered: its first send is an attempt
    task, node = snap.task, op.node
    task_fields: dict[str, Any] = _running(task)
    nodes: list[tuple[Node, dict[str, Any]]] = []
    if first:
        _check_budget(task, node)
        task_fields["attempts_used"] = task.attempts_used + 1
        nodes = [(node, {"attempts": node.attempts + 1, "last_attempt_at": AtCommit(), "next_allowed_action": ""})]
    return Change(
        event="operation_dispatched",
        kind=ChangeKind.START,
        task=task_fields,
        nodes=nodes,
        operations=[
            (op, {"status": OperationStatus.DISPATCHED.value, "dispatch_count": op.dispatch_count + 1, **_deadline()})
        ],
        data={"op_key": op.op_key, "request_digest": op.request_digest, "node": node_ref(node), "again": not first},
        requires=_START_REQUIRES | (_SPENDS if first else {}),
        node_requires={node.pk: _NODE_SPENDS} if first else {},
    )


def shares_next_start(change: Change) -> bool:
    """Whether the next node's start may be decided on the snapshot ``change`` leaves and written with it (one
    commit for this node's receipt and the next node's intent: nothing happens outside between the two). Only when
    ``change`` advances its node and writes nothing but updates besides its receipt."""
    return change.event == "node_succeeded" and not change.temp_resources


def next_start(snap: Snapshot) -> tuple[Change, Operation] | None:
    """On a snapshot projected from a change that ``shares_next_start``: the start of the next ready node when the
    directive there is to execute a node not yet registered; None for anything else (an intent to send again, a
    wait, a stop, the end: the next directive is read after the write, as always)."""
    d = directive(snap)
    if d.kind != "execute" or d.op_key:
        return None
    # The directive said execute: start decides on the same snapshot, and a refusal here is a disagreement between
    # the two rules — it is raised (the shared write is refused whole), never taken for "nothing to start".
    return start(snap, d.node_key)


def _deadline() -> dict[str, Any]:
    """Every send of an operation carries a deadline, from the database clock of the commit that marks it sent."""
    return {"not_after": AtCommit(settings.RECKON_REQUEST_DEADLINE)}


def not_found_final_at(op: Operation) -> datetime:
    """When a "not found" for ``op`` becomes final: its latest send's deadline plus the remote's clock skew. After
    that no request under its op key can take effect at a remote that honours the deadline."""
    if op.not_after is not None:
        deadline = op.not_after
    elif op.registered_at is not None:  # sent before operations carried a deadline: the one it would have had
        deadline = op.registered_at + settings.RECKON_REQUEST_DEADLINE
    else:  # never written, so never sent: nothing can land
        return datetime.min.replace(tzinfo=UTC)
    final_at: datetime = deadline + settings.RECKON_REMOTE_CLOCK_SKEW
    return final_at


def not_found_final(op: Operation, now: datetime) -> bool:
    """Whether a lookup's "not found" for ``op`` is final at ``now`` (the database clock): past its deadline and
    the skew allowance. Before that a request still in flight may land; only a fence (``Fenced``) is final sooner."""
    return now > not_found_final_at(op)


_START_REQUIRES: dict[str, Any] = {"cancel_requested_at__isnull": True, "inputs_recheck_required": False}


# Spending an attempt: the UPDATEs compare the rows' own columns (expressions, not reads).
_SPENDS: dict[str, Any] = {"attempts_used__lt": F("attempt_budget")}
_NODE_SPENDS: dict[str, Any] = {"attempts__lt": F("max_attempts")}


def _check_startable(snap: Snapshot) -> None:
    task = snap.task
    open_ops = snap.open_operations()
    if open_ops:
        raise OperationsOpen(f"operation {open_ops[0].op_key} is {open_ops[0].status}: reconcile it by op key first")
    if task.cancel_requested_at is not None:
        raise CancelRequested("a cancel is recorded: no new side effect")
    if snap.reserved_for:
        raise TakeoverRequested("a person asked to take this task over: no new side effect")
    if task.status not in RUNNABLE_TASK_STATUSES:
        raise TaskNotRunnable(f"task {task.pk} is {task.status}: nothing new starts", status=task.status)
    if task.inputs_recheck_required:
        raise InputsRecheckRequired("the task was handed back by a person: confirm the inputs' versions first")


def _check_budget(task: Task, node: Node) -> None:
    if task.attempts_used >= task.attempt_budget:
        raise BudgetExhausted("the task's attempt budget is used up", scope="task")
    if node.attempts >= node.max_attempts:
        raise BudgetExhausted(f"node {node.key} used its {node.max_attempts} attempts", scope="node", node=node.key)


def _running(task: Task) -> dict[str, Any]:
    return {"status": TaskStatus.RUNNING.value} if task.status != TaskStatus.RUNNING else {}


# ------------------------------------------------------------------------------------------------ settle


_RECHECK = {"inputs_recheck_required": True}
_CLEAR = {"status_reason": "", "status_detail": ""}


def settle(
    snap: Snapshot, op: Operation, outcome: Outcome, *, settled_by: str = "", asked_at: datetime | None = None
) -> Change | None:
    """What follows ``outcome`` for the open operation ``op``; None when there is nothing new to record (a query
    that itself timed out on an unknown operation, an unprovable one still unprovable). ``asked_at``: when the
    remote was asked (at the latest) — a "not found" is final only if it was asked after the request's deadline;
    by default the snapshot's time, read before the call."""
    if op.status not in OPEN_OPERATION_STATUSES:
        raise InvalidTransition(f"operation {op.op_key} is {op.status}: nothing outstanding to record")
    if isinstance(outcome, Committed):
        if not outcome.remote_id:
            raise EvidenceInsufficient(f"a receipt for {op.op_key} needs the remote id the external system gave it")
        if op.purpose == OperationPurpose.COMPENSATION:
            return _compensation_committed(snap, op, outcome)
        return _committed(snap, op, outcome, settled_by)
    interrupted = isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED
    if interrupted and op.status == OperationStatus.UNKNOWN:
        return None
    if isinstance(outcome, Unprovable) and op.status == OperationStatus.UNKNOWN and op.failure_class == "unprovable":
        return None
    task, node = snap.task, op.node
    data: dict[str, Any] = {"op_key": op.op_key, "outcome": type(outcome).__name__.lower()}
    cancelled = task.cancel_requested_at is not None
    final = not (isinstance(outcome, NotFound) and cancelled) or not_found_final(op, asked_at or snap.now)
    if isinstance(outcome, NotFound) and cancelled and not final and op.failure_class == NOT_FOUND_NOT_FINAL:
        return None  # still not found, still not final: nothing new to record
    after = operation_after(outcome, may_send_again=not cancelled, not_found_final=final)
    if isinstance(outcome, Accepted):
        return Change(
            event="operation_accepted",
            task=_after_accepted(snap, op),
            nodes=[(node, {"status": NodeStatus.OBSERVING.value})] if node.status != NodeStatus.OBSERVING else [],
            operations=[(op, after.fields() | {"remote_id": outcome.remote_id})],
            data=data | {"remote_id": outcome.remote_id},
        )
    if isinstance(outcome, NotFound | Fenced) and cancelled:
        if after.status == OperationStatus.UNKNOWN:
            # Not found, but a request still in flight may land until its deadline: the operation stays unknown
            # (the task stopped_pending) and is asked again once the not found is final, or fenced sooner.
            final_at = not_found_final_at(op)
            # An operation already unknown (its answer lost) keeps its status and records why it waits.
            fields = after.fields() if op.status != after.status else {"failure_class": after.failure_class}
            return Change(
                event="operation_not_found_yet",
                task=_after_settling(snap, op, after.status),
                operations=[(op, fields)],
                data=data | {"final_at": final_at.isoformat(), "next": "fence it, or ask again once final"},
            )
        # Never took effect (fenced, or not found past its deadline), and a cancel is recorded: never sent again.
        return Change(
            event="operation_cancelled",
            task=_after_settling(snap, op, after.status),
            nodes=[(node, {"status": NodeStatus.PENDING.value})] if node.status != NodeStatus.SUCCEEDED else [],
            operations=[(op, after.fields())],
            data=data,
        )
    if isinstance(outcome, Fenced) and op.purpose == OperationPurpose.COMPENSATION:
        detail = f"compensation {op.op_key} fenced at the remote: it never took effect"
        return Change(
            event="compensation_rejected",
            task=_after_compensation(snap, op, after.status, detail),
            operations=[(op, after.fields() | {"failure_detail": detail})],
            data=data | {"failure_class": after.failure_class, "compensates": op.compensates_id},
        )
    if isinstance(outcome, Fenced):
        # Refused at the remote for ever (fenced by a person, or before this send): the op key never took effect;
        # the node may run again under a new op key, as after any definite rejection.
        return Change(
            event="operation_fenced",
            task=_after_settling(snap, op, after.status),
            nodes=[(node, {"status": NodeStatus.PENDING.value})] if node.status != NodeStatus.PENDING else [],
            operations=[(op, after.fields())],
            data=data,
        )
    if isinstance(outcome, NotFound) and op.status == OperationStatus.UNKNOWN and op.failure_class in _HELD:
        # A refusal of a re-send, held until no earlier copy can land: final now, or not yet.
        if not not_found_final(op, asked_at or snap.now):
            if op.failure_class == NOT_FOUND_NOT_FINAL:
                return None
            return Change(
                event="operation_not_found_yet",
                task={},
                operations=[(op, {"failure_class": NOT_FOUND_NOT_FINAL})],
                data=data | {"final_at": not_found_final_at(op).isoformat(), "next": "ask again once final"},
            )
        return _failed(snap, op, _held_refusal(op), data | {"held_until_final": True})
    if isinstance(outcome, NotFound):
        # Sent again with the same op key: the same attempt, not a new one (only a remote's failure is).
        return Change(
            event="operation_not_found",
            task=_after_settling(snap, op, after.status),
            operations=[(op, after.fields())],
            data=data | {"next": "send again with the same op key"},
        )
    if isinstance(outcome, Unprovable):
        return Change(
            event="operation_unprovable",
            task=_after_settling(snap, op, after.status)
            if cancelled
            else pause(task, PauseReason.UNPROVABLE, outcome.detail or "the remote can neither dedupe nor be queried"),
            # An operation already unknown (a dropped answer) that now cannot be proven either is recorded as such.
            operations=[(op, after.fields())]
            if op.status != after.status
            else [(op, {"failure_class": after.failure_class})],
            data=data,
        )
    if op.purpose == OperationPurpose.COMPENSATION and not interrupted:
        return _compensation_refused(snap, op, outcome, data)
    if not interrupted and op.dispatch_count > 1 and op.purpose == OperationPurpose.EFFECT:
        # This copy was refused, but an earlier one, sent before a "not found", may still land: the refusal is held
        # (the operation unknown) until the remote fences the op key or its deadline passes.
        cls = FailureClass(outcome.failure_class)
        return Change(
            event="operation_refused_again",
            task=_after_settling(snap, op, OperationStatus.UNKNOWN) if cancelled else {},
            operations=[
                (
                    op,
                    {
                        "status": OperationStatus.UNKNOWN.value,
                        "failure_class": AWAITING_FINAL,
                        "failure_detail": f"{cls.value}: {outcome.detail}"[:500],
                    },
                )
            ],
            data=data | {"failure_class": cls.value, "detail": outcome.detail[:200], "next": "fence it"},
        )
    return _failed(snap, op, outcome, data)


_HELD = (AWAITING_FINAL, NOT_FOUND_NOT_FINAL)


def _held_refusal(op: Operation) -> Failed:
    """The refusal held on ``op`` (operation_refused_again wrote "<class>: <detail>"), now that it is final."""
    name, _, detail = op.failure_detail.partition(": ")
    try:
        return Failed(FailureClass(name), detail)
    except ValueError:  # held by a cancel (a sent intent), not by a refusal: it never took effect
        return Failed(FailureClass.DEPENDENCY_UNAVAILABLE, op.failure_detail)


def _committed(snap: Snapshot, op: Operation, outcome: Committed, settled_by: str) -> Change:
    task, node = snap.task, op.node
    receipt = receipt_of(op, outcome)
    receipt.committed_after_cancel_request = task.cancel_requested_at is not None
    problems = evidence_problems(node, op, receipt)
    temp = temp_locators(outcome)
    data: dict[str, Any] = {"op_key": op.op_key, "receipt": receipt_summary(receipt)}
    if temp:
        data["temp"] = temp
    after = operation_after(outcome)
    op_fields = after.fields() | {"remote_id": receipt.remote_id, "settled_at": AtCommit(), "settled_by": settled_by}
    temps = [TempResource(task_id=task.pk, node=node, locator=locator) for locator in temp]
    if problems:
        version_mismatch = any(p.startswith("receipt remote_version") for p in problems)
        reason = PauseReason.VERSION_CONFLICT if version_mismatch else PauseReason.NEEDS_REPLAN
        task_fields = pause(task, reason, f"node {node.key}: " + "; ".join(problems))
        if task.cancel_requested_at is not None:
            task_fields = _after_settling(snap, op, after.status)
        failed = {
            "status": NodeStatus.FAILED.value,
            "last_error_class": "evidence_insufficient",
            "next_allowed_action": "takeover",
        }
        return Change(
            event="evidence_insufficient",
            task=task_fields,
            nodes=[(node, failed)],
            operations=[(op, op_fields)],
            receipts=[receipt],
            temp_resources=temps,
            data=data | {"problems": problems},
        )
    # Every other node succeeded (those before succeeded_before did; the search stops at the first that has not).
    last = all(n.status == NodeStatus.SUCCEEDED for n in snap.nodes_from(snap.succeeded_before()) if n.pk != node.pk)
    return Change(
        event="node_succeeded",
        task=_after_settling(snap, op, after.status, all_done=last),
        nodes=[(node, succeeded_fields(receipt))],
        operations=[(op, op_fields)],
        receipts=[receipt],
        temp_resources=temps,
        data=data | {"after_cancel_request": receipt.committed_after_cancel_request},
    )


def _failed(snap: Snapshot, op: Operation, outcome: Failed, data: dict[str, Any]) -> Change:
    task, node = snap.task, op.node
    cls = FailureClass(outcome.failure_class)
    data = data | {"failure_class": cls.value, "detail": outcome.detail[:200]}
    cancelled = task.cancel_requested_at is not None
    after = operation_after(outcome)
    if after.status == OperationStatus.UNKNOWN:  # the connection dropped: it may or may not have happened
        return Change(
            event="operation_unknown",
            task=_after_settling(snap, op, after.status) if cancelled else {},
            operations=[(op, after.fields())],
            data=data,
        )
    rejected = after.fields() | {"failure_detail": outcome.detail[:500]}
    node_fields: dict[str, Any] = {"last_error_class": cls.value}
    task_fields: dict[str, Any]
    detail = f"node {node.key}: {outcome.detail}"[:500]
    if cls == FailureClass.DEPENDENCY_UNAVAILABLE:
        if _out_of_budget(task, node):
            node_fields |= {"status": NodeStatus.PENDING.value, "next_allowed_action": "takeover"}
            task_fields = pause(task, PauseReason.BUDGET_EXHAUSTED, detail)
        else:
            wait = backoff(now=snap.now, attempt=node.attempts, seed=f"{task.uid}:{node.key}")
            node_fields |= {
                "status": NodeStatus.PENDING.value,
                "not_before": AtCommit(wait.delay),
                "next_allowed_action": "retry",
            }
            people_decide = cancelled or task.status == TaskStatus.HUMAN
            task_fields = {} if people_decide else {"status": TaskStatus.BACKING_OFF.value}
            data |= {"not_before": AtCommit(wait.delay)}
    elif cls == FailureClass.INVALID_PARAMS:
        node_fields |= {"status": NodeStatus.FAILED.value, "next_allowed_action": "replan"}
        if destination(cls, node.on_failure) == "fail_task" and not cancelled:
            task_fields = {"status": TaskStatus.FAILED.value, "status_detail": detail}
        else:
            task_fields = pause(task, PAUSE_REASON[cls], detail)
    else:  # permission_revoked, conflict: nothing happened remotely; a person or a re-plan decides
        node_fields |= {"status": NodeStatus.PENDING.value, "next_allowed_action": "takeover"}
        task_fields = pause(task, PAUSE_REASON[cls], detail)
    if cancelled:
        task_fields = _after_settling(snap, op, after.status)
    return Change(
        event="operation_rejected",
        task=task_fields,
        nodes=[(node, node_fields)],
        operations=[(op, rejected)],
        data=data,
    )


def settle_not_done(snap: Snapshot, op: Operation, *, by: str, fenced: bool = False) -> Change:
    """A person holding the takeover confirms ``op`` never took effect (the remote could not say): the operation is
    rejected as not done, its node may run again under a new op key, and a recorded cancel moves on as with any
    other settlement. Only on a final "not found": the remote fenced the op key (``fenced``), or its deadline and
    the clock skew have passed — before that a request still in flight could land after the record says it never
    happened (NotFoundNotFinal)."""
    if op.status not in OPEN_OPERATION_STATUSES:
        raise InvalidTransition(f"operation {op.op_key} is {op.status}: nothing to settle")
    if not fenced and not not_found_final(op, snap.now):
        raise NotFoundNotFinal(
            f"operation {op.op_key} may still land until {not_found_final_at(op).isoformat(timespec='seconds')} "
            "(its deadline plus the clock skew): not done is final only then, or once the remote fences its op key",
            op_key=op.op_key,
            final_at=not_found_final_at(op).isoformat(),
        )
    node = op.node
    fields = {
        "status": OperationStatus.REJECTED.value,
        "failure_class": "not_done",
        "failure_detail": (f"confirmed not done by {by}" + (" (fenced at the remote)" if fenced else ""))[:500],
        "settled_by": by,
    }
    return Change(
        event="operation_resolved_not_done",
        task=_after_settling(snap, op, OperationStatus.REJECTED),
        nodes=[(node, {"status": NodeStatus.PENDING.value})] if node.status != NodeStatus.PENDING else [],
        operations=[(op, fields)],
        data={"op_key": op.op_key, "by": by, "fenced": fenced},
    )


def _compensation_committed(snap: Snapshot, op: Operation, outcome: Committed) -> Change:
    """The remote committed a compensation: its receipt is kept as evidence; the node it undoes keeps its own
    receipt too (both happened). The plan no longer describes what is true, so the task pauses ``needs_replan``
    for a person to re-plan or end it (a recorded cancel goes on to stopped instead)."""
    receipt = receipt_of(op, outcome)
    receipt.committed_after_cancel_request = snap.task.cancel_requested_at is not None
    undone = f"compensation {op.op_key} committed: node {op.node.key} is undone; re-plan or end the task"
    after = operation_after(outcome)
    return Change(
        event="compensation_committed",
        task=_after_compensation(snap, op, after.status, undone),
        operations=[(op, after.fields() | {"remote_id": receipt.remote_id, "settled_at": AtCommit()})],
        receipts=[receipt],
        data={"op_key": op.op_key, "receipt": receipt_summary(receipt)},
    )


def _compensation_refused(snap: Snapshot, op: Operation, outcome: Failed, data: dict[str, Any]) -> Change:
    """A compensation the remote refused is never retried by the system: a person decides what is next."""
    detail = f"compensation {op.op_key} refused ({outcome.failure_class}): {outcome.detail}"
    after = operation_after(outcome)
    return Change(
        event="compensation_rejected",
        task=_after_compensation(snap, op, after.status, detail),
        operations=[(op, after.fields() | {"failure_detail": outcome.detail[:500]})],
        data=data | {"failure_class": str(outcome.failure_class), "compensates": op.compensates_id},
    )


def _after_compensation(snap: Snapshot, op: Operation, op_status: OperationStatus, detail: str) -> dict[str, Any]:
    """Whatever became of a compensation, a person decides what is next (a recorded cancel goes on to stopped)."""
    if snap.task.cancel_requested_at is not None:
        return _after_settling(snap, op, op_status)
    return pause(snap.task, PauseReason.NEEDS_REPLAN, detail)


def cancel_status(snap: Snapshot, op: Operation | None, op_status: OperationStatus | None) -> dict[str, Any]:
    """After a cancel: stopping while work is in flight, stopped_pending while only unknowns remain to reconcile,
    stopped once every operation is settled."""
    remaining = {o.status for o in snap.open_operations() if op is None or o.pk != op.pk}
    if op_status is not None and op_status in OPEN_OPERATION_STATUSES:
        remaining.add(op_status.value)
    if not remaining:
        target = TaskStatus.STOPPED
    elif remaining & {OperationStatus.DISPATCHED.value, OperationStatus.ACCEPTED.value}:
        target = TaskStatus.STOPPING
    else:
        target = TaskStatus.STOPPED_PENDING
    return {"status": target.value} if snap.task.status != target else {}


def _after_settling(
    snap: Snapshot, op: Operation, op_status: OperationStatus, all_done: bool = False
) -> dict[str, Any]:
    """The task's status once ``op`` moved to ``op_status``: a recorded cancel wins over everything, and a person
    holding the task decides its status themselves (takeover_submit)."""
    task = snap.task
    if task.cancel_requested_at is not None:
        return cancel_status(snap, op, op_status)
    if task.status == TaskStatus.HUMAN:
        return {}
    if all_done:
        return {"status": TaskStatus.COMPLETED.value, **_CLEAR}
    if op_status == OperationStatus.COMMITTED and task.attempts_used >= task.attempt_budget:
        return pause(task, PauseReason.BUDGET_EXHAUSTED, "the task's attempt budget is used up; work remains")
    if _unprovable_settled(snap, op):
        # Out of a pause: before any node runs again, its inputs are read again from their sources.
        return {"status": TaskStatus.RUNNING.value, **_CLEAR} | _RECHECK
    if task.status in (TaskStatus.OBSERVING, TaskStatus.BACKING_OFF):
        return {"status": TaskStatus.RUNNING.value}
    return {}


def _unprovable_settled(snap: Snapshot, op: Operation) -> bool:
    """The task paused because this operation could not be proven, and now a fact settled it."""
    task = snap.task
    if task.status != TaskStatus.PAUSED or task.status_reason != PauseReason.UNPROVABLE:
        return False
    return not any(
        o.pk != op.pk and o.status == OperationStatus.UNKNOWN and o.failure_class == "unprovable"
        for o in snap.unsettled
    )


def _after_accepted(snap: Snapshot, op: Operation) -> dict[str, Any]:
    task = snap.task
    if task.cancel_requested_at is not None:
        return cancel_status(snap, op, OperationStatus.ACCEPTED)
    if _unprovable_settled(snap, op):
        return {"status": TaskStatus.OBSERVING.value, **_CLEAR} | _RECHECK
    if task.status in (TaskStatus.RUNNING, TaskStatus.BACKING_OFF):
        return {"status": TaskStatus.OBSERVING.value, **_CLEAR}
    return {}


def pause(task: Task, reason: PauseReason, detail: str) -> dict[str, Any]:
    """Pause with ``reason``, unless a cancel is recorded or the task already waits for people."""
    if task.cancel_requested_at is not None or task.status in (TaskStatus.PAUSED, TaskStatus.HUMAN):
        return {}
    return {"status": TaskStatus.PAUSED.value, "status_reason": reason.value, "status_detail": detail[:500]}


# ------------------------------------------------------------------------------------------------ inputs, cancel


def confirm_inputs(snap: Snapshot, current_versions: dict[str, str]) -> Change:
    """The agent reports each input ref's current version read from the real source. All unchanged: go on. Any
    changed: pause ``input_changed``; the task goes on only by an explicit choice (re-plan, or approval)."""
    task = snap.task
    missing = sorted(set(task.input_refs) - set(current_versions))
    if missing:
        raise InputsRecheckRequired(f"report the current version of every input: missing {', '.join(missing)}")
    changed = {
        name: {"planned": ref["version"], "now": current_versions[name]}
        for name, ref in task.input_refs.items()
        if str(current_versions[name]) != str(ref["version"])
    }
    fields: dict[str, Any] = {"inputs_recheck_required": False}
    if changed:
        detail = "inputs changed while paused: " + ", ".join(
            f"{name} {v['planned']}→{v['now']}" for name, v in changed.items()
        )
        fields |= pause(task, PauseReason.INPUT_CHANGED, detail)
    return Change(
        event="inputs_confirmed",
        kind=ChangeKind.CONFIRM,
        task=fields,
        data={"changed": changed, "checked": len(current_versions)},
    )


def cancel(snap: Snapshot, *, by: str, reason: str) -> Change:
    """Record a cancel: from now on nothing new starts; intents never sent are withdrawn; what is in flight settles
    (stopping) and is recorded as it truly ended. An intent that was sent before (found nothing, to be sent again)
    is not withdrawn: a copy may still land, so it is left unknown until fenced or past its deadline."""
    intents = [op for op in snap.intents() if op.dispatch_count == 0]
    sent = [op for op in snap.intents() if op.dispatch_count > 0]
    awaiting = {"status": OperationStatus.UNKNOWN.value, "failure_class": AWAITING_FINAL}
    return Change(
        event="cancel_requested",
        kind=ChangeKind.CANCEL,
        task={
            "cancel_requested_at": AtCommit(),
            "cancel_requested_by": by,
            "cancel_reason": reason[:500],
            **cancel_status(snap, None, OperationStatus.UNKNOWN if sent else None),
            **_CLEAR,
        },
        nodes=[
            (op.node, {"status": NodeStatus.PENDING.value}) for op in intents if op.node.status == NodeStatus.RUNNING
        ],
        operations=[(op, {"status": OperationStatus.REJECTED.value, "failure_class": "cancelled"}) for op in intents]
        + [(op, awaiting) for op in sent],
        data={
            "by": by,
            "reason": reason[:200],
            "withdrawn_intents": [op.op_key for op in intents],
            "awaiting_final": [op.op_key for op in sent],
        },
        requires={"cancel_requested_at__isnull": True},
    )


def approvable_nodes(nodes: list[Node]) -> list[Node]:
    """The approval nodes a person may approve now: pending, every dependency succeeded."""
    succeeded = {n.key for n in nodes if n.status == NodeStatus.SUCCEEDED}
    return [
        n for n in nodes if is_approval(n.action) and n.status == NodeStatus.PENDING and set(n.depends_on) <= succeeded
    ]
