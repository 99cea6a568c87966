from typing import Any

from leases.models import Lease
from tasks.core.lifecycle import TaskStatus
from tasks.core.outcomes import Committed
from tasks.engine.protocol import next_directive, operation_start, record_outcome
from tasks.engine.verification import task_verify_log


def test_a_task_runs_to_completion_on_receipts(make_task: Any, agent_lease: Any, clock: Any) -> None:
    task = make_task()
    lease: Lease = agent_lease(task)
    for _ in range(2):
        directive = next_directive(task_id=task.pk, lease=lease)
        assert directive.kind == "execute"
        op = operation_start(
            task_id=task.pk, node_key=directive.node_key, expected_version=directive.task_version, lease=lease
        )
        record_outcome(
            op_key=op.op_key,
            outcome=Committed(remote_id="r-" + directive.node_key),
            expected_version=directive.task_version + 1,
            lease=lease,
        )
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    assert next_directive(task_id=task.pk, lease=lease).kind == "done"
    assert task_verify_log(task_id=task.pk).problem is None
