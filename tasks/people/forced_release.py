"""Forced release (DESIGN §7): an admin removes whoever holds a task's lease, with a written justification and
impact; the removed holder can write nothing more (its epoch's lease is closed and the version moves); the release
waits in a review queue for another admin."""

from datetime import datetime
from typing import Any, Literal

from django.db import transaction

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.models import ForcedRelease, ReviewStatus
from leases.services import (
    lease_force_close,
    lease_open,
)
from tasks.access.permissions import PermissionDenied, require_admin
from tasks.core.errors import (
    InvalidTransition,
    TaskError,
    TaskNotFound,
)
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    Actor,
    ChangeKind,
)
from tasks.decide.change import Change
from tasks.engine.cas import Audit, audited_compare_and_set
from tasks.models import Operation, Task
from tasks.people.checks import stale_form
from tasks.rows import get_task as _task

MIN_FORCE_TEXT = 20  # characters of justification and of impact, at least


class TakeoverRefused(TaskError):
    code = "takeover_refused"


def lease_force_release(
    *, actor: Principal, task_id: int, justification: str, impact: str, expected_version: int | None = None
) -> ForcedRelease:
    """An admin removes whoever holds the task's lease. Needs a justification and an impact statement
    (each at least MIN_FORCE_TEXT characters). Records the removed holder, the epoch, the task version and
    the operations open at that moment; the removed holder can write nothing more (its epoch's lease is
    closed, and the task version moves). The release waits in a review queue for another admin.

    ``expected_version``: the version the admin read the consequences on (tasks.reads.consequences); if the task moved
    since (another holder, operations settled), the release is refused (VersionConflict) and nothing is written."""
    require_admin(actor, "force-release a lease")
    for label, text in (("justification", justification), ("impact", impact)):
        if len(text.strip()) < MIN_FORCE_TEXT:
            raise TakeoverRefused(f"a forced release needs a {label} of at least {MIN_FORCE_TEXT} characters")
    task = _task(task_id)
    if expected_version is not None and task.version != expected_version:
        raise stale_form(task, expected_version)
    with transaction.atomic():
        holder = lease_open(task_id)
        if holder is None:
            raise TakeoverRefused(f"task {task_id} has no lease to release")
        open_ops = list(
            Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES]).values(
                "op_key", "status"
            )
        )
        closed = lease_force_close(lease=holder)
        current = _task(task_id)
        if expected_version is not None and current.version != expected_version:
            raise stale_form(current, expected_version)  # moved between the two reads: the close rolls back
        removed = f"{holder.holder_kind}:{holder.holder_id}"
        details: dict[str, Any] = {"removed_holder": removed, "open_operations": open_ops}
        created: list[ForcedRelease] = []

        def queue_for_review(_task: Task, now: datetime) -> None:
            created.append(
                ForcedRelease.objects.create(
                    lease=closed,
                    task=task,
                    forced_by=str(actor),
                    forced_by_user=actor.user,
                    forced_at=now,
                    justification=justification,
                    impact=impact,
                    removed_holder=removed,
                    epoch=holder.epoch,
                    task_version=current.version,
                    open_operations=open_ops,
                )
            )
            details["review"] = created[0].pk  # the audit row, written next in this transaction, names it

        audited_compare_and_set(
            task_id,
            current.version,
            Change(
                event="lease_forced_release",
                kind=ChangeKind.FORCE_RELEASE,
                data={"by": str(actor), "holder": removed, "epoch": holder.epoch},
            ),
            lease=None,
            actor=Actor.PERSON,
            audit=Audit(
                actor, "lease_forced_release", epoch=holder.epoch, reason=justification, impact=impact, details=details
            ),
            before_event=queue_for_review,
        )
        forced = created[0]
        return forced


def forced_release_review(
    *, actor: Principal, forced_release_id: int, verdict: Literal["accepted", "disputed"], note: str
) -> ForcedRelease:
    """Another admin — never the one who forced it — accepts or disputes a forced release, with a note."""
    require_admin(actor, "review a forced release")
    forced = ForcedRelease.objects.filter(pk=forced_release_id).first()
    if forced is None:
        raise TaskNotFound(f"no forced release {forced_release_id}")
    same_user = actor.user is not None and forced.forced_by_user_id == actor.user.pk
    if forced.forced_by == str(actor) or same_user:
        raise PermissionDenied("a forced release is reviewed by another admin, not by the one who forced it")
    if verdict not in (ReviewStatus.ACCEPTED, ReviewStatus.DISPUTED):
        raise InvalidTransition(f"a review is accepted or disputed, not {verdict!r}")
    if len(note.strip()) < MIN_FORCE_TEXT:
        raise TakeoverRefused(f"a review needs a note of at least {MIN_FORCE_TEXT} characters")
    with transaction.atomic():
        now = clock.now()
        updated = ForcedRelease.objects.filter(pk=forced.pk, status=ReviewStatus.PENDING).update(
            status=verdict, reviewed_by=str(actor), reviewed_at=now, review_note=note
        )
        if updated != 1:
            raise InvalidTransition(f"forced release {forced.pk} was already reviewed")
        audit_append(
            actor=actor,
            action=f"forced_release_{verdict}",
            at=now,
            task_id=forced.task_id,
            lease_epoch=forced.epoch,
            reason=note,
            details={"forced_release": forced.pk, "forced_by": forced.forced_by},
        )
    return ForcedRelease.objects.get(pk=forced.pk)
