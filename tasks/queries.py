"""Reads for pages and the API."""

from django.db.models import Count, F, Q, QuerySet

from tasks.errors import TaskNotFound
from tasks.lifecycle import OPEN_OPERATION_STATUSES, NodeStatus
from tasks.models import Task


def get_task(task_id: int) -> Task:
    """The task row, or TaskNotFound."""
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    return task


def task_overview() -> QuerySet[Task]:
    """Tasks, newest change first, with progress on their current plan and their open operations."""
    current_plan = Q(nodes__plan_version=F("plan_version"))
    return Task.objects.annotate(
        nodes_total=Count("nodes", filter=current_plan, distinct=True),
        nodes_done=Count("nodes", filter=current_plan & Q(nodes__status=NodeStatus.SUCCEEDED.value), distinct=True),
        open_operations=Count(
            "operations", filter=Q(operations__status__in=[s.value for s in OPEN_OPERATION_STATUSES]), distinct=True
        ),
    ).order_by("-updated_at")
