"""Celery entry points: thin adapters that take ids and call one service. Correctness never depends on a
message arriving once: a duplicate finds the lease taken or nothing to do; a lost one is found by the scan."""

import os
import socket
from typing import Any

from celery import Task, shared_task

from leases import clock
from tasks.bulk import bulk_run_apply, bulk_runs_stalled
from tasks.models import Task as TaskRow
from tasks.recovery import tasks_needing_work
from tasks.registry import connector_for, known_kinds
from tasks.runner import run_task_once

# A wake-up asked for further away than this is left to the recovery scan (it finds the task from the database).
MAX_COUNTDOWN_SECONDS = 300.0


def _holder_id() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


@shared_task(name="tasks.drive_task", acks_late=True, ignore_result=True, bind=True)
def drive_task(self: Task[Any, Any], task_id: int, seen_version: int | None = None) -> str:
    """One wake-up, with the connector registered for the task's kind (tasks/registry.py); a kind no app registered
    raises UnknownTaskKind (the worker logs it; the task is left as it is, for the scan to find again)."""
    kind = TaskRow.objects.filter(pk=task_id).values_list("kind", flat=True).first()
    if kind is None:
        return "skipped: task_not_found"
    connector = connector_for(kind)
    wake = run_task_once(task_id=task_id, holder_id=_holder_id(), connector=connector, seen_version=seen_version)
    if wake.wake_at is not None:
        # Backoff or an accepted operation to observe: ask for the next wake-up. Losing this message costs only
        # latency (the scan finds the task); a duplicate finds nothing to do.
        countdown = max(0.0, (wake.wake_at - clock.now()).total_seconds())
        if countdown <= MAX_COUNTDOWN_SECONDS:
            queue = str((self.request.delivery_info or {}).get("routing_key") or "")
            if queue:  # the queue this wake-up came from
                drive_task.apply_async((task_id,), countdown=countdown, queue=queue)
            else:
                drive_task.apply_async((task_id,), countdown=countdown)
    return wake.summary


@shared_task(name="tasks.recovery_scan", ignore_result=True)
def recovery_scan(queue: str = "") -> int:
    """Wake a worker for every task that needs one, naming the version seen. Running it twice, or on two workers,
    dispatches nothing twice: wake-ups are deduplicated on (task id, version) — once one worker has moved the task
    on, the other message finds its version stale and does nothing — and the lease serialises the rest.

    Only tasks of a kind with a connector registered here (tasks/registry.py): a kind that agents drive over the
    API has none, and its agent — not a worker — is the one to come back for it."""
    seen = list(tasks_needing_work().filter(kind__in=known_kinds()).values_list("pk", "version"))
    for task_id, version in seen:
        if queue:
            drive_task.apply_async((task_id, version), queue=queue)
        else:
            drive_task.delay(task_id, version)
    # A confirmed bulk run whose message was lost would wait for ever: send it again (applying it twice is safe).
    for run_id in bulk_runs_stalled(clock.now()):
        if queue:
            apply_bulk_run.apply_async((run_id,), queue=queue)
        else:
            apply_bulk_run.delay(run_id)
    return len(seen)


@shared_task(name="tasks.apply_bulk_run", acks_late=True, ignore_result=True)
def apply_bulk_run(run_id: int) -> str:
    """Apply a confirmed bulk run (tasks.bulk.bulk_run_apply), task by task. A redelivered message finishes what is
    left and changes nothing twice: each item is finished once, each change is version-checked."""
    run = bulk_run_apply(run_id=run_id)
    return f"bulk run {run.pk}: {run.status}"


@shared_task(name="tasks.verify_logs", ignore_result=True)
def verify_logs(username: str) -> int:
    """An admin's "verify now", on a worker: walking every task's log takes minutes with many tasks. The admin is
    checked again here (tasks.oversight.logs_verify); the run records what it found."""
    from django.contrib.auth.models import User

    from audit.principals import Principal
    from tasks.oversight import logs_verify

    user = User.objects.filter(username=username).first()
    if user is None:
        return 0
    return logs_verify(actor=Principal.of_user(user)).pk
