"""Celery entry points: thin adapters that take ids and call one service. Correctness never depends on a
message arriving once: a duplicate finds the lease taken or nothing to do; a lost one is found by the scan."""

import os
import socket

from celery import shared_task
from django.conf import settings

from tasks.connectors.objectstore import ObjectStoreConnector
from tasks.recovery import tasks_needing_work
from tasks.runner import run_task_once


def _holder_id() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


@shared_task(name="tasks.drive_task", acks_late=True, ignore_result=True)
def drive_task(task_id: int) -> str:
    connector = ObjectStoreConnector(settings.RECKON_OBJECTSTORE_URL)
    return run_task_once(task_id=task_id, holder_id=_holder_id(), connector=connector)


@shared_task(name="tasks.recovery_scan", ignore_result=True)
def recovery_scan(queue: str = "") -> int:
    """Wake a worker for every task that needs one. Running it twice, or on two workers, is harmless."""
    ids = list(tasks_needing_work().values_list("pk", flat=True))
    for task_id in ids:
        if queue:
            drive_task.apply_async((task_id,), queue=queue)
        else:
            drive_task.delay(task_id)
    return len(ids)
