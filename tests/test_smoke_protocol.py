from typing import Any

from leases.models import Lease
from tasks.core.lifecycle import TaskStatus
from tasks.core.outcomes import Committed
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.engine.verification import task_verify_log


def test_a_task_runs_to_completion_on_receipts(make_task: Any, agent_lease: Any, clock: Any) -> None:
    task = make_task()
    lease: Lease = agent_lease(task)
    for _ in range(2):
        directive = next_directive(task_id=task.pk, lease=lease)
        assert directive.kind == "execute"
        op = operation_start(
            snapshot_at(task_id=task.pk, lease=lease, expected_version=directive.task_version),
            directive.node_key,
            lease=lease,
        ).operation
        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=directive.task_version + 1),
            op.op_key,
            Committed(remote_id="r-" + directive.node_key),
            lease=lease,
        )
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    assert next_directive(task_id=task.pk, lease=lease).kind == "done"
    assert task_verify_log(task_id=task.pk).problem is None
