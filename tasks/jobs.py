"""Celery entry points: thin adapters that take ids and call one service. Correctness never depends on a
message arriving once: a duplicate finds the lease taken or nothing to do; a lost one is found by the scan."""

import os
import socket
from datetime import datetime
from typing import Any

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils import timezone

from leases import clock
from tasks.core.failures import backoff
from tasks.engine.recovery import (
    tasks_needing_work,
    wake_up_begin,
    wake_up_claim,
    wake_up_defer,
    wake_up_unclaim,
)
from tasks.engine.registry import connector_for, known_kinds
from tasks.engine.runner import run_task_once
from tasks.models import Task as TaskRow
from tasks.people.bulk import bulk_run_apply, bulk_runs_stalled

# A wake-up asked for further away than this is left to the recovery scan (it finds the task from the database, and
# not before it is due: tasks.engine.recovery.wake_up_defer).
MAX_COUNTDOWN_SECONDS = 300.0


def _holder_id() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


# An interrupted wake-up (the database connection broke) is sent again this many times, backing off; after that the
# recovery scan finds the task.
WAKE_UP_RETRIES = 5


@shared_task(name="tasks.drive_task", acks_late=True, ignore_result=True, bind=True)
def drive_task(self: Task[Any, Any], task_id: int, seen_version: int | None = None, until: str | None = None) -> str:
    """One wake-up, with the connector registered for the task's kind (tasks/engine/registry.py); a kind no app
    registered
    raises UnknownTaskKind (the worker logs it; the task is left as it is, for the scan to find again).

    ``until`` (a wake-up queued under a claim): the database time its claim lapses at. A message that arrives later
    is stale — the scan has queued the task again since — and is dropped unrun. Judged on the database clock, never
    with Celery's ``expires``, which each worker judges on its own clock: a worker whose clock runs minutes ahead
    would drop every wake-up and every scan as expired (the "clocks skewed" partition row).

    A database connection lost mid-way (OperationalError): the runner gives the lease back on a new connection, and
    this wake-up is sent again after a growing, jittered delay (tasks.core.failures.backoff)."""
    try:
        if until is not None and clock.now() > datetime.fromisoformat(until):
            return "skipped: stale (its claim lapsed on the database clock)"
        return _drive(self, task_id, seen_version)
    except (OperationalError, InterfaceError) as exc:
        close_old_connections()
        attempt = self.request.retries + 1
        delay = backoff(now=timezone.now(), attempt=attempt, seed=f"{task_id}:{seen_version}:db").delay
        raise self.retry(exc=exc, countdown=delay.total_seconds(), max_retries=WAKE_UP_RETRIES) from exc


def _drive(job: Task[Any, Any], task_id: int, seen_version: int | None) -> str:
    kind = TaskRow.objects.filter(pk=task_id).values_list("kind", flat=True).first()
    if kind is None:
        return "skipped: task_not_found"
    connector = connector_for(kind)
    resting_until = wake_up_begin(task_id=task_id, seen_version=seen_version)
    if resting_until is not None:  # its remote is down: asked again then (the scan finds it), not now
        return f"skipped: remote down, next try at {resting_until:%H:%M:%S}"
    wake = run_task_once(task_id=task_id, holder_id=_holder_id(), connector=connector, seen_version=seen_version)
    if wake.wake_at is not None and wake.version is not None:
        # Backoff, an accepted operation to observe, a remote that is down: ask for the next wake-up, once per
        # version (tasks.engine.recovery.wake_up_claim). Losing this message costs only latency (the scan finds the task
        # when its claim lapses); a duplicate finds nothing to do.
        countdown = max(0.0, (wake.wake_at - clock.now()).total_seconds())
        if countdown > MAX_COUNTDOWN_SECONDS:  # no message: the scan wakes it when due, not before
            wake_up_defer(task_id=task_id, version=wake.version, until=wake.wake_at)
        elif until := wake_up_claim(task_id=task_id, version=wake.version, at=wake.wake_at):
            queue = str((job.request.delivery_info or {}).get("routing_key") or "")  # the queue this one came from
            options: dict[str, Any] = {"countdown": countdown} | ({"queue": queue} if queue else {})
            _send_claimed(task_id, wake.version, until, options)
    return wake.summary


def _send_claimed(task_id: int, version: int, until: datetime, options: dict[str, Any]) -> None:
    """Send the wake-up just claimed, stale once its claim lapses (``until``, database time); if the broker refuses
    it, forget the claim so that nothing waits for it. A ``countdown`` is the one thing judged on a worker's clock:
    a worker whose clock is behind holds the message longer, one ahead runs it early (the task then still waits, and
    its claim keeps it from being queued twice) — either way the claim lapses on the database clock and the scan
    queues the task again."""
    try:
        drive_task.apply_async((task_id, version), {"until": until.isoformat()}, **options)
    except Exception:
        wake_up_unclaim(task_id=task_id, version=version)
        raise


@shared_task(name="tasks.recovery_scan", ignore_result=True)
def recovery_scan(queue: str = "") -> int:
    """Wake a worker for every task that needs one, naming the version seen; return how many were queued.

    At most one wake-up per (task, version) is ever queued: the scan reads only tasks without a live claim, and
    claims each before sending (tasks.engine.recovery.wake_up_claim), so scans run back to back, or on two workers, add
    nothing. Each message is stale once its claim lapses (RECKON_WAKE_UP_EXPIRY, on the database clock): a stale
    one is dropped unrun (``drive_task``'s ``until``), a lost one stops blocking and the next scan queues it again.
    Beat sends the scan itself on a queue of its own (RECKON_SCAN_QUEUE), so it never waits behind the wake-ups it
    queued; a scan carries no expiry (a worker would judge it on its own clock): scans that piled up while no worker
    ran each cost a read that finds every task claimed.

    Only tasks of a kind with a connector registered here (tasks/engine/registry.py): a kind that agents drive over the
    API has none, and its agent — not a worker — is the one to come back for it."""
    seen = list(tasks_needing_work().filter(kind__in=known_kinds()).values_list("pk", "version"))
    sent = 0
    for task_id, version in seen:
        if not (until := wake_up_claim(task_id=task_id, version=version)):
            continue
        _send_claimed(task_id, version, until, {"queue": queue} if queue else {})
        sent += 1
    # A confirmed bulk run whose message was lost would wait for ever: send it again (applying it twice is safe).
    for run_id in bulk_runs_stalled(clock.now()):
        if queue:
            apply_bulk_run.apply_async((run_id,), queue=queue)
        else:
            apply_bulk_run.delay(run_id)
    return sent


@shared_task(name="tasks.apply_bulk_run", acks_late=True, ignore_result=True)
def apply_bulk_run(run_id: int) -> str:
    """Apply a confirmed bulk run (tasks.people.bulk.bulk_run_apply), task by task. A redelivered message finishes what
    is
    left and changes nothing twice: each item is finished once, each change is version-checked."""
    run = bulk_run_apply(run_id=run_id)
    return f"bulk run {run.pk}: {run.status}"


@shared_task(name="tasks.verify_logs", ignore_result=True)
def verify_logs(username: str) -> int:
    """An admin's "verify now", on a worker: walking every task's log takes minutes with many tasks. The admin is
    checked again here (tasks.people.oversight.logs_verify); the run records what it found."""
    from django.contrib.auth.models import User

    from audit.principals import Principal
    from tasks.people.oversight import logs_verify

    user = User.objects.filter(username=username).first()
    if user is None:
        return 0
    return logs_verify(actor=Principal.of_user(user)).pk


@shared_task(name="tasks.archive_events", ignore_result=True)
def archive_events() -> str:
    """The beat's archive step (tasks.engine.archive.archive_ended): ended tasks' events out of the hot table. Two
    runs at once move each task once (the second finds its rows locked, then nothing left to copy)."""
    from tasks.engine.archive import archive_ended

    return archive_ended().sentence()
