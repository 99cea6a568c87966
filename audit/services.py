"""Append to the audit chain, and verify it. Callers pass the database server's time (``at``): the audit
app imports no other app, the clock included."""

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.anchors import AnchorFile, anchored_audit_head, read_anchors
from audit.append_only import AUDIT_TRIGGERS, missing_triggers
from audit.hygiene import check_payload
from audit.models import AccountChange, AuditEvent, AuditHead
from audit.principals import Principal

GENESIS = "0" * 64
MAX_TEXT = 4000


def _body(event: AuditEvent) -> str:
    return json.dumps(
        {
            "seq": event.seq,
            "at": event.at.isoformat(),
            "actor": [event.actor_kind, event.actor_id],
            "action": event.action,
            "task": event.task_id,
            "epoch": event.lease_epoch,
            "versions": [event.version_before, event.version_after],
            "reason": event.reason,
            "impact": event.impact,
            "details": event.details,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )


def _digest(prev: str, event: AuditEvent) -> str:
    return hashlib.sha256((prev + _body(event)).encode()).hexdigest()


def audit_append(
    *,
    actor: Principal,
    action: str,
    at: datetime,
    task_id: int | None = None,
    lease_epoch: int | None = None,
    version_before: int | None = None,
    version_after: int | None = None,
    reason: str = "",
    impact: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event. Call it inside the transaction of the change it records: it shares its fate. Its reason,
    impact and details pass checkpoint hygiene first (``audit_check``): a refusal writes no audit row."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_append must run inside the transaction of the change it records")
    stored = audit_check(action=action, reason=reason, impact=impact, details=details)
    head = audit_lock()
    event = AuditEvent(
        seq=head.seq + 1,
        at=at,
        actor_kind=actor.kind,
        actor_id=actor.id,
        action=action,
        task_id=task_id,
        lease_epoch=lease_epoch,
        version_before=version_before,
        version_after=version_after,
        reason=reason[:MAX_TEXT],
        impact=impact[:MAX_TEXT],
        details=stored,
        prev_digest=head.digest,
    )
    event.digest = _digest(head.digest, event)
    event.save(force_insert=True)
    AuditHead.objects.filter(pk=1).update(seq=event.seq, digest=event.digest)
    return event


def audit_check(
    *, action: str, reason: str = "", impact: str = "", details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Refuse what an audit row must not hold (audit/hygiene.py): credential-like data in its reason, impact or
    details (a whole number under a credential-like key is a row's id: ``"token": 12``), or more than
    PAYLOAD_CAP_BYTES of them together (PayloadTooLarge, SecretInPayload). Returns the details as the row stores
    them. ``audit_append`` runs it; a service whose change is written before its audit row runs it first, so that
    the refusal comes before the change."""
    stored: dict[str, Any] = json.loads(json.dumps(details or {}, default=str))
    check_payload({"reason": reason, "impact": impact, "details": stored}, what=f"the {action} audit row", ids=True)
    return stored


def audit_lock() -> AuditHead:
    """Lock the chain's head until the transaction ends: appends happen one at a time, in one order."""
    head, _ = AuditHead.objects.select_for_update().get_or_create(pk=1, defaults={"seq": 0, "digest": GENESIS})
    return head


@dataclass(frozen=True)
class AuditVerdict:
    checked: int
    broken_at: int | None
    problem: str | None
    # What the anchor file vouches for (audit/anchors.py): "not anchored …" when there is no key or no checkpoint.
    anchor: str = ""
    # Account changes the database captured that are not on the chain yet (audit/account_changes.py): the beat
    # puts them there within RECKON_ACCOUNT_FOLD_SECONDS; a count that stays up means the fold is not running.
    account_changes_pending: int = 0


def verify_audit() -> AuditVerdict:
    """Walk the chain in seq order; report the first broken link (gap, altered row, reordered chain), a head that is
    missing or does not name the chain's last event, a chain that no longer reaches the head a signed checkpoint
    outside the database anchored (its tail cut, consistently or not), a checkpoint line that fails its HMAC, or an
    append-only trigger that is missing or disabled."""
    anchors = read_anchors()
    verdict = _verify_chain(anchors)
    pending = AccountChange.objects.filter(audit_seq__isnull=True).count()
    return AuditVerdict(verdict.checked, verdict.broken_at, verdict.problem, anchors.status(), pending)


def _verify_chain(anchors: AnchorFile) -> AuditVerdict:
    anchored = anchored_audit_head(anchors)
    anchored_digest: str | None = None
    prev, expected = GENESIS, 1
    checked = 0
    for event in AuditEvent.objects.order_by("seq").iterator():
        checked += 1
        if anchored is not None and event.seq == anchored.seq:
            anchored_digest = event.digest
        if event.seq != expected:
            return AuditVerdict(checked, expected, f"audit event #{expected} is missing (next is #{event.seq})")
        if event.prev_digest != prev:
            return AuditVerdict(checked, event.seq, f"audit event #{event.seq} does not chain to #{event.seq - 1}")
        if _digest(prev, event) != event.digest:
            return AuditVerdict(checked, event.seq, f"audit event #{event.seq} was altered after it was written")
        prev, expected = event.digest, expected + 1
    head = AuditHead.objects.filter(pk=1).first()
    if head is None and checked:
        return AuditVerdict(checked, expected - 1, f"the audit chain's head is missing (the chain ends at #{checked})")
    if head is not None and (head.seq != expected - 1 or head.digest != prev):
        return AuditVerdict(checked, head.seq, f"the chain ends at #{expected - 1} but its head says #{head.seq}")
    if anchored is not None and anchored.seq > expected - 1:
        return AuditVerdict(
            checked,
            anchored.seq,
            f"the audit chain ends at #{expected - 1} but the checkpoint of {anchored.at} anchored it at "
            f"#{anchored.seq}: its tail was cut and its head rolled back",
        )
    if anchored is not None and anchored_digest != anchored.digest:
        return AuditVerdict(
            checked,
            anchored.seq,
            f"audit event #{anchored.seq} is not the one the checkpoint of {anchored.at} anchored: the chain was "
            "rewritten from there back",
        )
    if anchors.bad_lines:
        return AuditVerdict(checked, None, "; ".join(anchors.bad_lines))
    missing = missing_triggers(AUDIT_TRIGGERS)
    if missing:  # the chain reads sound, but nothing in the database keeps it append-only any more
        return AuditVerdict(checked, None, "append-only triggers missing or disabled: " + ", ".join(missing))
    return AuditVerdict(checked, None, None)
