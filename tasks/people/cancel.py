"""Cancel: who may ask, and what it records (DESIGN §5). From the recorded cancel on, nothing new starts — the
permit table refuses every start of a task whose cancel is recorded — intents never sent are withdrawn, and what is
in flight settles and is recorded as it truly ended (tasks/decide/decisions.py decides the status: stopping,
stopped_pending,
stopped)."""

from contextlib import nullcontext

from django.db import transaction

from audit.principals import Principal
from leases.services import LeaseRef
from tasks.access.permits import actor_of, permits_principal
from tasks.core.errors import VersionConflict
from tasks.core.lifecycle import ChangeKind, task_ended
from tasks.decide import decisions
from tasks.engine.cas import Audit, audited_compare_and_set, lock_for_write
from tasks.engine.snapshot import task_snapshot
from tasks.models import Task
from tasks.people.checks import stale_form


def task_request_cancel(
    *,
    actor: Principal,
    task_id: int,
    reason: str,
    lease: LeaseRef | None = None,
    expected_version: int | None = None,
) -> Task:
    """Record a cancel. From now on no operation can start; intents never sent are withdrawn; what is in flight
    settles (stopping) and is recorded as it truly ended.

    Who may: a person allowed to operate the task (holding its takeover lease or not), the agent holding the
    task's lease (``lease``), or the agent or system that created the task. Asking twice changes nothing. Audited.

    ``expected_version``: the version a person confirmed the consequences on (tasks.reads.consequences); if the task
    moved since, the cancel is refused (VersionConflict, naming what changed) and nothing is written.
    """
    for locked in (False, True):
        # Once as any write, on the snapshot it read; if another write landed in between, again with the task's rows
        # locked before it is read (tasks.engine.cas.lock_for_write): a busy agent's steps then wait for the cancel
        # instead
        # of winning every race against it.
        with transaction.atomic() if locked else nullcontext():
            if locked:
                lock_for_write(task_id, lease)
            try:
                snap = task_snapshot(task_id=task_id, lease=lease)
            except VersionConflict:  # it kept changing while read: the locked attempt reads it with writers held
                if locked:
                    raise
                continue
            task = snap.task
            # Who may cancel is the permit table's principal half (tasks.access.permits); its status half is the
            # compare-and-set's, once a cancel recorded already or an ended task has answered that nothing changes.
            denied = permits_principal(actor, ChangeKind.CANCEL, task, lease=lease)
            if denied is not None:
                raise denied
            if task.cancel_requested_at is not None or task_ended(task.status):
                return task
            if expected_version is not None and snap.version != expected_version:
                raise stale_form(task, expected_version)
            change = decisions.cancel(snap, by=str(actor), reason=reason)
            try:
                applied = audited_compare_and_set(
                    task_id,
                    snap.version,
                    change,
                    lease=lease,
                    actor=None if lease is not None else actor_of(actor),
                    audit=Audit(actor, "cancel_requested", reason=reason),
                    snapshot=snap,
                )
            except VersionConflict:
                if locked:
                    raise
                continue
            return applied.next_snapshot().task
    raise AssertionError("unreachable: the locked attempt returns or raises")  # pragma: no cover
