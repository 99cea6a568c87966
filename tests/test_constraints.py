"""The database itself refuses rows that break the model's rules, whatever code writes them."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from tasks.core.outcomes import Committed
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Event, Node, Operation, Receipt, Task, TempResource


def refused(write: Callable[[], Any]) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        write()


@pytest.fixture
def task(make_task, clock) -> Task:
    task: Task = make_task()
    return task


def committed_op(task: Task, lease: Any) -> Operation:
    d = next_directive(task_id=task.pk, lease=lease)
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), d.node_key, lease=lease
    ).operation
    return record_outcome(
        snapshot_at(task_id=op.task_id, lease=lease, expected_version=d.task_version + 1),
        op.op_key,
        Committed(remote_id="r-1"),
        lease=lease,
    ).operation


def test_a_task_status_outside_the_lifecycle_is_refused(task: Task) -> None:
    refused(lambda: Task.objects.filter(pk=task.pk).update(status="done-ish"))


def test_paused_needs_a_reason_and_a_reason_needs_paused(task: Task) -> None:
    refused(lambda: Task.objects.filter(pk=task.pk).update(status="paused", status_reason=""))
    refused(lambda: Task.objects.filter(pk=task.pk).update(status="running", status_reason="needs_replan"))
    refused(lambda: Task.objects.filter(pk=task.pk).update(status="paused", status_reason="felt_like_it"))


def test_quarantine_needs_its_reason(task: Task) -> None:
    refused(lambda: Task.objects.filter(pk=task.pk).update(status="quarantined", status_detail=""))


def test_attempts_never_exceed_their_budgets(task: Task) -> None:
    refused(lambda: Task.objects.filter(pk=task.pk).update(attempts_used=task.attempt_budget + 1))
    node = Node.objects.filter(task=task).first()
    assert node is not None
    refused(lambda: Node.objects.filter(pk=node.pk).update(attempts=node.max_attempts + 1))


def test_a_recorded_cancel_cannot_sit_beside_a_running_status(task: Task, clock) -> None:
    refused(lambda: Task.objects.filter(pk=task.pk).update(status="running", cancel_requested_at=clock.now()))


def test_node_keys_are_unique_per_plan_version(task: Task) -> None:
    node = Node.objects.filter(task=task).first()
    assert node is not None
    refused(lambda: Node.objects.filter(pk=node.pk).update(key=Node.objects.exclude(pk=node.pk).first().key))  # type: ignore[union-attr]


def test_op_keys_are_unique(task: Task, agent_lease) -> None:
    op = committed_op(task, agent_lease(task))
    refused(
        lambda: Operation.objects.create(
            task=task,
            node=op.node,
            op_key=op.op_key,
            action=op.action,
            request_digest="x",
            registered_at=op.registered_at,
        )
    )


def test_a_rejection_names_its_failure_class(task: Task, agent_lease) -> None:
    op = committed_op(task, agent_lease(task))
    refused(lambda: Operation.objects.filter(pk=op.pk).update(status="rejected", failure_class=""))


def test_event_seq_is_unique_per_task_and_starts_at_one(task: Task) -> None:
    first = Event.objects.filter(task=task).order_by("seq").first()
    assert first is not None
    fields = {"task": task, "type": "forged", "payload": {}, "prev_digest": "0", "digest": "0", "at": None}
    fields.pop("at")
    refused(lambda: Event.objects.create(seq=first.seq, created_at=first.created_at, **fields))
    refused(lambda: Event.objects.create(seq=0, created_at=first.created_at, **fields))


def test_a_receipt_needs_a_remote_id_and_a_sane_count(task: Task, agent_lease) -> None:
    op = committed_op(task, agent_lease(task))
    receipt = Receipt.objects.get(operation=op)
    refused(lambda: Receipt.objects.filter(pk=receipt.pk).update(remote_id=""))
    refused(lambda: Receipt.objects.filter(pk=receipt.pk).update(count=-1))


def test_a_temp_resource_is_deleted_only_with_a_cleanup_receipt(task: Task, clock) -> None:
    now = clock.now()
    resource = TempResource.objects.create(
        task=task, locator="tmp/a", created_at=now, retention_until=now + timedelta(days=1)
    )
    refused(lambda: TempResource.objects.filter(pk=resource.pk).update(status="deleted"))
    refused(lambda: TempResource.objects.filter(pk=resource.pk).update(retention_until=now - timedelta(seconds=1)))
    refused(
        lambda: TempResource.objects.create(
            task=task, locator="tmp/a", created_at=now, retention_until=now + timedelta(days=1)
        )
    )
