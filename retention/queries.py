"""Reads of retained objects for pages and the API."""

from retention.models import RetainedObject


def retained_for_task(task_id: int) -> list[RetainedObject]:
    """A task's retained objects, every version, purged ones too (their rows stay as the record)."""
    return list(RetainedObject.objects.filter(task_id=task_id).order_by("name", "version"))
