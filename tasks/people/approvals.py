"""A person approves an approval node (a confirmation point, tasks/core/actions.py): recorded as what it is, and
bound to the exact calls it permits (tasks/decide/approval_binding.py).

An approval is not a remote's answer and no one types a receipt for it. The approval record is the event that
records it (``node_approved``, at the task's next version) and its audit row; the node's receipt — which
invariant 2 and verify_log require of every succeeded node — names that record (``approval:<task uid>:<seq>``)
and states what was approved: the values the node's evidence spec pins, resolved from its input (e.g. the source's
version). So the evidence spec holds by construction, and a spec that cannot be met by approving (a value its input
does not give) is refused.

What it permits is bound on the approval node's row, in the same write: the digest of the request each pending
gated node will send (``{"action", "input"}``, resolved as the start resolves it), the plan revision it is given
under and an expiry on the database clock — ``RECKON_APPROVAL_TTL`` after the approval, or the validity the approver
chooses, up to ``RECKON_APPROVAL_TTL_MAX``. The person approves what their page showed: the digest of the requests
they were shown (``approving``) must be the one asked now, or the approval is refused (a stale form). If the log
does not hold that request yet (the agent never reached the approval: a person took the task over first), the
approval records it first (event ``approval_proposed``), in the same transaction. An approval whose binding no
longer holds — expired, given under an earlier plan revision, not naming a ready gated node's request — is given
again the same way: a new record, a new binding.

The approver must hold the task's takeover lease: the permit table lets a person decide only while they hold the
task (``decide`` by the operator: ``human``), so an approval never races the agent. The task stays ``human``; the
person hands it back (takeover_submit ``resume_agent``), which wakes the agent for the nodes after the approval.
"""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from audit.hygiene import digest_of
from audit.principals import Principal
from audit.services import audit_append, audit_check
from leases import clock
from leases.models import HolderKind, Lease
from leases.services import lease_open
from tasks.access.permissions import PermissionDenied, require_operate
from tasks.core import opkeys
from tasks.core.actions import is_approval
from tasks.core.errors import (
    ApprovalRequestChanged,
    ApprovalTtlInvalid,
    EvidenceInsufficient,
    InvalidTransition,
    NodeNotReady,
    OperationsOpen,
    VersionConflict,
)
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, ChangeKind, NodeStatus, OperationStatus
from tasks.core.outcomes import RECEIPT_FIELDS
from tasks.decide.approval_binding import Awaited, awaited, proposed
from tasks.decide.change import AtCommit, Change
from tasks.decide.decisions import resolved_input
from tasks.decide.evidence import evidence_problems, expected_values
from tasks.decide.receipts import receipt_summary, succeeded_fields
from tasks.engine.cas import compare_and_set
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


def approval_ttl(asked: timedelta | None = None) -> timedelta:
    """How long an approval given now binds: the deployment's default (RECKON_APPROVAL_TTL), or ``asked`` — more
    than nothing, at most RECKON_APPROVAL_TTL_MAX. Anything else is refused by name."""
    longest: timedelta = settings.RECKON_APPROVAL_TTL_MAX
    if asked is None:
        default: timedelta = settings.RECKON_APPROVAL_TTL
        return min(default, longest)
    if not timedelta(0) < asked <= longest:
        raise ApprovalTtlInvalid(
            f"an approval is valid for more than 0 s and at most {int(longest.total_seconds())} s, "
            f"not {int(asked.total_seconds())} s",
            ttl_seconds=int(asked.total_seconds()),
            max_seconds=int(longest.total_seconds()),
        )
    return asked


def approval_asked(
    *, task: Task, nodes: list[Node], node_key: str, now: datetime, open_ops: bool, approving: str
) -> Awaited:
    """Pure: what approving ``node_key`` on ``task`` as read (its plan's ``nodes``, the database clock's ``now``)
    answers — the approval awaited, with the requests it will permit — or the named refusal. ``approving``: the
    digest of the requests the person was shown; it must be the one asked now."""
    node = next((n for n in nodes if n.key == node_key), None)
    if node is None:
        raise NodeNotReady(f"plan version {task.plan_version} has no node {node_key!r}")
    if not is_approval(node.action):
        raise InvalidTransition(f"node {node_key} is not an approval node: its receipt comes from its remote")
    waiting = sorted(set(node.depends_on) - {n.key for n in nodes if n.status == NodeStatus.SUCCEEDED})
    if node.status == NodeStatus.PENDING and waiting:
        raise NodeNotReady(f"node {node_key} waits for {', '.join(waiting)}: approve it once they succeeded")
    if open_ops:
        raise OperationsOpen("an operation is dispatched, accepted or unknown: settle it before approving")
    found = next((a for a in awaited(plan_version=task.plan_version, nodes=nodes, now=now) if a.approval is node), None)
    if found is None:
        if node.status == NodeStatus.SUCCEEDED:
            raise InvalidTransition(
                f"node {node_key} is approved and binds every ready request: there is nothing to approve"
            )
        raise InvalidTransition(f"node {node_key} is {node.status}: there is nothing to approve")
    if approving != found.proposal.digest:
        raise ApprovalRequestChanged(
            f"the requests you were shown ({approving or 'none'}) are not the ones approval {node_key} is asked for "
            f"now ({found.proposal.digest}): read the page again and approve what it shows",
            approval=node_key,
            approving=approving,
            asked=found.proposal.digest,
        )
    return found


def approval_change(
    *,
    task: Task,
    nodes: list[Node],
    found: Awaited,
    actor: Principal,
    note: str,
    attempt: int,
    seq: int,
    ttl: timedelta,
) -> tuple[Change, Operation, Receipt]:
    """Pure: the change that records ``actor``'s approval of ``found`` as event ``seq``: the approval node succeeded
    (or re-approved) with a receipt naming the record, and its binding — the requests it permits, the plan
    revision, an expiry ``ttl`` after the write on the database clock."""
    node, asked = found.approval, found.proposal
    request = {
        "action": node.action,
        "input": resolved_input(nodes, node),
        "performed_by": "person",
        "permits": asked.digest,
        "plan_revision": asked.plan_version,
    }
    op = Operation(
        node=node,
        op_key=opkeys.by_person(task.uid, node.plan_version, node.key, attempt),
        action=node.action,
        request=request,
        request_digest=digest_of(request),
    )
    receipt = Receipt(
        remote_id=approval_record_id(task, seq),
        **_as_receipt(node.key, expected_values(node, request)),
        data={
            "approval": {"by": str(actor), "event_seq": seq, "note_digest": digest_of(note), "permits": asked.digest}
        },
    )
    problems = evidence_problems(node, op, receipt)
    if problems:  # a spec approving cannot meet (its input gives no value for what it pins)
        raise EvidenceInsufficient(f"approving {node.key} cannot meet its evidence: " + "; ".join(problems))
    fields = succeeded_fields(receipt)
    if node.status == NodeStatus.SUCCEEDED:
        del fields["status"]  # approved again: it stays succeeded, with the new record
    fields |= {
        "approval_proposed_digest": "",  # answered
        "approval_digest": asked.digest,
        "approval_requests": dict(asked.requests),
        "approval_plan_version": asked.plan_version,
        "approval_expires_at": AtCommit(ttl),
        "approval_seq": seq,
        "approved_by": str(actor),
    }
    change = Change(
        event="node_approved",
        kind=ChangeKind.DECIDE,
        nodes=[(node, fields)],
        operations=[(op, {"status": OperationStatus.COMMITTED.value, "settled_by": str(actor)})],
        data={
            "node": node_ref(node),
            "by": str(actor),
            "approved": {k: v for k, v in receipt_summary(receipt).items() if k != "remote_id"},
            "receipts": {op.op_key: receipt_summary(receipt)},
            "note_digest": digest_of(note),
            "digest": asked.digest,
            "requests": dict(asked.requests),
            "plan_revision": asked.plan_version,
            "expires_at": AtCommit(ttl),
            "ttl_seconds": int(ttl.total_seconds()),
            "again": found.code if node.status == NodeStatus.SUCCEEDED else "",
        },
    )
    return change, op, receipt


def node_approve(
    *,
    actor: Principal,
    task_id: int,
    node_key: str,
    expected_version: int,
    approving: str,
    ttl: timedelta | None = None,
    note: str = "",
) -> Task:
    """Record ``actor``'s approval of ``node_key`` as a compare-and-set on ``expected_version`` (the version the
    person saw), bound to the requests whose digest ``approving`` names (the ones the person was shown) for ``ttl``
    (default RECKON_APPROVAL_TTL), with its audit row, in one transaction. The actor must be allowed to operate the
    task and hold its takeover lease. A stale version or digest is refused (with the events since); a refusal
    writes nothing."""
    task = get_task(task_id)
    require_operate(actor, task)
    lease = _own_takeover_lease(actor, task_id)
    if task.version != expected_version:
        raise stale_form(task, expected_version)
    validity = approval_ttl(ttl)
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))
    node = next((n for n in nodes if n.key == node_key), None)
    attempt = Operation.objects.filter(node=node).count() if node is not None else 0
    open_ops = Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES]).exists()
    found = approval_asked(
        task=task, nodes=nodes, node_key=node_key, now=clock.now(), open_ops=open_ops, approving=approving
    )
    seq = expected_version + (1 if found.recorded else 2)  # after the proposal, when the log does not hold it yet
    change, op, receipt = approval_change(
        task=task, nodes=nodes, found=found, actor=actor, note=note, attempt=attempt, seq=seq, ttl=validity
    )

    def save_receipt(_task: Task, now: datetime) -> None:
        receipt.operation, receipt.received_at = op, now
        receipt.save(force_insert=True)

    details: dict[str, Any] = {
        "node": node_key,
        "receipt": receipt_summary(receipt),
        "op_key": op.op_key,
        "digest": found.proposal.digest,
        "requests": dict(found.proposal.requests),
        "plan_revision": found.proposal.plan_version,
        "ttl_seconds": int(validity.total_seconds()),
    }
    audit_check(action="node_approved", reason=note, details=details | {"expires_at": ""})
    try:
        with transaction.atomic():
            version = expected_version
            if not found.recorded:
                compare_and_set(task_id, version, proposed(found, kind=ChangeKind.PROPOSE), lease=lease)
                version += 1
            applied = compare_and_set(task_id, version, change, lease=lease, before_event=save_receipt)
            audit_append(
                actor=actor,
                action="node_approved",
                at=applied.at,
                task_id=task_id,
                lease_epoch=lease.epoch,
                version_before=expected_version,
                version_after=applied.version,
                reason=note,
                details=details | {"expires_at": (applied.at + validity).isoformat()},
            )
    except VersionConflict:
        raise stale_form(get_task(task_id), expected_version) from None
    return get_task(task_id)


def node_approve_and_resume(
    *,
    actor: Principal,
    task_id: int,
    node_key: str,
    expected_version: int,
    approving: str,
    ttl: timedelta | None = None,
    note: str = "",
) -> Task:
    """Approve ``node_key`` and hand the task back to the agent, in one transaction: node_approve, then
    takeover_submit ``resume_agent`` on the version the approval made (the agent is woken once it commits). Both
    land or neither does; a stale version or digest is refused with the events since and writes nothing."""
    with transaction.atomic():
        approved = node_approve(
            actor=actor,
            task_id=task_id,
            node_key=node_key,
            expected_version=expected_version,
            approving=approving,
            ttl=ttl,
            note=note,
        )
        return takeover_submit(
            actor=actor,
            lease=_own_takeover_lease(actor, task_id),
            based_on_version=approved.version,
            decision="resume_agent",
            note=note or f"approved {node_key}",
        )


def approvals_awaited(task: Task, *, now: datetime | None = None) -> list[Awaited]:
    """The approvals a person may give on ``task`` now, each with the requests it would permit (for the page's
    form: its ``approving`` is ``proposal.digest``)."""
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))
    return awaited(plan_version=task.plan_version, nodes=nodes, now=now if now is not None else clock.now())


def _own_takeover_lease(actor: Principal, task_id: int) -> Lease:
    lease = lease_open(task_id)
    if lease is None or lease.holder_kind != HolderKind.OPERATOR or lease.holder_id != actor.id:
        holder = f"{lease.holder_kind}:{lease.holder_id}" if lease else "nobody"
        raise PermissionDenied(
            f"{actor} does not hold task {task_id}'s takeover lease (held by {holder}): take the task over first",
            needs="takeover_lease",
        )
    return lease
