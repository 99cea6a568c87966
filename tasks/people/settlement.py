"""Settlement by hand: a person holding the takeover lease settles an operation the remote could not settle —
it happened (with the receipt that proves it), it never took effect, or it happened and is to be compensated (a new
operation with its own op key, sent like any other). Each is audited in the transaction of the change."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from django.db import transaction

from audit.hygiene import check_payload, digest_of
from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.errors import LeaseExpired
from leases.models import HolderKind, Lease
from leases.services import lease_open
from leases.state import lease_state
from tasks.access.permissions import require_operate
from tasks.access.permits import permits_principal
from tasks.core import opkeys
from tasks.core.errors import (
    EvidenceInsufficient,
    InvalidTransition,
    TaskError,
    TaskNotFound,
    UnknownTaskKind,
)
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    ChangeKind,
    OperationStatus,
)
from tasks.core.outcomes import Accepted, Committed, Failed, Fenced, Outcome, Unprovable
from tasks.decide import decisions
from tasks.decide.change import Change
from tasks.decide.receipts import receipt_summary, temp_locators
from tasks.engine.cas import compare_and_set
from tasks.engine.connectors import Fencing, reconcile
from tasks.engine.protocol import record_outcome
from tasks.engine.registry import connector_for
from tasks.engine.snapshot import task_snapshot
from tasks.models import Operation, OperationPurpose, Task
from tasks.people.checks import stale_form

Resolution = Literal["done", "not_done", "compensate"]


def operation_settle_by_hand(
    *,
    actor: Principal,
    task_id: int,
    op_key: str,
    expected_version: int,
    resolution: Resolution,
    receipt: Committed | None = None,
    note: str,
    temp_locators: Sequence[str] = (),
) -> Operation:
    """A person holding the takeover lease on ``task_id`` settles an operation the remote could not settle, with a
    note of what they checked (at least MIN_NOTE characters: the evidence of a not-done, the context of a receipt).

    ``done``: it happened, and ``receipt`` proves it (checked against the node's evidence spec).
    ``not_done``: it never took effect; the node may run again (a new op key). Only on a final "not found": the
    server fences the op key first when the task's kind has a connector here that can; otherwise its deadline and
    the clock skew must have passed (decisions.settle_not_done; NotFoundNotFinal before then).
    ``compensate``: it happened (``receipt``), and a compensation is registered as a new operation with its
    own op key, to be sent like any other. Audited in the transaction of the change.

    ``temp_locators``: what the operation left behind at the remote (its staging objects, exactly as a receipt's
    ``data["temp"]`` names them; ``settle_prefill`` reads them from the remote when it can be asked). They are
    recorded with the receipt as the task's temp resources, so the cleanup deletes them once the task has ended. A
    "not done" left nothing behind: locators with it are refused, as is anything a receipt could not name.
    """
    op = _operation_of(task_id, op_key)
    require_operate(actor, op.task)
    if len(note.strip()) < MIN_NOTE:
        raise EvidenceInsufficient(
            f"settling by hand needs a note of what you checked (at least {MIN_NOTE} characters)"
        )
    if resolution not in ("done", "not_done", "compensate"):
        raise InvalidTransition(f"unknown resolution {resolution!r}")
    if op.status not in OPEN_OPERATION_STATUSES:
        raise InvalidTransition(f"operation {op_key} is {op.status}: nothing to settle")
    if resolution in ("done", "compensate") and (receipt is None or not receipt.remote_id):
        raise EvidenceInsufficient(f"settling {op_key} as done needs the receipt (with its remote id) that proves it")
    if resolution == "not_done" and receipt is not None:
        raise InvalidTransition(f"{op_key} confirmed not done cannot come with a receipt of a commit")
    if resolution == "compensate" and not op.node.compensation:
        raise InvalidTransition(f"node {op.node.key} has no compensation action")
    if temp_locators and resolution == "not_done":
        raise InvalidTransition(f"{op_key} confirmed not done left nothing behind: it comes without temp resources")
    if temp_locators and receipt is not None:
        receipt = _with_temps(receipt, temp_locators)
    # The note before its audit row, which follows the settle's compare-and-set (whose observers report it).
    check_payload({"note": note}, what="settlement")
    lease = held_takeover(actor, task_id)
    denied = permits_principal(actor, ChangeKind.SETTLE, op.task, lease=lease)
    if denied is not None:
        raise denied
    fenced = resolution == "not_done" and _fenced(op, expected_version)
    with transaction.atomic():
        before = expected_version
        snap = task_snapshot(task_id=task_id, lease=lease)
        if snap.version != expected_version:
            raise stale_form(snap.task, expected_version)
        if receipt is not None:
            record_outcome(snap, op_key, receipt, lease=lease, settled_by=str(actor))
        else:
            settled = snap.operation(op_key)
            if settled is None:  # settled meanwhile, at this very version: nothing outstanding
                raise InvalidTransition(f"operation {op_key} has nothing outstanding to settle")
            change = decisions.settle_not_done(snap, settled, by=str(actor), fenced=fenced)
            compare_and_set(task_id, snap.version, change, lease=lease, snapshot=snap)
        expected_version += 1
        if resolution == "compensate":
            _register_compensation(op, expected_version, lease, actor)
            expected_version += 1
        audit_append(
            actor=actor,
            action="operation_resolved_by_person",
            at=clock.now(),
            task_id=task_id,
            lease_epoch=lease.epoch,
            version_before=before,
            version_after=expected_version,
            reason=note,
            details={
                "op_key": op_key,
                "resolution": resolution,
                "receipt": receipt_summary(receipt) if receipt else None,
            }
            | ({"fenced": fenced} if resolution == "not_done" else {}),
        )
    return Operation.objects.get(pk=op.pk)


def _with_temps(receipt: Committed, locators: Sequence[str]) -> Committed:
    """The receipt with the staging objects a person recorded, beside any it named itself — held to the rule every
    receipt's temp resources are (tasks.decide.receipts.temp_locators: a list of locators, each at most 500
    characters), and to the checkpoints' hygiene: EvidenceInsufficient / a hygiene refusal, before anything is
    written."""
    named = [str(locator).strip() for locator in locators]
    merged = Committed(
        remote_id=receipt.remote_id,
        remote_version=receipt.remote_version,
        count=receipt.count,
        digest=receipt.digest,
        data=receipt.data | {"temp": [*receipt.data.get("temp", []), *named]},
    )
    temps = temp_locators(merged)
    check_payload({"temp": temps}, what="settlement")
    return replace(merged, data=merged.data | {"temp": temps})


def settle_prefill(*, kind: str, op_key: str) -> list[str]:
    """The staging objects the remote says ``op_key`` left, to pre-fill a person's settlement: asked by op key with
    the connector of the task's ``kind`` (I/O, outside any transaction; nothing is read or recorded here). Empty
    when the kind has no connector here, the remote cannot be asked, or its answer names none."""
    try:
        connector = connector_for(kind)
    except UnknownTaskKind:
        return []
    answer = connector.lookup(op_key)
    if not isinstance(answer, Committed):
        return []
    try:
        return temp_locators(answer)
    except EvidenceInsufficient:
        return []


def _register_compensation(op: Operation, expected_version: int, lease: Lease, actor: Principal) -> None:
    node = op.node

    def build(current: Task, now: datetime) -> Change:
        # The compensation acts on what the effect was sent with, and names the effect it undoes.
        original = op.request.get("input", {}) if isinstance(op.request, dict) else {}
        request = {"action": node.compensation, "input": original, "compensates": op.op_key, "remote_id": op.remote_id}
        compensation = Operation(
            node=node,
            op_key=opkeys.compensation(op.op_key),
            action=node.compensation,
            target=op.target,
            request=request,
            request_digest=digest_of(request),
            registered_at=now,
            compensates=op,
            purpose=OperationPurpose.COMPENSATION.value,
        )
        return Change(
            event="compensation_registered",
            kind=ChangeKind.DECIDE,
            operations=[(compensation, {"status": OperationStatus.INTENT.value})],
            data={"op_key": compensation.op_key, "compensates": op.op_key, "by": str(actor)},
            requires={"cancel_requested_at__isnull": True},
        )

    compare_and_set(op.task_id, expected_version, build, lease=lease)


MIN_NOTE = 10  # characters of a person's note on a settlement or a remote query


class TakeoverRequired(TaskError):
    """Settling an operation (by hand, or from the remote's answer) needs the takeover lease of the person."""

    code = "takeover_required"


@dataclass(frozen=True)
class RemoteAnswer:
    """What the remote said when a person asked it by op key, and whether it was recorded."""

    op_key: str
    outcome: Outcome
    recorded: bool
    operation: Operation

    @property
    def outcome_name(self) -> str:
        """committed, accepted, notfound, unprovable or failed."""
        return type(self.outcome).__name__.lower()


def held_takeover(actor: Principal, task_id: int) -> Lease:
    """The live takeover lease ``actor`` holds on the task: TakeoverRequired if they hold none, LeaseExpired if it
    expired (in its grace or lapsed) — named before the remote is asked; the write judges the lease again."""
    now = clock.now()
    lease = lease_open(task_id)
    if lease is None or lease.holder_kind != HolderKind.OPERATOR or lease.holder_id != actor.id:
        raise TakeoverRequired(f"take task {task_id} over first: settling an operation needs your takeover lease")
    if not lease_state(expires_at=lease.expires_at, now=now).live:
        raise LeaseExpired(task_id, lease.epoch, lease.expires_at)
    return lease


def _fenced(op: Operation, expected_version: int) -> bool:
    """Before a "not done": ask the remote to fence ``op`` when the task's kind has a connector here that can (I/O,
    outside any transaction). True when it answers Fenced; a remote that holds the write refuses the "not done"
    (nothing is written: query it to record its receipt); anything else leaves it to the deadline."""
    if op.task.version != expected_version:
        raise stale_form(op.task, expected_version)
    try:
        connector = connector_for(op.task.kind)
    except UnknownTaskKind:
        return False  # driven over the API: no connector here, the deadline decides
    if not isinstance(connector, Fencing):
        return False
    answer = connector.fence(op.op_key)
    if isinstance(answer, Committed | Accepted):
        raise InvalidTransition(
            f"the remote holds {op.op_key} ({type(answer).__name__.lower()}): it took effect, so it cannot be settled "
            "as not done; ask the remote to record its receipt",
            op_key=op.op_key,
        )
    return isinstance(answer, Fenced)


def _operation_of(task_id: int, op_key: str) -> Operation:
    op = Operation.objects.select_related("node", "task").filter(op_key=op_key, task_id=task_id).first()
    if op is None:
        raise TaskNotFound(f"task {task_id} has no operation with op key {op_key!r}")
    return op


def operation_query_remote(*, actor: Principal, task_id: int, op_key: str, expected_version: int) -> RemoteAnswer:
    """Ask the remote now what became of ``op_key`` (the connector of the task's kind, outside any transaction)
    and record its answer with the person's takeover lease — the same settlement as an agent's query by op key.
    A lookup that itself fails (or an unprovable one still unprovable) records nothing. Audited when recorded."""
    op = _operation_of(task_id, op_key)
    require_operate(actor, op.task)
    if op.status not in OPEN_OPERATION_STATUSES:
        raise InvalidTransition(f"operation {op_key} is {op.status}: nothing to ask the remote about")
    lease = held_takeover(actor, task_id)
    if op.task.version != expected_version:
        raise stale_form(op.task, expected_version)
    # I/O, never inside a transaction; fenced when a cancel is recorded (its not found must be final). A not found
    # is judged by when the remote was asked: before this call, not at the commit after it.
    asked_at = clock.now()
    outcome = reconcile(connector_for(op.task.kind), op_key, fence=op.task.cancel_requested_at is not None)
    with transaction.atomic():
        snap = task_snapshot(task_id=task_id, lease=lease)
        if snap.version != expected_version:
            raise stale_form(snap.task, expected_version)
        step = record_outcome(snap, op_key, outcome, lease=lease, settled_by=str(actor), asked_at=asked_at)
        settled, after = step.operation, step.snapshot
        recorded = after.version != snap.version
        if recorded:
            audit_append(
                actor=actor,
                action="operation_queried_by_person",
                at=clock.now(),
                task_id=task_id,
                lease_epoch=lease.epoch,
                version_before=snap.version,
                version_after=after.version,
                details={"op_key": op_key, "outcome": outcome_summary(outcome), "status": settled.status},
            )
    return RemoteAnswer(op_key=op_key, outcome=outcome, recorded=recorded, operation=Operation.objects.get(pk=op.pk))


def outcome_summary(outcome: Outcome) -> dict[str, Any]:
    """The remote's answer as the audit row and the page name it."""
    summary: dict[str, Any] = {"outcome": type(outcome).__name__.lower()}
    if isinstance(outcome, Committed):
        summary |= receipt_summary(outcome)
    elif isinstance(outcome, Accepted):
        summary["remote_id"] = outcome.remote_id
    elif isinstance(outcome, Failed):
        summary |= {"failure_class": str(outcome.failure_class), "detail": outcome.detail[:200]}
    elif isinstance(outcome, Unprovable):
        summary["detail"] = outcome.detail[:200]
    return summary
