"""A chain shares commits: one node's receipt and the next node's intent land in one write (as two events), before
the next call — or neither lands (tasks.engine.protocol.record_outcome(start_next=True), compare_and_set(then=…))."""

from collections.abc import Callable
from typing import Any

import pytest

from leases.models import Lease
from tasks.core.errors import VersionConflict
from tasks.core.lifecycle import NodeStatus, OperationStatus
from tasks.core.outcomes import Committed
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.engine.protocol import operation_start, record_outcome
from tasks.engine.runner import run_steps
from tasks.engine.snapshot import task_snapshot
from tasks.models import Event, Node, Operation, Receipt, Task
from tests.conftest import chain_plan, snapshot
from tests.test_step_budget import Receipts


class Witness(Receipts):
    """Commits at once, and notes what the database holds when each call is made."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def submit(self, op_key: str, request: dict[str, Any]) -> Committed:
        op = Operation.objects.select_related("node").get(op_key=op_key)
        earlier = Node.objects.filter(task_id=op.task_id, position__lt=op.node.position)
        self.seen.append(
            {
                "status": op.status,
                "earlier_succeeded": all(n.status == NodeStatus.SUCCEEDED for n in earlier),
                "earlier_receipts": Receipt.objects.filter(operation__node__in=earlier).count(),
                "earlier": earlier.count(),
            }
        )
        return Committed(remote_id=f"r-{op_key[-12:]}")


def test_each_receipt_and_the_next_nodes_intent_land_in_one_write_before_the_next_call(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = make_task(chain_plan("a", "b", "c"))
    lease = agent_lease(task)
    witness = Witness()

    report = run_steps(task_id=task.pk, lease=lease, connector=witness)

    assert report.directive is not None and report.directive.kind == "done"
    # Every call found its operation registered as sent, and every earlier node advanced with its receipt.
    assert witness.seen == [
        {"status": OperationStatus.DISPATCHED, "earlier_succeeded": True, "earlier_receipts": n, "earlier": n}
        for n in range(3)
    ]
    events = list(Event.objects.filter(task=task, type__in=["node_succeeded", "operation_dispatched"]).order_by("seq"))
    assert [e.type for e in events] == ["operation_dispatched", *["node_succeeded", "operation_dispatched"] * 2,
                                        "node_succeeded"]  # fmt: skip
    # a receipt and the next start: consecutive versions, one write (one time)
    for succeeded, dispatched in [(events[1], events[2]), (events[3], events[4])]:
        assert dispatched.seq == succeeded.seq + 1
        assert dispatched.created_at == succeeded.created_at
    assert events[0].created_at != events[1].created_at  # the first start and the first receipt: two writes
    assert Task.objects.get(pk=task.pk).version == events[-1].seq + 0  # the completing write's event is last


def test_nothing_of_a_shared_write_lands_when_a_row_of_the_next_start_changed_behind_the_version(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    begun = operation_start(snap, "a", lease=lease)
    op, snap = begun.operation, begun.snapshot
    # A write that bypassed the version: node b is no longer the pending node the snapshot shows.
    Node.objects.filter(task=task, key="b").update(status=NodeStatus.RUNNING)
    before = snapshot()

    with pytest.raises(VersionConflict):
        record_outcome(snap, op.op_key, Committed(remote_id="r-a"), lease=lease, start_next=True)

    assert snapshot() == before  # neither a's receipt and advance nor b's intent
    op.refresh_from_db()
    assert op.status == OperationStatus.DISPATCHED and not Receipt.objects.filter(operation=op).exists()


def test_a_receipt_is_written_alone_where_the_next_directive_is_not_a_start(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = make_task(chain_plan("a", "b"))
    Task.objects.filter(pk=task.pk).update(attempt_budget=1)  # b cannot start: the task's budget is spent by a
    lease = agent_lease(task)

    report = run_steps(task_id=task.pk, lease=lease, connector=Receipts())

    assert report.directive is not None and report.directive.reason == "budget_exhausted"
    assert Node.objects.get(task=task, key="a").status == NodeStatus.SUCCEEDED
    assert Receipt.objects.filter(operation__task=task).count() == 1
    assert not Operation.objects.filter(task=task, node__key="b").exists()


def test_a_second_change_may_not_ask_for_a_field_the_first_sets(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    """Both changes' conditions are judged on the row as read: a second change asking about a field the first one
    writes would be judged on the wrong value. Refused, nothing written."""
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    first = Change(event="touched", task={"inputs_recheck_required": True})
    then = Change(event="touched_again", requires={"inputs_recheck_required": False})
    before = snapshot()

    with pytest.raises(ValueError, match="cannot follow"):
        compare_and_set(task.pk, snap.version, first, lease=lease, snapshot=snap, then=then)

    assert snapshot() == before
