"""Human takeover (DESIGN §7): claim, renew, release and decide (settlement by hand: tasks/people/settlement.py; forced
release and its review: tasks/people/forced_release.py).

Lease and takeover states (per task)::

    free ──claim──▶ operator holds ──submit / release──▶ free
      │                 ▲   │ renew (same holder, until expiry + grace)
      │                 │   └─ expiry + grace ──▶ free (audited "takeover_expired" at the next grant)
      │ agent holds     │
      └─claim──▶ reserved for operator ──agent releases or lapses──▶ claim again ──▶ operator holds
                 (agents: no new intent, directive "stop takeover_requested"; in-flight work may settle)
    any holder ──admin force-release (justification, impact)──▶ free; queued for review by another admin

While an operator holds the lease the task shows ``human`` (unless a cancel is recorded) and no agent can
write: there is one open lease per task, and every write is a compare-and-set on its epoch.
Every step is audited in the same transaction as the change it records.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.db import transaction

from audit.hygiene import check_payload, digest_of
from audit.principals import Principal
from audit.reasons import MIN_REASON
from audit.services import audit_append
from leases import clock
from leases.errors import LeaseHeld, LeaseLost, LeaseReserved
from leases.models import HolderKind, Lease
from leases.services import (
    lease_acquire,
    lease_open,
    lease_release,
    lease_renew,
    lease_reservation,
    lease_reserve,
    lease_unreserve,
    operator_ttl,
)
from tasks.access.permissions import require_admin, require_operate
from tasks.access.permits import permits
from tasks.core import opkeys
from tasks.core.errors import (
    EvidenceInsufficient,
    InvalidTransition,
    OperationsOpen,
    TakeoverHeld,
    VersionConflict,
)
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    Actor,
    ChangeKind,
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
)
from tasks.decide.approval_binding import person_refusal
from tasks.decide.change import Change
from tasks.decide.evidence import evidence_problems
from tasks.decide.receipts import receipt_summary, succeeded_fields
from tasks.engine.cas import Audit, audited_compare_and_set
from tasks.engine.enqueue import wake_agent_on_commit
from tasks.engine.protocol import resolve_input
from tasks.models import Attachment, Node, Operation, Receipt, Task
from tasks.people.attachments import AttachmentIn, store_attachment
from tasks.people.checks import own_lease, stale_form
from tasks.rows import get_task as _task


@dataclass(frozen=True)
class Claim:
    granted: bool
    lease: Lease | None = None
    waiting_for: str = ""


def takeover_claim(*, actor: Principal, task_id: int) -> Claim:
    """Take the task over. Granted at once if nobody holds it; if an agent does, the task is reserved for
    this operator (agents start nothing new) and the claim is granted, by claiming again, once the agent's
    lease is released or lapsed — never while an agent may still advance. Claiming twice is harmless."""
    task = _task(task_id)
    refused = permits(actor, ChangeKind.TAKEOVER, task)
    if refused is not None:
        raise refused
    with transaction.atomic():
        try:
            lease = lease_acquire(
                task_id=task_id, holder_kind=HolderKind.OPERATOR, holder_id=actor.id, ttl=operator_ttl()
            )
        except LeaseReserved as reserved:
            raise TakeoverHeld(
                f"operator {reserved.operator_id} is already waiting to take task {task_id} over"
            ) from None
        except LeaseHeld:
            return _wait_for_holder(actor, task_id)
        lease_unreserve(task_id=task_id, operator_id=actor.id)
        current = _task(task_id)
        to_human = {"status": TaskStatus.HUMAN.value} if current.cancel_requested_at is None else {}
        if current.status == TaskStatus.HUMAN:
            to_human = {}
        if to_human and current.status == TaskStatus.PAUSED:
            to_human |= {"status_reason": "", "status_detail": ""}
        audited_compare_and_set(
            task_id,
            current.version,
            Change(
                event="takeover_granted",
                kind=ChangeKind.TAKEOVER,
                task=to_human,
                data={"operator": actor.id, "epoch": lease.epoch},
            ),
            lease=lease,
            audit=Audit(
                actor,
                "takeover_granted",
                details={"status_before": current.status, "status_reason_before": current.status_reason},
            ),
        )
        return Claim(granted=True, lease=lease)


def _wait_for_holder(actor: Principal, task_id: int) -> Claim:
    # Locked: a holder releasing right now is waited for and then not seen as open, so a takeover is never
    # requested from an agent that already let go (and another person may already hold the task).
    holder = Lease.objects.open().select_for_update().filter(task_id=task_id).first()
    if holder is None:  # released between the two reads: claim again
        raise VersionConflict(f"task {task_id}'s lease changed while claiming; claim again")
    if holder.holder_kind == HolderKind.OPERATOR:
        if holder.holder_id == actor.id:  # a reconnecting browser: its own lease, renewed
            return Claim(
                granted=True, lease=takeover_renew(actor=actor, lease=holder, expected_renewal_seq=holder.renewal_seq)
            )
        raise TakeoverHeld(f"operator {holder.holder_id} holds task {task_id}", holder=holder.holder_id)
    already = lease_reservation(task_id)
    try:
        lease_reserve(task_id=task_id, operator_id=actor.id)
    except LeaseReserved as reserved:
        raise TakeoverHeld(
            f"operator {reserved.operator_id} is already waiting to take task {task_id} over",
            holder=reserved.operator_id,
        ) from None
    if already is None:
        audited_compare_and_set(
            task_id,
            _task(task_id).version,
            Change(
                event="takeover_requested",
                kind=ChangeKind.TAKEOVER,
                data={"operator": actor.id, "agent": holder.holder_id},
            ),
            lease=None,
            actor=Actor.PERSON,
            audit=Audit(actor, "takeover_requested", epoch=holder.epoch, details={"agent": holder.holder_id}),
        )
    return Claim(granted=False, waiting_for=f"{holder.holder_kind}:{holder.holder_id}")


def takeover_withdraw(*, actor: Principal, task_id: int) -> None:
    """The waiting operator no longer waits for the agent's lease: agents may go on. Only that operator (or an
    admin) may withdraw it; there is nothing to record when nobody waits."""
    require_operate(actor, _task(task_id))
    with transaction.atomic():
        reservation = lease_reservation(task_id)
        if reservation is None:
            return
        if reservation.holder_id != actor.id:
            require_admin(actor, f"withdraw operator {reservation.holder_id}'s takeover request")
        lease_unreserve(task_id=task_id, operator_id=reservation.holder_id)
        audit_append(
            actor=actor,
            action="takeover_withdrawn",
            at=clock.now(),
            task_id=task_id,
            details={"operator": reservation.holder_id},
        )


def takeover_renew(*, actor: Principal, lease: Lease, expected_renewal_seq: int) -> Lease:
    """The operator's browser keeps its takeover lease alive. Not audited row by row (a heartbeat every few
    seconds would serialise on the audit chain's head): the claim, release, expiry and forced release are."""
    own_lease(actor, lease)
    require_operate(actor, _task(lease.task_id))
    return lease_renew(lease=lease, expected_renewal_seq=expected_renewal_seq, ttl=operator_ttl())


def takeover_release(*, actor: Principal, lease: Lease, reason: str = "") -> Lease:
    """Give the lease back without a decision: the task stays with people (``human``) for another operator."""
    own_lease(actor, lease)
    with transaction.atomic():
        released = lease_release(lease=lease)
        audit_append(
            actor=actor,
            action="takeover_released",
            at=released.released_at or clock.now(),
            task_id=lease.task_id,
            lease_epoch=lease.epoch,
            reason=reason,
        )
        return released


@dataclass(frozen=True)
class NodeResult:
    """What a person did for one node, as a receipt would say it, with the evidence they saw."""

    node_key: str
    remote_id: str
    remote_version: str = ""
    count: int | None = None
    digest: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)  # e.g. {"kind": "console_url", "value": …}
    attachments: list[AttachmentIn] = field(default_factory=list)  # files, stored by digest


Decision = Literal["resume_agent", "end_task", "replan"]


def takeover_submit(
    *,
    actor: Principal,
    lease: Lease,
    based_on_version: int,
    decision: Decision,
    results: list[NodeResult] | None = None,
    note: str = "",
    end_status: Literal["completed", "failed", ""] = "",
    replan_reason: str = "",
) -> Task:
    """End a takeover with a structured result and one decision, as a compare-and-set on the version the
    form was based on. A stale form is refused with what changed since. Each node result must satisfy that
    node's evidence spec; it is recorded as an operation settled by this person, with its receipt.

    ``resume_agent``: the agent's next directive re-reads facts (open operations, input versions) first; its
    wake-up is sent once the decision is committed.
    ``end_task``: ``completed`` only when every node has a satisfying receipt; ``failed`` as stated.
    ``replan``: the task pauses ``needs_replan`` with the reason, for a new plan.
    """
    results = results or []
    task, planned = _validated(actor, lease, based_on_version, decision, results, note, end_status, replan_reason)

    def build(current: Task, now: datetime) -> Change:
        node_changes: list[tuple[Node, dict[str, Any]]] = []
        op_changes: list[tuple[Operation, dict[str, Any]]] = []
        for node, op, receipt in planned:
            # An intent registered for the node but never sent is withdrawn: the person did the work.
            for intent in Operation.objects.filter(node=node, status=OperationStatus.INTENT):
                op_changes.append((intent, {"status": OperationStatus.REJECTED.value, "failure_class": "withdrawn"}))
            op.registered_at, op.settled_at = now, now
            node_changes.append((node, succeeded_fields(receipt)))
            op_changes.append(
                (
                    op,
                    {
                        "status": OperationStatus.COMMITTED.value,
                        "remote_id": receipt.remote_id,
                        "settled_by": str(actor),
                    },
                )
            )
        return Change(
            event="takeover_result_submitted",
            kind=ChangeKind.DECIDE,
            task=_decision_fields(current, decision, end_status, replan_reason, actor),
            nodes=node_changes,
            operations=op_changes,
            data={
                "operator": actor.id,
                "decision": decision,
                "end_status": end_status,
                "nodes": [r.node_key for r in results],
                "receipts": {op.op_key: receipt_summary(receipt) for _n, op, receipt in planned},
                "note_digest": digest_of(note),
            },
        )

    stored = [(r.node_key, a.name, *store_attachment(a)) for r in results for a in r.attachments]

    def save_receipts(_task: Task, now: datetime) -> None:
        for node, op, receipt in planned:
            receipt.data = receipt.data | {"attachments": [list(x[1:]) for x in stored if x[0] == node.key]}
            receipt.operation, receipt.received_at = op, now
            receipt.save(force_insert=True)
        Attachment.objects.bulk_create(
            Attachment(
                task=_task,
                node_key=node_key,
                name=name[:200],
                sha256=sha256,
                size=size,
                uploaded_by=str(actor),
                uploaded_at=now,
                task_version=_task.version,
            )
            for node_key, name, sha256, size in stored
        )

    audit = Audit(
        actor,
        "takeover_result_submitted",
        reason=replan_reason or note,
        details={
            "decision": decision,
            "end_status": end_status,
            "results": [{"node": r.node_key, **receipt_summary(r), "evidence": r.evidence} for r in results],
            "attachments": [
                {"node": n, "name": name, "sha256": digest, "size": size} for n, name, digest, size in stored
            ],
        },
    )
    with transaction.atomic():
        try:
            audited_compare_and_set(
                task.pk, based_on_version, build, lease=lease, audit=audit, before_event=save_receipts
            )
        except VersionConflict:
            raise stale_form(_task(task.pk), based_on_version) from None  # moved while we validated
        lease_release(lease=lease)
        if decision == "resume_agent":
            wake_agent_on_commit(task.pk)
    return _task(task.pk)


def _validated(
    actor: Principal,
    lease: Lease,
    based_on_version: int,
    decision: str,
    results: list[NodeResult],
    note: str,
    end_status: str,
    replan_reason: str,
) -> tuple[Task, list[tuple[Node, Operation, Receipt]]]:
    """Every check of a takeover result that needs no write: who, the decision, hygiene, the version the form was
    based on, each node's evidence, and what ending the task needs. Shared by the preview and the submit."""
    own_lease(actor, lease)
    task = _task(lease.task_id)
    require_operate(actor, task)
    _check_decision(decision, end_status, replan_reason)
    # Judged here besides in the audit row: the preview writes none, and the submit stores attachments before it.
    check_payload(
        {
            "note": note,
            "reason": replan_reason,
            "results": [{"node": r.node_key, **receipt_summary(r), "evidence": r.evidence} for r in results],
        },
        what="result",
    )
    if task.version != based_on_version:
        raise stale_form(task, based_on_version)
    nodes = {n.key: n for n in Node.objects.filter(task=task, plan_version=task.plan_version)}
    planned = _planned_results(task, nodes, results)
    done_after = {k for k, n in nodes.items() if n.status == NodeStatus.SUCCEEDED} | {r.node_key for r in results}
    open_ops = Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES])
    if decision == "end_task" and open_ops.exists():
        raise OperationsOpen("settle every dispatched or unknown operation before ending the task")
    if decision == "end_task" and end_status == "completed" and done_after != set(nodes):
        missing = sorted(set(nodes) - done_after)
        raise EvidenceInsufficient(f"the task cannot be completed: no receipt yet for {', '.join(missing)}")
    return task, planned


@dataclass(frozen=True)
class SubmitPreview:
    """What a takeover result would change, computed without writing: the staged review's first step."""

    task_version: int
    event: str
    task_status_before: str
    task_fields: dict[str, Any]  # the task's fields after (empty: unchanged)
    nodes: list[tuple[str, str, str]]  # (node key, status before, status after)
    receipts: dict[str, dict[str, Any]]  # op key → receipt summary
    lease_released: bool
    wakes_agent: bool


def takeover_preview(
    *,
    actor: Principal,
    lease: Lease,
    based_on_version: int,
    decision: Decision,
    results: list[NodeResult] | None = None,
    note: str = "",
    end_status: Literal["completed", "failed", ""] = "",
    replan_reason: str = "",
) -> SubmitPreview:
    """The same checks as takeover_submit and the change it would make, written nowhere. A preview is advice: the
    submit checks everything again on the version the form carries."""
    results = results or []
    task, planned = _validated(actor, lease, based_on_version, decision, results, note, end_status, replan_reason)
    return SubmitPreview(
        task_version=task.version,
        event="takeover_result_submitted",
        task_status_before=task.status,
        task_fields=_decision_fields(task, decision, end_status, replan_reason, actor),
        nodes=[(node.key, node.status, NodeStatus.SUCCEEDED.value) for node, _op, _r in planned],
        receipts={op.op_key: receipt_summary(receipt) for _n, op, receipt in planned},
        lease_released=True,
        wakes_agent=decision == "resume_agent",
    )


def _check_decision(decision: str, end_status: str, replan_reason: str) -> None:
    if decision not in ("resume_agent", "end_task", "replan"):
        raise InvalidTransition(f"unknown decision {decision!r}: resume_agent, end_task or replan")
    if decision == "end_task" and end_status not in ("completed", "failed"):
        raise InvalidTransition("end_task needs end_status completed or failed")
    if decision == "replan" and len(replan_reason.strip()) < MIN_REASON:
        raise InvalidTransition(f"replan needs the reason (at least {MIN_REASON} characters)")


def _planned_results(
    task: Task, nodes: dict[str, Node], results: list[NodeResult]
) -> list[tuple[Node, Operation, Receipt]]:
    """Validate every node result against its node's evidence spec, before anything is written."""
    planned = []
    seen: set[str] = set()
    now = clock.now()  # an approval's expiry is judged on the database clock
    for result in results:
        node = nodes.get(result.node_key)
        if node is None or result.node_key in seen:
            raise InvalidTransition(f"no node {result.node_key!r} in the current plan, or given twice")
        seen.add(result.node_key)
        if node.status == NodeStatus.SUCCEEDED:
            raise InvalidTransition(f"node {node.key} already succeeded on a receipt")
        if Operation.objects.filter(node=node, status__in=[s.value for s in OPEN_OPERATION_STATUSES]).exists():
            raise OperationsOpen(f"node {node.key} has an operation in flight: settle it by op key first")
        attempt = Operation.objects.filter(node=node).count()
        op = Operation(
            node=node,
            op_key=opkeys.by_person(task.uid, node.plan_version, node.key, attempt),
            action=node.action,
        )
        receipt = Receipt(**receipt_summary(result), data={"evidence": result.evidence})
        op.request = {"action": node.action, "input": resolve_input(task, node), "performed_by": "person"}
        op.request_digest = digest_of(op.request)
        # A result for a step an approval gates does the gated work: only under that approval (the start's rule).
        refused = person_refusal(
            plan_version=task.plan_version, nodes=list(nodes.values()), now=now, node=node, request=op.request
        )
        if refused is not None:
            raise refused
        problems = evidence_problems(node, op, receipt) if result.remote_id else ["no remote id"]
        if problems:
            raise EvidenceInsufficient(
                f"the result for {node.key} does not satisfy its evidence: " + "; ".join(problems), problems=problems
            )
        planned.append((node, op, receipt))
    return planned


def _decision_fields(
    current: Task, decision: str, end_status: str, replan_reason: str, actor: Principal
) -> dict[str, Any]:
    if current.cancel_requested_at is not None:
        return {}  # a recorded cancel keeps its stopping/stopped status; the operator's receipts still count
    if decision == "resume_agent":
        return {
            "status": TaskStatus.PENDING.value,
            "status_reason": "",
            "status_detail": "",
            "inputs_recheck_required": bool(current.input_refs),
        }
    if decision == "end_task":
        return {"status": end_status, "status_reason": "", "status_detail": f"ended by {actor}"[:500]}
    return {
        "status": TaskStatus.PAUSED.value,
        "status_reason": PauseReason.NEEDS_REPLAN.value,
        "status_detail": replan_reason[:500],
    }


def takeover_lease_of(*, actor: Principal, task_id: int, epoch: int) -> Lease:
    """The takeover lease a page was rendered with: the task's open lease at ``epoch``, held by ``actor``. A page
    from an older grant (released, expired and re-granted, forced off) gets LeaseLost and writes nothing."""
    lease = lease_open(task_id)
    if lease is None or lease.epoch != epoch:
        raise LeaseLost(task_id, epoch, "the task's lease is no longer the one this page was given")
    own_lease(actor, lease)
    return lease
