"""Protocol steps for tests: each reads the task version afresh, as a well-behaved agent does."""

from datetime import timedelta

from leases.clock import ControllableClock
from leases.models import Lease
from tasks.core.outcomes import Outcome
from tasks.decide.decisions import not_found_final_at
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


def past_deadline(clock: ControllableClock, op: Operation) -> None:
    """Move the test's clock just past the moment ``op``'s "not found" becomes final (its latest send's deadline
    plus the clock skew): no request under its op key can land after that."""
    op = Operation.objects.get(pk=op.pk)
    clock.set(max(clock.now(), not_found_final_at(op) + timedelta(milliseconds=1)))


def asked(task: Task, key: str) -> str:
    """The digest of the requests approval ``key`` is asked to permit now: what the approver's page shows (and
    posts back as ``approving``)."""
    from tasks.people.approvals import approvals_awaited

    found = [a for a in approvals_awaited(Task.objects.get(pk=task.pk)) if a.approval.key == key]
    assert found, f"approval {key} is not awaited"
    return found[0].proposal.digest
