"""Celery entry points: thin adapters that take ids and call one service. Correctness never depends on a
message arriving once: a duplicate finds the lease taken or nothing to do; a lost one is found by the scan."""

import os
import socket
from typing import Any

from celery import Task, shared_task
from django.conf import settings

from leases import clock
from tasks.connectors.objectstore import ObjectStoreConnector
from tasks.recovery import tasks_needing_work
from tasks.runner import run_task_once

# A wake-up asked for further away than this is left to the recovery scan (it finds the task from the database).
MAX_COUNTDOWN_SECONDS = 300.0


def _holder_id() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


def connector() -> ObjectStoreConnector:
    if settings.RECKON_OBJECTSTORE_IDEMPOTENCY == "tag":
        return ObjectStoreConnector(settings.RECKON_OBJECTSTORE_URL, idempotency="tag")
    return ObjectStoreConnector(settings.RECKON_OBJECTSTORE_URL, idempotency="remote")


@shared_task(name="tasks.drive_task", acks_late=True, ignore_result=True, bind=True)
def drive_task(self: Task[Any, Any], task_id: int, seen_version: int | None = None) -> str:
    wake = run_task_once(task_id=task_id, holder_id=_holder_id(), connector=connector(), seen_version=seen_version)
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
    on, the other message finds its version stale and does nothing — and the lease serialises the rest."""
    seen = list(tasks_needing_work().values_list("pk", "version"))
    for task_id, version in seen:
        if queue:
            drive_task.apply_async((task_id, version), queue=queue)
        else:
            drive_task.delay(task_id, version)
    return len(seen)
