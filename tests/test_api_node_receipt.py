"""``GET /api/v1/tasks/{task_id}/nodes/{node_key}/receipt``: what an agent reads back of a step is the receipt row
Reckon holds — every field as stored, under the op key that carried it — the one that advanced the node, across a
retry and a re-plan that kept the node; and a read writes nothing. Its refusals (no such node, no receipt yet) are
provoked in tests/test_api_refusals_declared.py, its scope in tests/test_api_scope.py."""

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from api.tokens import api_token_issue
from leases.clock import ControllableClock
from leases.models import Lease
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import RECEIPT_FIELDS, Committed, Failed
from tasks.engine.plans import plan_accept, plan_propose
from tasks.models import Node, Receipt, Task
from tasks.reads.detail import node_receipt
from tests.conftest import chain_plan, person, snapshot
from tests.steps import record, send, version
from tests.test_api_steps import Agent

pytestmark = pytest.mark.django_db

GIVEN: dict[str, Any] = {"remote_id": "r-a", "remote_version": "7", "count": 50, "digest": "sha256:" + "cd" * 32}


@pytest.fixture
def reader(client: Client) -> Agent:
    """A token for the tasks' kind (make_task's "test")."""
    return Agent(client, api_token_issue(actor=person("root", "admin"), agent_id="a7", kinds=["test"], projects=[])[1])


def read(reader: Agent, task: Task, node: str) -> Any:
    return reader.call("get", f"/tasks/{task.pk}/nodes/{node}/receipt")


def test_the_answer_is_the_stored_receipt_under_the_op_key_that_carried_it_and_reading_writes_nothing(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], reader: Agent
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Committed(**GIVEN, data={"output": {"retained": 3, "version": 1}}), lease)
    assert reader.call("get", "/tasks").status_code == 200  # the token's last-use hint written: out of the snapshot
    before = snapshot()
    answer = read(reader, task, "a")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    row = Receipt.objects.get(operation=op)
    assert {name: body[name] for name in RECEIPT_FIELDS} == {name: getattr(row, name) for name in RECEIPT_FIELDS}
    assert {name: body[name] for name in RECEIPT_FIELDS} == GIVEN
    assert (body["op_key"], body["node"], body["node_status"], body["action"]) == (
        op.op_key,
        "a",
        "succeeded",
        op.action,
    )
    assert body["data"] == row.data and body["data"]["output"] == {"retained": 3, "version": 1}
    assert body["committed_after_cancel_request"] is False and body["received_at"]
    assert snapshot() == before


def test_a_retried_node_answers_the_receipt_that_advanced_it_not_the_failed_attempt(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], reader: Agent, clock: ControllableClock
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    first = record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
    assert read(reader, task, "a").json()["code"] == "receipt_not_found"  # a failure is no receipt
    not_before = Node.objects.get(task=task, key="a").not_before
    assert not_before is not None
    clock.set(not_before)
    second = record(send(task, lease, "a"), Committed(remote_id="r-2"), lease)
    body = read(reader, task, "a").json()
    assert first.op_key != second.op_key and (body["op_key"], body["remote_id"]) == (second.op_key, "r-2")


def test_a_node_a_re_plan_kept_answers_its_receipt_and_a_node_it_dropped_is_not_found(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], reader: Agent
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    ran = record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    record(send(task, lease, "b"), Failed(FailureClass.INVALID_PARAMS, "bad"), lease)
    revision = plan_propose(
        task_id=task.pk, plan=chain_plan("a", "c"), proposed_by="agent:a7", expected_version=version(task), lease=lease
    )
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    assert read(reader, task, "a").json()["op_key"] == ran.op_key
    assert read(reader, task, "b").json()["code"] == "node_not_found"
    assert read(reader, task, "c").json()["code"] == "receipt_not_found"


def test_the_read_is_two_queries_however_many_attempts_the_node_had(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    for _ in range(2):  # of its three attempts
        record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
        not_before = Node.objects.get(task=task, key="a").not_before
        assert not_before is not None
        clock.set(not_before)
    op = record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    with CaptureQueriesContext(connection) as queries:
        found = node_receipt(task_id=task.pk, node_key="a")
        assert found is not None and found.operation is not None
        assert (found.operation.op_key, found.operation.receipt.remote_id) == (op.op_key, "r-a")
    assert len(queries) == 2, [q["sql"] for q in queries]
