"""What a dangerous action will do is counted from the live rows (tasks/reads/consequences.py): vary the rows, the
sentences follow; the reads do not grow with them."""

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leases.services import lease_release
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed
from tasks.models import Node, Operation, Task
from tasks.reads import consequences
from tests.conftest import chain_plan
from tests.steps import record, send

pytestmark = pytest.mark.django_db


def in_flight(task: Task, count: int, status: str = "dispatched") -> list[Operation]:
    """``count`` operations sent and not settled, on nodes of their own. The protocol keeps one in flight at a
    time; these rows stand for what a crash or a person's takeover can leave open (the reads count rows)."""
    nodes = list(Node.objects.filter(task=task).order_by("position"))
    made = []
    for index in range(count):
        made.append(
            Operation.objects.create(
                task=task,
                node=nodes[index % len(nodes)],
                op_key=f"rk-test-{task.pk}-{status}-{index}",
                action="store.copy_batch",
                request_digest="sha256:" + "0" * 64,
                status=status,
                dispatch_count=1,
                registered_at=task.created_at,
            )
        )
    return made


def committed_with_temps(task: Task, lease: Any, key: str, temps: int) -> None:
    locators = [f"staging/{task.pk}/{key}/{n}" for n in range(temps)]
    record(send(task, lease, key), Committed(remote_id=f"r-{key}", data={"temp": locators}), lease)


@pytest.mark.parametrize(("flying", "committed", "temps"), [(0, 0, 0), (1, 1, 2), (3, 2, 5)])
def test_cancel_sentences_count_the_rows_as_they_are(make_task, agent_lease, clock, flying, committed, temps) -> None:
    task = make_task(chain_plan("a", "b", "c", "d"))
    lease = agent_lease(task)
    for index in range(committed):
        committed_with_temps(task, lease, "abcd"[index], temps if index == 0 else 0)
    lease_release(lease=lease)
    in_flight(task, flying)
    said = consequences.cancel_consequences(task)
    text = " ".join(said.sentences)
    assert said.impact == flying
    if flying:
        assert f"{flying} operation{'s' if flying != 1 else ''} in flight will be awaited" in text
    else:
        assert "No operation is in flight" in text
    assert f"{committed} committed effect" in text
    if temps:
        assert f"{temps} temp resource{'s' if temps != 1 else ''} will be cleaned up" in text
    else:
        assert "No temp resource is left" in text


def test_cancel_names_at_most_five_op_keys_and_counts_the_rest(make_task, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    ops = in_flight(task, 7)
    text = " ".join(consequences.cancel_consequences(task).sentences)
    assert ops[0].op_key in text and ops[4].op_key in text and ops[5].op_key not in text
    assert "and 2 more" in text


def test_an_unknown_operation_says_the_task_will_wait_for_reconciliation(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    text = " ".join(consequences.cancel_consequences(task).sentences)
    assert "1 operation of unknown outcome must be reconciled" in text
    assert "stopped with pending reconciliation" in text


@pytest.mark.parametrize("count", [1, 20])
def test_cancel_consequences_read_three_times_whatever_the_rows(make_task, clock, count) -> None:
    task = make_task(chain_plan("a", "b"))
    in_flight(task, count)
    with CaptureQueriesContext(connection) as queries:
        consequences.cancel_consequences(task)
    assert len(queries) == 3


def test_force_release_names_the_holder_and_counts_what_it_may_have_in_flight(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b", "c"))
    agent_lease(task, holder="agent-7")
    in_flight(task, 2)
    said = consequences.force_release_consequences(task)
    text = " ".join(said.sentences)
    assert "agent agent-7" in text and "epoch 1" in text
    assert "may have 2 operations in flight" in text
    assert "review by another admin" in text
    assert said.impact == 2


def test_force_release_of_a_free_task_says_there_is_nothing_to_release(make_task, clock) -> None:
    said = consequences.force_release_consequences(make_task())
    assert said.impact == 0
    assert "nothing to release" in said.sentences[0]


def test_settle_sentences_name_the_operation_and_its_node(make_task, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    op = in_flight(task, 1, status="unknown")[0]
    done = consequences.settle_consequences(op, "done")
    assert op.op_key in done.sentences[0] and "Node a" in done.sentences[1]
    assert "happens twice" in " ".join(consequences.settle_consequences(op, "not_done").sentences)
    assert consequences.settle_consequences(op, "compensate").impact == 2
