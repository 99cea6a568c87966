"""Protocol steps for tests: each reads the task version afresh, as a well-behaved agent does."""

from leases.models import Lease
from tasks.models import Operation, Task
from tasks.outcomes import Outcome
from tasks.protocol import operation_start, record_outcome


def version(task: Task) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task.pk)


def send(task: Task, lease: Lease, key: str) -> Operation:
    """Register ``key``'s operation and mark it sent (one commit): the external call is now in flight."""
    return operation_start(task_id=task.pk, node_key=key, expected_version=version(task), lease=lease)


def record(op: Operation, outcome: Outcome, lease: Lease) -> Operation:
    return record_outcome(op_key=op.op_key, outcome=outcome, expected_version=version(op.task), lease=lease)


# Transitional, for test files not yet ported to the one-commit start (removed once they are): registering an
# intent and dispatching it are one commit now, so "register" starts the operation and "dispatch" returns it.
def register(task: Task, lease: Lease, key: str) -> Operation:
    return send(task, lease, key)


def dispatch(op: Operation, lease: Lease) -> Operation:
    return op
