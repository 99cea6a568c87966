import json
from typing import Any, NoReturn

from django.db import models
from django.db.models import Q


class AuditRefused(Exception):
    """Audit rows are append-only."""


class AuditQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise AuditRefused("audit events are append-only: no update")

    def delete(self) -> NoReturn:
        raise AuditRefused("audit events are append-only: no delete")


class AuditEvent(models.Model):
    """One human, admin, agent or system decision, hash-chained to the one before it (a single chain).

    Written by the service that makes the change, in the same transaction. Updates and deletes are refused
    here and, in the database, by triggers (migration 0002).
    """

    seq = models.PositiveBigIntegerField(unique=True)
    at = models.DateTimeField()
    actor_kind = models.CharField(max_length=10)
    actor_id = models.CharField(max_length=200)
    action = models.CharField(max_length=60)
    # A plain id, not a foreign key: audit sits below every app and outlives what it records.
    task_id = models.BigIntegerField(null=True, blank=True)
    lease_epoch = models.PositiveBigIntegerField(null=True, blank=True)
    version_before = models.PositiveBigIntegerField(null=True, blank=True)
    version_after = models.PositiveBigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    impact = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    prev_digest = models.CharField(max_length=64)
    digest = models.CharField(max_length=64)

    objects = AuditQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(seq__gte=1), name="audit_seq_positive"),
            models.CheckConstraint(condition=Q(actor_kind__in=["user", "agent", "system"]), name="audit_actor_kind"),
        ]
        indexes = [
            # Serves the console's audit trail of one task, and the audit log filtered by task, newest first.
            models.Index(fields=["task_id", "seq"], name="audit_task_idx"),
            # Serves the audit log filtered by actor, newest first (keyset on seq), with or without the actor's kind:
            # led by the id, so a name that is nowhere is found absent at once (not by walking every row by seq).
            models.Index(fields=["actor_id", "seq"], name="audit_actor_id_idx"),
            # Serves the audit log filtered by action (and "forced releases only"), newest first.
            models.Index(fields=["action", "seq"], name="audit_action_idx"),
        ]
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"audit #{self.seq} {self.action} by {self.actor_kind}:{self.actor_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AuditRefused("audit events are append-only: no update")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AuditRefused("audit events are append-only: no delete")

    @property
    def details_text(self) -> str:
        """The details as compact JSON, keys sorted: how pages and exports show them."""
        return json.dumps(self.details, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class AuditHead(models.Model):
    """The chain's head, one row: appends lock it, so the chain has one order even on PostgreSQL."""

    seq = models.PositiveBigIntegerField(default=0)
    digest = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"audit head #{self.seq}"


class VerificationRun(models.Model):
    """One check of both logs — the audit chain and every task's event log — run by a person ("Verify now") or a
    command; what it found, so a page can show the last result without walking a million events."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    run_by = models.CharField(max_length=200)
    audit_checked = models.PositiveBigIntegerField()
    audit_problem = models.TextField(blank=True)
    tasks_checked = models.PositiveBigIntegerField()
    tasks_with_problems = models.PositiveBigIntegerField()
    tasks_quarantined = models.PositiveBigIntegerField()
    # The first problems found (task id, sentence, quarantined now), capped: the count above is the full figure.
    task_problems = models.JSONField(default=list, blank=True)
    event_triggers_missing = models.JSONField(default=list, blank=True)
    # What the anchor file outside the database says of the chains (audit.anchors.AnchorVerdict.as_json): anchored
    # and consistent, a cut found, lines not trusted, or not anchored. Empty for a run recorded before it was kept.
    anchor_verdict = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(tasks_with_problems__lte=models.F("tasks_checked")), name="verification_counts_consistent"
            ),
        ]

    def __str__(self) -> str:
        return f"verification at {self.finished_at:%Y-%m-%d %H:%M} by {self.run_by}"

    @property
    def sound(self) -> bool:
        verdict = self.anchor_verdict if isinstance(self.anchor_verdict, dict) else {}
        anchors_found = verdict.get("state") in ("cut", "untrusted")  # audit.anchors.AnchorVerdict
        return not (self.audit_problem or self.tasks_with_problems or self.event_triggers_missing or anchors_found)


class AccountChange(models.Model):
    """A change of who may do what, as the database itself saw it: written by triggers (audit/migrations/0006) on
    the account tables — a flag of auth_user (superuser, staff, active), a group membership (Reckon's roles are
    groups), a user's or a group's permission, an object permission (django-guardian: scope grants), a group
    renamed or deleted — whatever made it: a service, the Django admin, a shell, a bulk ``update()``, raw SQL.

    audit/account_changes.py folds each row into the audit chain and sets ``audit_seq`` once; nothing else may
    change or remove a row (triggers again), so a change cannot leave the database without its audit entry.
    """

    at = models.DateTimeField()
    table_name = models.CharField(max_length=60)
    operation = models.CharField(max_length=10)
    # What changed, built by the trigger while the names still exist (a deleted group's name, say).
    change = models.JSONField(default=dict)
    audit_seq = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["id"], condition=Q(audit_seq__isnull=True), name="audit_account_change_unfolded"),
        ]

    def __str__(self) -> str:
        return f"account change #{self.pk} ({self.operation} on {self.table_name})"
