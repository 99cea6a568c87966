"""The step protocol of DESIGN §4, one node at a time.

    directive = next_directive(task_id=…, lease=…)        # reconcile / execute / wait / stop / done
    op = register_intent(task_id=…, node_key=…, expected_version=directive.task_version, lease=…)
    op = operation_dispatch(op_key=op.op_key, expected_version=…, lease=…)   # re-checks cancel
    outcome = connector.submit(op.op_key, op.request)                      # outside any transaction
    record_outcome(op_key=op.op_key, outcome=outcome, expected_version=…, lease=…)

Every write is a compare_and_set on the task version and the caller's lease epoch. A refusal raises a
named error and writes nothing; the caller stops and leaves its op keys to the reconciler.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.conf import settings

from audit.principals import Principal
from leases import clock
from leases.models import Lease
from leases.services import lease_reservation
from tasks import guards
from tasks.actions import get_action
from tasks.cas import Audit, Change, audited_compare_and_set, compare_and_set
from tasks.errors import (
    EvidenceInsufficient,
    InputsRecheckRequired,
    InvalidTransition,
    NodeNotReady,
    OperationsOpen,
    TaskNotFound,
    VersionConflict,
)
from tasks.events import node_ref
from tasks.evidence import evidence_problems
from tasks.failpoints import failpoint
from tasks.failures import PAUSE_REASON, backoff, destination
from tasks.hygiene import check_payload
from tasks.lifecycle import (
    OPEN_OPERATION_STATUSES,
    RUNNABLE_TASK_STATUSES,
    FailureClass,
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
)
from tasks.models import Node, Operation, OperationPurpose, Receipt, Task, TempResource
from tasks.outcomes import Accepted, Committed, Failed, NotFound, Outcome, Unprovable
from tasks.permissions import require_cancel
from tasks.plans import digest_of
from tasks.queries import get_task as _task

type DirectiveKind = Literal["execute", "reconcile", "wait", "stop", "done"]

_OPEN = [s.value for s in OPEN_OPERATION_STATUSES]


@dataclass(frozen=True)
class Directive:
    kind: DirectiveKind
    task_version: int
    node_key: str = ""
    op_key: str = ""
    until: datetime | None = None
    reason: str = ""


def _current_nodes(task: Task) -> list[Node]:
    return list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))


def next_directive(*, task_id: int, lease: Lease) -> Directive:
    """What the lease holder should do next. A read: it changes nothing.

    Dispatched, accepted and unknown operations always come first (safe handover), then cancel and
    pauses, then an intent registered but never sent, then the first ready node.
    """
    task = _task(task_id)
    v = task.version
    if task.status == TaskStatus.COMPLETED:
        return Directive("done", v)
    if task.status in (TaskStatus.FAILED, TaskStatus.STOPPED, TaskStatus.QUARANTINED):
        return Directive("stop", v, reason=task.status)
    now = clock.now()
    live = Lease.objects.open().filter(pk=lease.pk, task_id=task_id, epoch=lease.epoch).first()
    if live is None:
        return Directive("stop", v, reason="lease_lost")
    if live.expires_at <= now:
        return Directive("stop", v, reason="lease_expired")
    if task.status == TaskStatus.HUMAN:
        return Directive("stop", v, reason="human_takeover")
    open_op = (
        Operation.objects.filter(task=task, status__in=_OPEN).select_related("node").order_by("registered_at").first()
    )
    if open_op is not None:
        return Directive("reconcile", v, node_key=open_op.node.key, op_key=open_op.op_key, reason=open_op.status)
    if task.cancel_requested_at is not None:
        return Directive("stop", v, reason="cancel_requested")
    if lease_reservation(task_id) is not None:
        return Directive("stop", v, reason="takeover_requested")
    if task.status == TaskStatus.PAUSED:
        return Directive("stop", v, reason=task.status_reason)
    if task.inputs_recheck_required:
        return Directive("reconcile", v, reason="recheck_inputs")
    nodes = _current_nodes(task)
    succeeded = {n.key for n in nodes if n.status == NodeStatus.SUCCEEDED}
    intent = Operation.objects.filter(task=task, status=OperationStatus.INTENT).select_related("node").first()
    if intent is not None:
        if intent.node.attempts >= intent.node.max_attempts or task.attempts_used >= task.attempt_budget:
            return Directive("stop", v, node_key=intent.node.key, op_key=intent.op_key, reason="budget_exhausted")
        return Directive("execute", v, node_key=intent.node.key, op_key=intent.op_key, reason="intent_registered")
    for node in nodes:
        if node.status != NodeStatus.PENDING or not set(node.depends_on) <= succeeded:
            continue
        action = get_action(node.action)
        if action is not None and action.kind == "approval":
            return Directive("stop", v, node_key=node.key, reason="awaiting_approval")
        if node.attempts >= node.max_attempts or task.attempts_used >= task.attempt_budget:
            return Directive("stop", v, node_key=node.key, reason="budget_exhausted")
        if node.not_before is not None and node.not_before > now:
            return Directive("wait", v, node_key=node.key, until=node.not_before, reason=node.last_error_class)
        return Directive("execute", v, node_key=node.key)
    if nodes and len(succeeded) == len(nodes):
        return Directive("done", v)
    return Directive("stop", v, reason="no_ready_node")


def resolve_input(task: Task, node: Node) -> dict[str, Any]:
    """The node's input with every ``from`` replaced by the earlier node's structured output."""
    resolved: dict[str, Any] = {}
    for name, value in node.input.items():
        if isinstance(value, dict) and "from" in value:
            source = Node.objects.filter(task=task, plan_version=node.plan_version, key=value["from"]).first()
            if source is None or source.status != NodeStatus.SUCCEEDED:
                raise NodeNotReady(f"node {node.key} reads {value['from']}, which has not succeeded")
            resolved[name] = source.output.get(value["field"])
        elif isinstance(value, dict) and "ref" in value:
            resolved[name] = dict(value["ref"])
        else:
            resolved[name] = value
    return resolved


def op_key_for(task: Task, node: Node, retry: int) -> str:
    """Deterministic: the same intent always gets the same key; a new key only after a definite rejection."""
    return f"rk-{task.uid.hex}-p{node.plan_version}-{node.key}-{retry}"


def register_intent(*, task_id: int, node_key: str, expected_version: int, lease: Lease) -> Operation:
    """Register the intent to run ``node_key``'s side effect: the Operation with its op key, before any call.

    Conditional on task version, lease epoch and expiry, no cancel, budget left, backoff passed and no
    open operation. Running it again for an intent not yet sent returns the same operation.
    """
    task = _task(task_id)
    node = Node.objects.filter(task=task, plan_version=task.plan_version, key=node_key).first()
    if node is None:
        raise NodeNotReady(f"plan version {task.plan_version} has no node {node_key!r}")
    existing = Operation.objects.filter(node=node).exclude(status=OperationStatus.REJECTED).first()
    if existing is not None and existing.status == OperationStatus.INTENT:
        return existing
    if existing is not None and existing.status in OPEN_OPERATION_STATUSES:
        raise OperationsOpen(f"operation {existing.op_key} is {existing.status}: reconcile it by op key first")
    action = get_action(node.action)
    if action is not None and action.kind == "approval":
        raise NodeNotReady(f"node {node_key} is a confirmation point: a person approves it")
    if node.status != NodeStatus.PENDING:
        raise NodeNotReady(f"node {node_key} is {node.status}")
    blocking = Node.objects.filter(task=task, plan_version=task.plan_version, key__in=node.depends_on).exclude(
        status=NodeStatus.SUCCEEDED
    )
    if blocking.exists():
        raise NodeNotReady(f"node {node_key} waits for {', '.join(blocking.values_list('key', flat=True))}")
    resolved = resolve_input(task, node)
    request = {"action": node.action, "input": resolved}
    check_payload(request, what=f"request of node {node_key}")
    retry = Operation.objects.filter(node=node, status=OperationStatus.REJECTED).count()

    def build(current: Task, now: datetime) -> Change:
        op = Operation(
            node=node,
            op_key=op_key_for(current, node, retry),
            action=node.action,
            target=str(resolved.get("target", ""))[:300],
            request=request,
            request_digest=digest_of(request),
            registered_at=now,
        )
        return Change(
            event="intent_registered",
            task={"status": TaskStatus.RUNNING.value} if current.status != TaskStatus.RUNNING else {},
            nodes=[(node, {"status": NodeStatus.RUNNING.value})],
            operations=[(op, {"status": OperationStatus.INTENT.value})],
            data={"op_key": op.op_key, "request_digest": op.request_digest, "node": node_ref(node)},
            # Checked in this order when refused: the most specific reason is named.
            guards=[
                guards.no_cancel(),
                guards.task_budget_left(),
                guards.node_budget_left(node),
                guards.node_backoff_passed(node, now),
                guards.no_unsettled_operations(),
                guards.no_takeover_requested(),
                guards.inputs_rechecked(),
                guards.status_in(RUNNABLE_TASK_STATUSES, f"task {task_id} is {current.status}: no new intent"),
            ],
        )

    compare_and_set(task_id, expected_version, build, lease=lease)
    return Operation.objects.get(node=node, op_key=op_key_for(task, node, retry))


def operation_dispatch(*, op_key: str, expected_version: int, lease: Lease) -> Operation:
    """Mark the operation sent, right before the external call. The last cancel check before a side effect;
    it also spends one attempt of the node's and the task's budgets."""
    op = _operation(op_key)
    if op.status != OperationStatus.INTENT:
        raise InvalidTransition(f"operation {op_key} is {op.status}, only an intent can be dispatched")
    node = op.node

    def build(current: Task, now: datetime) -> Change:
        return Change(
            event="operation_dispatched",
            task={"attempts_used": current.attempts_used + 1},
            nodes=[(node, {"attempts": node.attempts + 1, "last_attempt_at": now, "next_allowed_action": ""})],
            operations=[(op, {"status": OperationStatus.DISPATCHED.value, "dispatch_count": op.dispatch_count + 1})],
            data={"op_key": op_key},
            guards=[
                guards.no_cancel(),
                guards.task_budget_left(),
                guards.node_budget_left(node),
                guards.no_open_operations(),
                guards.no_takeover_requested(),
            ],
        )

    compare_and_set(op.task_id, expected_version, build, lease=lease)
    return Operation.objects.get(pk=op.pk)


def _operation(op_key: str) -> Operation:
    op = Operation.objects.select_related("node").filter(op_key=op_key).first()
    if op is None:
        raise TaskNotFound(f"no operation with op key {op_key!r}", op_key=op_key)
    return op


def _cancel_status(current: Task, op: Operation | None, op_status: OperationStatus | None) -> dict[str, Any]:
    """After a cancel: stopping while work is in flight, stopped_pending while only unknowns remain to
    reconcile, stopped once every operation is settled."""
    others = Operation.objects.filter(task=current, status__in=_OPEN)
    if op is not None:
        others = others.exclude(pk=op.pk)
    remaining = set(others.values_list("status", flat=True))
    if op_status is not None and op_status in OPEN_OPERATION_STATUSES:
        remaining.add(op_status.value)
    if not remaining:
        target = TaskStatus.STOPPED
    elif remaining & {OperationStatus.DISPATCHED.value, OperationStatus.ACCEPTED.value}:
        target = TaskStatus.STOPPING
    else:
        target = TaskStatus.STOPPED_PENDING
    return {"status": target.value} if current.status != target else {}


def _after_settling(current: Task, op: Operation, op_status: OperationStatus, all_done: bool = False) -> dict[str, Any]:
    """The task's status once ``op`` moved to ``op_status``; a recorded cancel wins over everything, and a
    person holding the task decides its status themselves (takeover_submit)."""
    if current.cancel_requested_at is not None:
        return _cancel_status(current, op, op_status)
    if current.status == TaskStatus.HUMAN:
        return {}
    if all_done:
        return {"status": TaskStatus.COMPLETED.value, "status_reason": "", "status_detail": ""}
    if op_status == OperationStatus.COMMITTED and current.attempts_used >= current.attempt_budget:
        return _pause(current, PauseReason.BUDGET_EXHAUSTED, "the task's attempt budget is used up; work remains")
    if _unprovable_settled(current, op):
        # Out of a pause: before any node runs again, its inputs are read again from their sources.
        return {"status": TaskStatus.RUNNING.value, "status_reason": "", "status_detail": ""} | _RECHECK
    if current.status in (TaskStatus.OBSERVING, TaskStatus.BACKING_OFF):
        return {"status": TaskStatus.RUNNING.value}
    return {}


def _unprovable_settled(current: Task, op: Operation) -> bool:
    """The task paused because this operation could not be proven, and now a fact settled it."""
    if current.status != TaskStatus.PAUSED or current.status_reason != PauseReason.UNPROVABLE:
        return False
    others = Operation.objects.filter(task=current, status=OperationStatus.UNKNOWN, failure_class="unprovable")
    return not others.exclude(pk=op.pk).exists()


def _after_accepted(current: Task, op: Operation) -> dict[str, Any]:
    if current.cancel_requested_at is not None:
        return _cancel_status(current, op, OperationStatus.ACCEPTED)
    if _unprovable_settled(current, op):
        return {"status": TaskStatus.OBSERVING.value, "status_reason": "", "status_detail": ""} | _RECHECK
    if current.status in (TaskStatus.RUNNING, TaskStatus.BACKING_OFF):
        return {"status": TaskStatus.OBSERVING.value, "status_reason": "", "status_detail": ""}
    return {}


_RECHECK = {"inputs_recheck_required": True}


def _pause(current: Task, reason: PauseReason, detail: str) -> dict[str, Any]:
    if current.cancel_requested_at is not None or current.status in (TaskStatus.PAUSED, TaskStatus.HUMAN):
        return {}
    return {"status": TaskStatus.PAUSED.value, "status_reason": reason.value, "status_detail": detail[:500]}


def record_outcome(*, op_key: str, outcome: Outcome, expected_version: int, lease: Lease) -> Operation:
    """Record what the remote said for ``op_key`` (from the call or from a query by op key).

    A receipt is persisted and, if it satisfies the node's evidence, the node advances — one
    transaction. Failures branch by class (DESIGN §6).
    """
    op = _operation(op_key)
    if op.status not in OPEN_OPERATION_STATUSES:
        raise InvalidTransition(f"operation {op_key} is {op.status}: nothing outstanding to record")
    if isinstance(outcome, Committed):
        if not outcome.remote_id:
            raise EvidenceInsufficient(f"a receipt for {op_key} needs the remote id the external system gave it")
        check_payload(outcome.data, what="receipt data")
        if op.purpose == OperationPurpose.COMPENSATION:
            return _record_compensation(op, outcome, expected_version, lease)
        return _record_committed(op, outcome, expected_version, lease)
    interrupted = isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED
    if interrupted and op.status == OperationStatus.UNKNOWN:
        return op  # a query that itself timed out: still unknown, nothing new to record
    if isinstance(outcome, Unprovable) and op.status == OperationStatus.UNKNOWN and op.failure_class == "unprovable":
        return op
    node = op.node

    def build(current: Task, now: datetime) -> Change:
        data: dict[str, Any] = {"op_key": op_key, "outcome": type(outcome).__name__.lower()}
        if isinstance(outcome, Accepted):
            return Change(
                event="operation_accepted",
                task=_after_accepted(current, op),
                nodes=[(node, {"status": NodeStatus.OBSERVING.value})] if node.status != NodeStatus.OBSERVING else [],
                operations=[(op, {"status": OperationStatus.ACCEPTED.value, "remote_id": outcome.remote_id})],
                data=data | {"remote_id": outcome.remote_id},
            )
        if isinstance(outcome, NotFound):
            if current.cancel_requested_at is not None:
                # Never took effect, and a cancel is recorded: it must not be sent again.
                return Change(
                    event="operation_cancelled",
                    task=_after_settling(current, op, OperationStatus.REJECTED),
                    nodes=[(node, {"status": NodeStatus.PENDING.value})],
                    operations=[(op, {"status": OperationStatus.REJECTED.value, "failure_class": "cancelled"})],
                    data=data,
                )
            task_fields = _after_settling(current, op, OperationStatus.INTENT)
            if node.attempts >= node.max_attempts or current.attempts_used >= current.attempt_budget:
                task_fields = _pause(
                    current, PauseReason.BUDGET_EXHAUSTED, f"node {node.key}: no attempt left to resend"
                )
            return Change(
                event="operation_not_found",
                task=task_fields,
                operations=[(op, {"status": OperationStatus.INTENT.value})],
                data=data | {"next": "send again with the same op key"},
            )
        if isinstance(outcome, Unprovable):
            return Change(
                event="operation_unprovable",
                task=_after_settling(current, op, OperationStatus.UNKNOWN)
                if current.cancel_requested_at is not None
                else _pause(
                    current, PauseReason.UNPROVABLE, outcome.detail or "the remote can neither dedupe nor be queried"
                ),
                operations=[(op, {"status": OperationStatus.UNKNOWN.value, "failure_class": "unprovable"})]
                if op.status != OperationStatus.UNKNOWN
                else [],
                data=data,
            )
        if op.purpose == OperationPurpose.COMPENSATION and outcome.failure_class != FailureClass.CONNECTION_INTERRUPTED:
            return _compensation_refused(current, op, outcome, data)
        return _failure_change(current, op, node, outcome, now, data)

    compare_and_set(op.task_id, expected_version, build, lease=lease)
    return Operation.objects.get(pk=op.pk)


def _after_compensation(current: Task, op: Operation, op_status: OperationStatus, detail: str) -> dict[str, Any]:
    """Whatever became of a compensation, a person decides what is next (a recorded cancel goes on to stopped)."""
    if current.cancel_requested_at is not None:
        return _after_settling(current, op, op_status)
    return _pause(current, PauseReason.NEEDS_REPLAN, detail)


def _compensation_refused(current: Task, op: Operation, outcome: Failed, data: dict[str, Any]) -> Change:
    """A compensation the remote refused is never retried by the system: a person decides what is next."""
    detail = f"compensation {op.op_key} refused ({outcome.failure_class}): {outcome.detail}"
    return Change(
        event="compensation_rejected",
        task=_after_compensation(current, op, OperationStatus.REJECTED, detail),
        operations=[
            (
                op,
                {
                    "status": OperationStatus.REJECTED.value,
                    "failure_class": str(outcome.failure_class),
                    "failure_detail": outcome.detail[:500],
                },
            )
        ],
        data=data | {"failure_class": str(outcome.failure_class), "compensates": op.compensates_id},
    )


def _record_compensation(op: Operation, outcome: Committed, expected_version: int, lease: Lease) -> Operation:
    """The remote committed a compensation: its receipt is kept as evidence; the node it undoes keeps its own
    receipt too (both happened). The plan no longer describes what is true, so the task pauses ``needs_replan``
    for a person to re-plan or end it (a recorded cancel goes on to stopped instead)."""
    receipt = receipt_of(op, outcome)

    def build(current: Task, now: datetime) -> Change:
        receipt.received_at = now
        receipt.committed_after_cancel_request = current.cancel_requested_at is not None
        undone = f"compensation {op.op_key} committed: node {op.node.key} is undone; re-plan or end the task"
        return Change(
            event="compensation_committed",
            task=_after_compensation(current, op, OperationStatus.COMMITTED, undone),
            operations=[
                (op, {"status": OperationStatus.COMMITTED.value, "remote_id": receipt.remote_id, "settled_at": now})
            ],
            data={"op_key": op.op_key, "receipt": receipt_summary(receipt)},
        )

    compare_and_set(
        op.task_id, expected_version, build, lease=lease, before_event=lambda _t, _n: receipt.save(force_insert=True)
    )
    return Operation.objects.get(pk=op.pk)


def receipt_of(op: Operation, outcome: Committed) -> Receipt:
    """The receipt row for what the remote committed (saved inside the recording transaction)."""
    return Receipt(
        operation=op,
        remote_id=outcome.remote_id,
        remote_version=outcome.remote_version,
        count=outcome.count,
        digest=outcome.digest,
        data=outcome.data,
    )


def receipt_summary(receipt: Receipt) -> dict[str, Any]:
    """The receipt as the log records it (tasks/verification.py compares the rows with this)."""
    return {
        "remote_id": receipt.remote_id,
        "remote_version": receipt.remote_version,
        "count": receipt.count,
        "digest": receipt.digest,
    }


def _failure_change(
    current: Task, op: Operation, node: Node, outcome: Failed, now: datetime, data: dict[str, Any]
) -> Change:
    cls = FailureClass(outcome.failure_class)
    data = data | {"failure_class": cls.value, "detail": outcome.detail[:200]}
    if cls == FailureClass.CONNECTION_INTERRUPTED:
        return Change(
            event="operation_unknown",
            task=_after_settling(current, op, OperationStatus.UNKNOWN)
            if current.cancel_requested_at is not None
            else {},
            operations=[(op, {"status": OperationStatus.UNKNOWN.value, "failure_class": cls.value})],
            data=data,
        )
    rejected = [
        (
            op,
            {
                "status": OperationStatus.REJECTED.value,
                "failure_class": cls.value,
                "failure_detail": outcome.detail[:500],
            },
        )
    ]
    node_fields: dict[str, Any] = {"last_error_class": cls.value}
    task_fields: dict[str, Any]
    chosen = destination(cls, node.on_failure)
    if cls == FailureClass.DEPENDENCY_UNAVAILABLE:
        out_of_budget = node.attempts >= node.max_attempts or current.attempts_used >= current.attempt_budget
        if out_of_budget:
            node_fields |= {"status": NodeStatus.PENDING.value, "next_allowed_action": "takeover"}
            task_fields = _pause(current, PauseReason.BUDGET_EXHAUSTED, f"node {node.key}: {outcome.detail}"[:500])
        else:
            wait = backoff(now=now, attempt=node.attempts, seed=f"{current.uid}:{node.key}")
            node_fields |= {
                "status": NodeStatus.PENDING.value,
                "not_before": wait.not_before,
                "next_allowed_action": "retry",
            }
            people_decide = current.cancel_requested_at is not None or current.status == TaskStatus.HUMAN
            task_fields = {} if people_decide else {"status": TaskStatus.BACKING_OFF.value}
            data |= {"not_before": wait.not_before}
    elif cls == FailureClass.INVALID_PARAMS:
        node_fields |= {"status": NodeStatus.FAILED.value, "next_allowed_action": "replan"}
        if chosen == "fail_task" and current.cancel_requested_at is None:
            task_fields = {
                "status": TaskStatus.FAILED.value,
                "status_detail": f"node {node.key}: {outcome.detail}"[:500],
            }
        else:
            task_fields = _pause(current, PAUSE_REASON[cls], f"node {node.key}: {outcome.detail}")
    else:
        # permission_revoked, conflict: nothing happened remotely; a person or a re-plan decides.
        node_fields |= {"status": NodeStatus.PENDING.value, "next_allowed_action": "takeover"}
        task_fields = _pause(current, PAUSE_REASON[cls], f"node {node.key}: {outcome.detail}")
    if current.cancel_requested_at is not None:
        task_fields = _after_settling(current, op, OperationStatus.REJECTED)
    return Change(
        event="operation_rejected", task=task_fields, nodes=[(node, node_fields)], operations=rejected, data=data
    )


def _record_committed(
    op: Operation, outcome: Committed, expected_version: int, lease: Lease, settled_by: str = ""
) -> Operation:
    node = op.node
    receipt = receipt_of(op, outcome)
    problems = evidence_problems(node, op, receipt)
    temp_locators = _temp_locators(outcome)

    def build(current: Task, now: datetime) -> Change:
        receipt.received_at = now
        receipt.committed_after_cancel_request = current.cancel_requested_at is not None
        data: dict[str, Any] = {"op_key": op.op_key, "receipt": receipt_summary(receipt)}
        if temp_locators:
            data["temp"] = temp_locators
        op_fields = {
            "status": OperationStatus.COMMITTED.value,
            "remote_id": receipt.remote_id,
            "settled_at": now,
            "settled_by": settled_by,
        }
        if problems:
            version_mismatch = any(p.startswith("receipt remote_version") for p in problems)
            reason = PauseReason.VERSION_CONFLICT if version_mismatch else PauseReason.NEEDS_REPLAN
            task_fields = _pause(current, reason, f"node {node.key}: " + "; ".join(problems))
            if current.cancel_requested_at is not None:
                task_fields = _after_settling(current, op, OperationStatus.COMMITTED)
            return Change(
                event="evidence_insufficient",
                task=task_fields,
                nodes=[
                    (
                        node,
                        {
                            "status": NodeStatus.FAILED.value,
                            "last_error_class": "evidence_insufficient",
                            "next_allowed_action": "takeover",
                        },
                    )
                ],
                operations=[(op, op_fields)],
                data=data | {"problems": problems},
            )
        return _node_succeeded(
            current,
            op,
            receipt,
            operations=[(op, op_fields)],
            data=data | {"after_cancel_request": receipt.committed_after_cancel_request},
        )

    def save_receipt(task: Task, now: datetime) -> None:
        receipt.save(force_insert=True)
        # What the effect left behind to clean up once the task ends; its evidence (the receipt) stays.
        for locator in temp_locators:
            TempResource.objects.get_or_create(
                task=task,
                locator=locator,
                defaults={"node": node, "created_at": now, "retention_until": now + settings.RECKON_TEMP_RETENTION},
            )
        failpoint("after_receipt", task_id=task.pk)

    compare_and_set(op.task_id, expected_version, build, lease=lease, before_event=save_receipt)
    return Operation.objects.get(pk=op.pk)


def _temp_locators(outcome: Committed) -> list[str]:
    temp = outcome.data.get("temp", [])
    if not isinstance(temp, list) or not all(isinstance(t, str) and t and len(t) <= 500 for t in temp):
        raise EvidenceInsufficient("a receipt's temp resources must be a list of locators")
    return list(dict.fromkeys(temp))


def _node_succeeded(
    current: Task,
    op: Operation,
    receipt: Receipt,
    *,
    operations: list[tuple[Operation, dict[str, Any]]],
    data: dict[str, Any],
) -> Change:
    """The node of ``op`` advances on ``receipt``; the task completes when it was the last one."""
    node = op.node
    others_open = (
        Node.objects.filter(task=current, plan_version=node.plan_version)
        .exclude(pk=node.pk)
        .exclude(status=NodeStatus.SUCCEEDED)
        .exists()
    )
    return Change(
        event="node_succeeded",
        task=_after_settling(current, op, OperationStatus.COMMITTED, all_done=not others_open),
        nodes=[(node, _advance_fields(receipt))],
        operations=operations,
        data=data,
    )


def _advance_fields(receipt: Receipt) -> dict[str, Any]:
    output = {
        "remote_id": receipt.remote_id,
        "remote_version": receipt.remote_version,
        "count": receipt.count,
        "digest": receipt.digest,
    }
    return {
        "status": NodeStatus.SUCCEEDED.value,
        "output": output,
        "last_error_class": "",
        "next_allowed_action": "",
        "not_before": None,
    }


def advance_node(*, op_key: str, expected_version: int, lease: Lease) -> Node:
    """Advance the node of a committed operation on its persisted receipt.

    Raises EvidenceInsufficient (with every reason) if there is no receipt or it does not satisfy the
    node's evidence spec; nothing is written then.
    """
    op = _operation(op_key)
    receipt = Receipt.objects.filter(operation=op).first()
    if receipt is None:
        raise EvidenceInsufficient(f"operation {op_key} has no persisted receipt: nothing proves the side effect")
    problems = evidence_problems(op.node, op, receipt)
    if problems:
        raise EvidenceInsufficient(
            f"receipt of {op_key} does not satisfy node {op.node.key}: " + "; ".join(problems), problems=problems
        )
    node = op.node
    if node.status == NodeStatus.SUCCEEDED:
        return node
    if node.status not in (NodeStatus.RUNNING, NodeStatus.OBSERVING):
        raise InvalidTransition(f"node {node.key} is {node.status}: it does not wait for a receipt")

    def build(current: Task, _now: datetime) -> Change:
        return _node_succeeded(current, op, receipt, operations=[], data={"op_key": op_key, "receipt_id": receipt.pk})

    compare_and_set(op.task_id, expected_version, build, lease=lease)
    return Node.objects.get(pk=node.pk)


def task_request_cancel(*, actor: Principal, task_id: int, reason: str) -> Task:
    """Record a cancel. From now on no intent can be registered or dispatched; intents never sent are
    withdrawn; what is in flight settles (stopping) and is recorded as it truly ended.

    The agent working on it may ask, or a person allowed to operate the task, whoever holds the lease.
    Asking twice changes nothing. Audited.
    """
    check_payload({"reason": reason}, what="cancel reason")
    for _attempt in range(10):
        task = _task(task_id)
        require_cancel(actor, task)
        if task.cancel_requested_at is not None or task.status in (
            TaskStatus.COMPLETED,
            TaskStatus.FAILED,
            TaskStatus.STOPPED,
            TaskStatus.QUARANTINED,
        ):
            return task

        def build(current: Task, now: datetime) -> Change:
            intents = list(Operation.objects.filter(task=current, status=OperationStatus.INTENT).select_related("node"))
            return Change(
                event="cancel_requested",
                task={
                    "cancel_requested_at": now,
                    "cancel_requested_by": str(actor),
                    "cancel_reason": reason[:500],
                    **_cancel_status(current, None, None),
                    "status_reason": "",
                    "status_detail": "",
                },
                nodes=[
                    (op.node, {"status": NodeStatus.PENDING.value})
                    for op in intents
                    if op.node.status == NodeStatus.RUNNING
                ],
                operations=[
                    (op, {"status": OperationStatus.REJECTED.value, "failure_class": "cancelled"}) for op in intents
                ],
                data={"by": str(actor), "reason": reason[:200], "withdrawn_intents": [op.op_key for op in intents]},
                guards=[guards.no_cancel()],
            )

        try:
            audited_compare_and_set(
                task_id, task.version, build, lease=None, audit=Audit(actor, "cancel_requested", reason=reason)
            )
        except VersionConflict:
            continue
        return _task(task_id)
    raise VersionConflict(f"task {task_id} kept changing; the cancel was not recorded, ask again")


def open_operations(task_id: int) -> list[Operation]:
    return list(Operation.objects.filter(task_id=task_id, status__in=_OPEN).order_by("registered_at"))


def inputs_confirm(*, task_id: int, current_versions: dict[str, str], expected_version: int, lease: Lease) -> Task:
    """After a person handed the task back, the agent reports each input ref's current version as read from
    the real source (by name, as in ``task.input_refs``). All unchanged: the agent may go on. Any changed: the
    task pauses ``input_changed`` and goes on only by an explicit choice (re-plan, or approval)."""
    task = _task(task_id)
    missing = sorted(set(task.input_refs) - set(current_versions))
    if missing:
        raise InputsRecheckRequired(f"report the current version of every input: missing {', '.join(missing)}")
    changed = {
        name: {"planned": ref["version"], "now": current_versions[name]}
        for name, ref in task.input_refs.items()
        if str(current_versions[name]) != str(ref["version"])
    }

    def build(current: Task, _now: datetime) -> Change:
        fields: dict[str, Any] = {"inputs_recheck_required": False}
        if changed:
            detail = "inputs changed while paused: " + ", ".join(
                f"{name} {v['planned']}→{v['now']}" for name, v in changed.items()
            )
            fields |= _pause(current, PauseReason.INPUT_CHANGED, detail)
        return Change(
            event="inputs_confirmed", task=fields, data={"changed": changed, "checked": len(current_versions)}
        )

    compare_and_set(task_id, expected_version, build, lease=lease)
    return _task(task_id)
