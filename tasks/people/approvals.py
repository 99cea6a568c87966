"""A person approves an approval node (a confirmation point, tasks/core/actions.py): recorded as what it is.

An approval is not a remote's answer and no one types a receipt for it. The approval record is the event that
records it (``node_approved``, at the task's next version) and its audit row; the node's receipt — which
invariant 2 and verify_log require of every succeeded node — names that record (``approval:<task uid>:<seq>``)
and states what was approved: the values the node's evidence spec pins, resolved from its input (e.g. the source's
version). So the evidence spec holds by construction, and a spec that cannot be met by approving (a value its input
does not give) is refused.

The approver must hold the task's takeover lease: the permit table lets a person decide only while they hold the
task (``decide`` by the operator: ``human``), so an approval never races the agent. The task stays ``human``; the
person hands it back (takeover_submit ``resume_agent``), which wakes the agent for the nodes after the approval.
"""

from datetime import datetime
from typing import Any

from django.db import transaction

from audit.hygiene import digest_of
from audit.principals import Principal
from leases.models import HolderKind, Lease
from leases.services import lease_open
from tasks.access.permissions import PermissionDenied, require_operate
from tasks.core import opkeys
from tasks.core.actions import is_approval
from tasks.core.errors import EvidenceInsufficient, InvalidTransition, NodeNotReady, OperationsOpen, VersionConflict
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, ChangeKind, NodeStatus, OperationStatus
from tasks.core.outcomes import RECEIPT_FIELDS
from tasks.decide.change import Change
from tasks.decide.decisions import resolved_input
from tasks.decide.evidence import evidence_problems, expected_values
from tasks.decide.receipts import receipt_summary, succeeded_fields
from tasks.engine.cas import Audit, audited_compare_and_set
from tasks.models import Node, Operation, Receipt, Task
from tasks.people.checks import stale_form
from tasks.people.takeover import takeover_submit
from tasks.rows import get_task, node_ref


def _as_receipt(node_key: str, approved: dict[str, Any]) -> dict[str, Any]:
    """The receipt's fields but its remote id, as the values the evidence spec pins (``approved``) state them: the
    count a whole number, the others text; a field the spec leaves free stays empty."""
    stated: dict[str, Any] = {}
    for name in (n for n in RECEIPT_FIELDS if n != "remote_id"):
        value = approved.get(name)
        if name != "count":
            stated[name] = "" if value is None else str(value)
        elif value is None or (isinstance(value, int) and not isinstance(value, bool)):
            stated[name] = value
        else:
            raise EvidenceInsufficient(f"node {node_key}'s evidence pins a count its input does not give as a number")
    return stated


def approval_record_id(task: Task, seq: int) -> str:
    """The id of an approval record: the task's event at ``seq`` (with its audit row)."""
    return f"approval:{task.uid.hex}:{seq}"


def approval_change(
    *, task: Task, nodes: list[Node], node_key: str, actor: Principal, note: str, attempt: int, open_ops: bool
) -> tuple[Change, Operation, Receipt]:
    """Pure: the change that records ``actor``'s approval of ``node_key`` on ``task`` as read (its version, its
    plan's ``nodes``). Raises a named refusal when the node may not be approved now."""
    node = next((n for n in nodes if n.key == node_key), None)
    if node is None:
        raise NodeNotReady(f"plan version {task.plan_version} has no node {node_key!r}")
    if not is_approval(node.action):
        raise InvalidTransition(f"node {node_key} is not an approval node: its receipt comes from its remote")
    if node.status != NodeStatus.PENDING:
        raise InvalidTransition(f"node {node_key} is {node.status}: there is nothing to approve")
    waiting = sorted(set(node.depends_on) - {n.key for n in nodes if n.status == NodeStatus.SUCCEEDED})
    if waiting:
        raise NodeNotReady(f"node {node_key} waits for {', '.join(waiting)}: approve it once they succeeded")
    if open_ops:
        raise OperationsOpen("an operation is dispatched, accepted or unknown: settle it before approving")
    seq = task.version + 1
    request = {"action": node.action, "input": resolved_input(nodes, node), "performed_by": "person"}
    op = Operation(
        node=node,
        op_key=opkeys.by_person(task.uid, node.plan_version, node.key, attempt),
        action=node.action,
        request=request,
        request_digest=digest_of(request),
    )
    receipt = Receipt(
        remote_id=approval_record_id(task, seq),
        **_as_receipt(node_key, expected_values(node, request)),
        data={"approval": {"by": str(actor), "event_seq": seq, "note_digest": digest_of(note)}},
    )
    problems = evidence_problems(node, op, receipt)
    if problems:  # a spec approving cannot meet (its input gives no value for what it pins)
        raise EvidenceInsufficient(f"approving {node_key} cannot meet its evidence: " + "; ".join(problems))
    change = Change(
        event="node_approved",
        kind=ChangeKind.DECIDE,
        nodes=[(node, succeeded_fields(receipt))],
        operations=[(op, {"status": OperationStatus.COMMITTED.value, "settled_by": str(actor)})],
        data={
            "node": node_ref(node),
            "by": str(actor),
            "approved": {k: v for k, v in receipt_summary(receipt).items() if k != "remote_id"},
            "receipts": {op.op_key: receipt_summary(receipt)},
            "note_digest": digest_of(note),
        },
    )
    return change, op, receipt


def node_approve(*, actor: Principal, task_id: int, node_key: str, expected_version: int, note: str = "") -> Task:
    """Record ``actor``'s approval of ``node_key`` as a compare-and-set on ``expected_version`` (the version the
    person saw), with its audit row, in one transaction. The actor must be allowed to operate the task and hold
    its takeover lease. A stale version is refused with the events since; a refusal writes nothing."""
    task = get_task(task_id)
    require_operate(actor, task)
    lease = _own_takeover_lease(actor, task_id)
    if task.version != expected_version:
        raise stale_form(task, expected_version)
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))
    node = next((n for n in nodes if n.key == node_key), None)
    attempt = Operation.objects.filter(node=node).count() if node is not None else 0
    open_ops = Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES]).exists()
    change, op, receipt = approval_change(
        task=task, nodes=nodes, node_key=node_key, actor=actor, note=note, attempt=attempt, open_ops=open_ops
    )

    def save_receipt(_task: Task, now: datetime) -> None:
        receipt.operation, receipt.received_at = op, now
        receipt.save(force_insert=True)

    audit = Audit(
        actor,
        "node_approved",
        reason=note,
        details={"node": node_key, "receipt": receipt_summary(receipt), "op_key": op.op_key},
    )
    try:
        with transaction.atomic():
            audited_compare_and_set(
                task_id, expected_version, change, lease=lease, audit=audit, before_event=save_receipt
            )
    except VersionConflict:
        raise stale_form(get_task(task_id), expected_version) from None
    return get_task(task_id)


def node_approve_and_resume(
    *, actor: Principal, task_id: int, node_key: str, expected_version: int, note: str = ""
) -> Task:
    """Approve ``node_key`` and hand the task back to the agent, in one transaction: node_approve, then
    takeover_submit ``resume_agent`` on the version the approval made (the agent is woken once it commits). Both
    land or neither does; a stale version is refused with the events since and writes nothing."""
    with transaction.atomic():
        approved = node_approve(
            actor=actor, task_id=task_id, node_key=node_key, expected_version=expected_version, note=note
        )
        return takeover_submit(
            actor=actor,
            lease=_own_takeover_lease(actor, task_id),
            based_on_version=approved.version,
            decision="resume_agent",
            note=note or f"approved {node_key}",
        )


def _own_takeover_lease(actor: Principal, task_id: int) -> Lease:
    lease = lease_open(task_id)
    if lease is None or lease.holder_kind != HolderKind.OPERATOR or lease.holder_id != actor.id:
        holder = f"{lease.holder_kind}:{lease.holder_id}" if lease else "nobody"
        raise PermissionDenied(
            f"{actor} does not hold task {task_id}'s takeover lease (held by {holder}): take the task over first",
            needs="takeover_lease",
        )
    return lease
