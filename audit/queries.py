"""Reads of the audit log for pages and exports: filters, keyset pages newest first, and the last verification.
Each filter has its index (audit/models.py), so a page costs the same with a million rows."""

from collections.abc import Iterator
from dataclasses import dataclass

from django.db.models import QuerySet

from audit.models import AuditEvent, VerificationRun

# The audit actions of a forced release and of its review (tasks/people/forced_release.py).
FORCED_RELEASE_ACTIONS = ("lease_forced_release", "forced_release_accepted", "forced_release_disputed")
ACTOR_KINDS = ("user", "agent", "system")


@dataclass(frozen=True)
class AuditFilter:
    """What the audit log shows. ``actor`` is ``kind:id`` (``user:ann``) or a bare id (any kind)."""

    actor: str = ""
    action: str = ""
    task_id: int | None = None
    forced_releases_only: bool = False


def audit_events(which: AuditFilter) -> QuerySet[AuditEvent]:
    """The audit events ``which`` selects, newest first."""
    rows = AuditEvent.objects.all()
    if which.actor:
        kind, _, actor_id = which.actor.partition(":")
        if actor_id and kind in ACTOR_KINDS:
            rows = rows.filter(actor_kind=kind, actor_id=actor_id)
        else:
            rows = rows.filter(actor_id=which.actor)
    if which.action:
        rows = rows.filter(action=which.action)
    if which.task_id is not None:
        rows = rows.filter(task_id=which.task_id)
    if which.forced_releases_only:
        rows = rows.filter(action__in=FORCED_RELEASE_ACTIONS)
    return rows.order_by("-seq")


def audit_page(which: AuditFilter, *, before: int | None, size: int) -> tuple[list[AuditEvent], int | None]:
    """Up to ``size`` events older than seq ``before`` (None: the newest), and the cursor of the next page (None on
    the last). Keyset on seq: an event appended while someone pages lands before the first page, never shifts one."""
    if size < 1:
        raise ValueError("a page holds at least one row")
    rows = audit_events(which)
    if before is not None:
        rows = rows.filter(seq__lt=before)
    found = list(rows[: size + 1])
    if len(found) <= size:
        return found, None
    return found[:size], found[size - 1].seq


def audit_export(which: AuditFilter, *, chunk: int = 2000) -> Iterator[AuditEvent]:
    """Every event ``which`` selects, newest first, read in chunks (for a streamed export)."""
    return audit_events(which).iterator(chunk_size=chunk)


def latest_verification() -> VerificationRun | None:
    """The last recorded check of both logs (one indexed read: the newest row by primary key)."""
    return VerificationRun.objects.order_by("-pk").first()
