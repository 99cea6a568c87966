"""Protocol steps for tests: each reads the task version afresh, as a well-behaved agent does."""

from leases.models import Lease
from tasks.core.outcomes import Outcome
from tasks.engine.protocol import operation_start, record_outcome, snapshot_at
from tasks.models import Operation, Task


def version(task: Task) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task.pk)


def send(task: Task, lease: Lease, key: str) -> Operation:
    """Register ``key``'s operation and mark it sent (one commit): the external call is now in flight."""
    return operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=version(task)), key, lease=lease
    ).operation


def record(op: Operation, outcome: Outcome, lease: Lease) -> Operation:
    return record_outcome(
        snapshot_at(task_id=op.task_id, lease=lease, expected_version=version(op.task)), op.op_key, outcome, lease=lease
    ).operation
