"""Celery entry point: a thin adapter over the sweep. A duplicated, delayed or lost message is harmless: every
step of the sweep is conditional and idempotent, and the next beat finds whatever this one left."""

from typing import Any

from celery import shared_task

from retention.services import retention_sweep


@shared_task(name="retention.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    return retention_sweep().as_dict()
