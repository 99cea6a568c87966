"""Which tasks need a worker, from the database alone (the recovery scan; DESIGN §8: messages may be lost)."""

from datetime import datetime

from django.db.models import QuerySet

from tasks.models import Task


def tasks_needing_work(now: datetime | None = None) -> QuerySet[Task]:
    """Task.objects.workable(), oldest first: the tasks the recovery scan wakes a worker for."""
    return Task.objects.workable(now).order_by("pk")
