"""Which tasks need a worker, from the database alone (the recovery scan; DESIGN §8: messages may be lost), and the
liveness rules of worker wake-ups: at most one queued per task version, and a remote that stays down asked again
with a growing backoff."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from leases import clock
from tasks.core.failures import backoff
from tasks.models import Task, TaskWakeUp

# A wake-up arriving this much before its task's next ask of the remote still runs: its countdown was computed on
# the database clock, its arrival is timed by the worker's.
EARLY_TOLERANCE = timedelta(seconds=1)


def wake_up_expiry() -> timedelta:
    """How long a queued wake-up message lives (Celery ``expires``) and blocks another for its version."""
    expiry: timedelta = settings.RECKON_WAKE_UP_EXPIRY
    return expiry


def tasks_needing_work(now: datetime | None = None) -> QuerySet[Task]:
    """Task.objects.workable(), oldest first: the tasks the recovery scan wakes a worker for — less those with a
    wake-up already queued for their current version, and those whose remote is down and not yet due to be asked."""
    now = now or clock.now()
    queued = TaskWakeUp.objects.filter(task_id=OuterRef("pk"), queued_version=OuterRef("version"), queued_until__gt=now)
    resting = TaskWakeUp.objects.filter(task_id=OuterRef("pk"), remote_next_ask_at__gt=now)
    return Task.objects.workable(now).exclude(Exists(queued)).exclude(Exists(resting)).order_by("pk")


def wake_up_claim(*, task_id: int, version: int, at: datetime | None = None) -> datetime | None:
    """Record that a wake-up for (task, version), due ``at`` (now if None), is about to be queued, and return when
    the claim lapses (database time); None if one is queued already, so the caller sends nothing. Deduplication
    happens here, at enqueue: a conditional update, or an insert that a racing claim makes fail. The claim lapses
    ``wake_up_expiry()`` after the wake-up is due — and the message is stale from then on (tasks.jobs.drive_task) —
    so a lost message blocks nobody for longer."""
    now = clock.now()
    until = max(at or now, now) + wake_up_expiry()
    return until if _claim(task_id=task_id, version=version, now=now, until=until, counted=True) else None


def wake_up_defer(*, task_id: int, version: int, until: datetime) -> bool:
    """A wake-up is due too far ahead to be queued (tasks.jobs.MAX_COUNTDOWN_SECONDS): claim (task, version) until
    then with no message, so the scan leaves the task alone until it is due and wakes it then — instead of waking
    it at every scan to find it still waiting."""
    return _claim(task_id=task_id, version=version, now=clock.now(), until=until, counted=False)


def _claim(*, task_id: int, version: int, now: datetime, until: datetime, counted: bool) -> bool:
    """``counted``: a message is to be sent under this claim — the claim bumps ``queued_count``, a refusal bumps
    ``deduplicated_count`` (the metrics' wake-ups queued and deduplicated; a refusal costs one more UPDATE)."""
    blocking = Q(queued_version=version) & Q(queued_until__gt=now)
    bump = {"queued_count": F("queued_count") + 1} if counted else {}
    with transaction.atomic():
        if (
            TaskWakeUp.objects.filter(task_id=task_id)
            .exclude(blocking)
            .update(queued_version=version, queued_until=until, **bump)
        ):
            return True
        try:
            with transaction.atomic():
                TaskWakeUp.objects.create(
                    task_id=task_id, queued_version=version, queued_until=until, queued_count=int(counted)
                )
        except IntegrityError:  # a row exists and blocks (or the task is gone): nothing to send
            if counted:
                TaskWakeUp.objects.filter(task_id=task_id).update(deduplicated_count=F("deduplicated_count") + 1)
            return False
    return True


def wake_up_begin(*, task_id: int, seen_version: int | None) -> datetime | None:
    """A wake-up starts: clear the claim it was queued under (a later scan may queue the next one) and say until
    when the task's remote is left alone (None: go on). Only a wake-up naming a version — the scan's, or the one a
    worker asked for itself — waits for the remote's backoff; one sent by a person's action (a hand-back) goes on."""
    row = TaskWakeUp.objects.filter(task_id=task_id).values_list("queued_version", "remote_next_ask_at").first()
    if row is None:
        return None
    queued_version, next_ask_at = row
    if seen_version is not None and queued_version == seen_version:
        TaskWakeUp.objects.filter(task_id=task_id, queued_version=seen_version).update(
            queued_version=None, queued_until=None
        )
    if seen_version is not None and next_ask_at is not None and next_ask_at > clock.now() + EARLY_TOLERANCE:
        return next_ask_at
    return None


def remote_down_record(*, task: Task, unreachable: bool) -> datetime | None:
    """After a wake-up: the remote could not be reached (again) — count it and return when to ask next
    (tasks.core.failures.backoff on the database clock: growing, ±25% jitter, capped at RECKON_BACKOFF_CAP), shown on
    the task as ``task.wake_up.remote_down_detail``; or it answered — forget the outage."""
    if not unreachable:
        TaskWakeUp.objects.filter(task_id=task.pk, remote_down_tries__gt=0).update(
            remote_down_tries=0, remote_down_since=None, remote_next_ask_at=None
        )
        return None
    now = clock.now()
    with transaction.atomic():
        row, _ = TaskWakeUp.objects.select_for_update().get_or_create(task_id=task.pk)
        tries = row.remote_down_tries + 1
        wait = backoff(now=now, attempt=tries, seed=f"{task.uid}:remote_down")
        TaskWakeUp.objects.filter(task_id=task.pk).update(
            remote_down_tries=F("remote_down_tries") + 1,
            remote_down_since=row.remote_down_since or now,
            remote_next_ask_at=wait.not_before,
        )
    return wait.not_before


def wake_up_unclaim(*, task_id: int, version: int) -> None:
    """The message of a claim could not be sent (the broker refused it): forget the claim, so the next scan tries."""
    never_queued = F("queued_count") - 1
    TaskWakeUp.objects.filter(task_id=task_id, queued_version=version).update(
        queued_version=None, queued_until=None, queued_count=never_queued
    )
