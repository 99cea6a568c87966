"""One request per step (docs/api.md, "A step in one request"): ``POST …/operations/{op_key}/outcome`` with
``start_next`` records the receipt and, when the next directive is to start a fresh node, registers that node's
operation and marks it sent in the same commit, answering it as ``next``. Each test tries to get a start past a
refusal of the receipt's write, or a second registration past a replay, and checks the database."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from audit.principals import Principal
from leases.models import Lease
from tasks.models import Event, Operation, Task
from tasks.people.cancel import task_request_cancel
from tests.conftest import chain_plan, snapshot
from tests.test_api_steps import Agent, admin, agent, created, issue, version_of

pytestmark = pytest.mark.django_db

COMMITTED = {"result": "committed", "remote_id": "r", "start_next": True}


__all__ = ["admin", "agent", "issue"]  # the fixtures of tests/test_api_steps.py


def first_intent(agent: Agent, nodes: tuple[str, ...] = ("a", "b", "c")) -> tuple[int, int, dict[str, Any], int]:
    """A task of ``nodes`` with its lease and node a's operation sent: (task id, lease id, operation, version)."""
    task = created(agent, plan=chain_plan(*nodes))
    lease = agent.acquire(task["id"], ttl_seconds=300)["lease_id"]
    d = agent.directive(task["id"], lease)
    started = agent.start(task["id"], lease, "a", d["task_version"])
    assert started.status_code == 201, started.content
    return task["id"], lease, started.json(), d["task_version"] + 1


def report(agent: Agent, task_id: int, lease: int, op_key: str, version: int, **headers: str) -> Any:
    path = f"/tasks/{task_id}/operations/{op_key}/outcome"
    return agent.call("post", path, COMMITTED, Reckon_Lease=str(lease), If_Match=f'"{version}"', **headers)


def test_the_outcome_answers_the_next_nodes_operation_started_in_the_receipts_commit(agent: Agent) -> None:
    task_id, lease, op, version = first_intent(agent)
    answered = report(agent, task_id, lease, op["op_key"], version)

    assert answered.status_code == 200, answered.content
    body = answered.json()
    assert body["operation"]["status"] == "committed"
    following = body["next"]
    assert (following["kind"], following["node_key"], following["started"]) == ("execute", "b", True)
    assert following["operation"]["status"] == "dispatched" and following["operation"]["op_key"] == following["op_key"]
    assert following["task_version"] == version + 2 == body["task"]["version"]
    assert answered["ETag"] == f'"{version + 2}"' and version_of(task_id) == version + 2
    # In the database before the agent calls anything: a's receipt and b's start, two events of one write.
    assert Operation.objects.get(op_key=following["op_key"]).status == "dispatched"
    succeeded, dispatched = Event.objects.filter(task_id=task_id, seq__gt=version).order_by("seq")
    assert (succeeded.type, dispatched.type) == ("node_succeeded", "operation_dispatched")
    assert succeeded.created_at == dispatched.created_at

    # The chain goes on by outcomes alone; the last one answers what GET …/directive would: done.
    after_b = report(agent, task_id, lease, following["op_key"], version + 2).json()
    assert after_b["next"]["node_key"] == "c"
    last = report(agent, task_id, lease, after_b["next"]["op_key"], version + 4)
    assert last.status_code == 200, last.content
    assert last.json()["next"]["kind"] == "done" and last.json()["next"]["started"] is False
    assert last.json()["next"] == {**agent.directive(task_id, lease), "asked_at": last.json()["next"]["asked_at"]}
    assert Task.objects.get(pk=task_id).status == "completed"


def test_without_start_next_the_outcome_answers_as_before_and_starts_nothing(agent: Agent) -> None:
    task_id, lease, op, version = first_intent(agent)
    path = f"/tasks/{task_id}/operations/{op['op_key']}/outcome"
    plain = {"result": "committed", "remote_id": "r"}
    headers = {"Reckon_Lease": str(lease), "If_Match": f'"{version}"', "Idempotency_Key": "plain"}
    answered = agent.call("post", path, plain, **headers)
    assert answered.status_code == 200 and answered.json()["next"] is None
    assert answered["ETag"] == f'"{version + 1}"'
    assert agent.call("post", path, plain, **headers).json() == answered.json()  # its record, in the same write
    assert not Operation.objects.filter(task_id=task_id, node__key="b").exists()
    assert agent.directive(task_id, lease)["node_key"] == "b"  # the old flow goes on: directive, intent, outcome


def _cancel_meanwhile(task_id: int) -> None:
    task_request_cancel(actor=Principal.agent("agent-7"), task_id=task_id, reason="withdrawn")


def _cancel_behind_the_version(task_id: int) -> None:
    """A cancel that did not move the version (none does): the statement's own condition must still hold."""
    at = Task.objects.get(pk=task_id).updated_at
    Task.objects.filter(pk=task_id).update(cancel_requested_at=at, status="stopping")


@pytest.mark.parametrize(
    ("meanwhile", "status", "codes"),
    [
        (None, 412, ("version_conflict",)),  # a stale If-Match
        ("lapse", 409, ("lease_expired", "lease_lost")),
        (_cancel_meanwhile, 412, ("version_conflict",)),
        (_cancel_behind_the_version, 409, ("cancel_requested",)),
    ],
    ids=["stale_if_match", "lease_lapsed", "cancel_recorded", "cancel_behind_the_version"],
)
def test_a_refused_receipt_starts_no_next_node_and_writes_nothing(
    agent: Agent, clock: Any, monkeypatch: pytest.MonkeyPatch, meanwhile: Any, status: int, codes: tuple[str, ...]
) -> None:
    task_id, lease, op, version = first_intent(agent)
    before: dict[str, Any] = {}
    if meanwhile is None:
        version -= 1
    elif meanwhile == "lapse":
        clock.advance(timedelta(minutes=10))
    else:  # between the snapshot the outcome is decided on and its write
        import api.steps
        from tasks.engine.protocol import record_outcome as real

        def late(*args: Any, **kwargs: Any) -> Any:
            meanwhile(task_id)
            before.update(snapshot())
            return real(*args, **kwargs)

        monkeypatch.setattr(api.steps, "record_outcome", late)
    if not callable(meanwhile):
        before.update(snapshot())
    answered = report(agent, task_id, lease, op["op_key"], version, Idempotency_Key="refused")
    assert answered.status_code == status and answered.json()["code"] in codes, answered.content
    assert snapshot() == before  # nothing of the outcome's write: neither a's receipt, nor b's start, nor a record
    assert not Operation.objects.filter(task_id=task_id, node__key="b").exists()
    assert Operation.objects.get(op_key=op["op_key"]).status == "dispatched"


def test_a_replayed_outcome_answers_the_same_next_work_and_registers_nothing_twice(agent: Agent) -> None:
    """Its answer's record is part of the outcome's own write (the next node started) or of a transaction around
    it (the next directive read after the write: here the last node's, done); either way the replay is the first
    answer and the key cannot be reused for another request."""
    task_id, lease, op, version = first_intent(agent, ("a", "b"))
    first = report(agent, task_id, lease, op["op_key"], version, Idempotency_Key="outcome-a")
    rows = snapshot()
    again = report(agent, task_id, lease, op["op_key"], version, Idempotency_Key="outcome-a")

    assert first.status_code == again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json() and again["ETag"] == first["ETag"]
    assert snapshot() == rows
    assert Operation.objects.filter(task_id=task_id, node__key="b").count() == 1
    path = f"/tasks/{task_id}/operations/{op['op_key']}/outcome"
    other = {**COMMITTED, "remote_id": "another"}
    reused = agent.call(
        "post", path, other, Reckon_Lease=str(lease), If_Match=f'"{version}"', Idempotency_Key="outcome-a"
    )
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    assert snapshot() == rows

    b = first.json()["next"]["op_key"]
    last = report(agent, task_id, lease, b, version + 2, Idempotency_Key="outcome-b")
    assert last.json()["next"]["kind"] == "done"
    assert report(agent, task_id, lease, b, version + 2, Idempotency_Key="outcome-b").json() == last.json()


@pytest.fixture
def counted() -> Iterator[Any]:
    from harness.bench import StatementCounter

    counter = StatementCounter(connection)
    yield counter


@pytest.mark.django_db(transaction=True)
def test_a_steady_state_node_costs_one_request_and_one_commit(client: Client, admin: Principal, counted: Any) -> None:
    """Outside a test transaction, as a web server runs it (autocommit): a node in the middle of a chain is one
    outcome request, one commit, and a pinned number of statements — the token read with the task's scope and the
    lease, the task's row (its nodes and operations are the ones the previous answer left, still at that version:
    api.steps.RECENT), then the write: the receipt, the next node's start and the Idempotency-Key's record of the
    answer in one statement on PostgreSQL (no BEGIN, no COMMIT), one transaction on SQLite. The key is not looked up
    first: a compare-and-set that committed cannot commit again, so it is looked up only when refused
    (api/idempotency.py)."""
    from api.tokens import api_token_issue

    agent = Agent(client, api_token_issue(actor=admin, agent_id="agent-7", kinds=("copy",), projects=())[1])
    task_id, lease, op, version = first_intent(agent, ("a", "b", "c", "d"))
    key = report(agent, task_id, lease, op["op_key"], version, Idempotency_Key="k-a").json()["next"]["op_key"]
    version += 2
    with counted.installed():
        answered = report(agent, task_id, lease, key, version, Idempotency_Key="k-b")
    assert answered.status_code == 200 and answered.json()["next"]["node_key"] == "c"
    print(f"\n[one step over the API] {counted.statements} statements, {counted.commits} commits")
    pg = connection.vendor == "postgresql"
    assert counted.commits == 1 and counted.transactions == (0 if pg else 1)
    # token, scope and lease in one read, the task's row; then the write with the key's record: PostgreSQL one
    # statement; SQLite ten (lease, task, two nodes, two operations, receipt, two events, the record). BEGIN is not
    # counted.
    assert counted.statements == 2 + (1 if pg else 10)
    assert Lease.objects.get(pk=lease).released_at is None


def test_the_lease_read_with_the_token_must_be_this_agents_on_this_task(agent: Agent) -> None:
    """The lease is read in the token's query (api/auth.py): one of the agent's leases on another task is not a lease
    on this one — refused as before that read joined the token's, and nothing written."""
    task_id, lease, op, version = first_intent(agent)
    other_task, other_lease, _other_op, _v = first_intent(agent)
    events = Event.objects.filter(task_id=task_id).count()
    refused = report(agent, task_id, other_lease, op["op_key"], version)
    assert refused.status_code == 409 and refused.json()["code"] == "lease_not_held", refused.content
    assert Event.objects.filter(task_id=task_id).count() == events and version_of(task_id) == version
    assert report(agent, task_id, lease, op["op_key"], version).status_code == 200  # its own lease still works
    assert other_task != task_id


def grant(agent: Agent, task_id: int, start_next: bool = True, **headers: str) -> Any:
    return agent.call("post", f"/tasks/{task_id}/lease", {"ttl_seconds": 300, "start_next": start_next}, **headers)


def test_the_grant_answers_the_first_node_already_started(agent: Agent) -> None:
    """``POST …/lease`` with ``start_next``: the grant, the first directive and the first node's operation registered
    and marked sent — what GET …/directive and POST …/operations would have done, in one request."""
    task = created(agent, plan=chain_plan("a", "b"))
    version = version_of(task["id"])

    answered = grant(agent, task["id"])

    assert answered.status_code == 201, answered.content
    body = answered.json()
    first = body["next"]
    assert (first["kind"], first["node_key"], first["started"]) == ("execute", "a", True)
    assert first["operation"]["status"] == "dispatched" and first["operation"]["op_key"] == first["op_key"]
    after = version_of(task["id"])
    assert after > version and first["task_version"] == body["task_version"] == after
    assert answered["ETag"] == f'"{after}"'
    assert Operation.objects.get(op_key=first["op_key"]).status == "dispatched"
    # The agent goes on from there as from any started directive: the outcome, then the next node.
    following = report(agent, task["id"], body["lease_id"], first["op_key"], after)
    assert following.status_code == 200 and following.json()["next"]["node_key"] == "b"


def test_a_grant_after_a_crash_answers_the_reconcile_and_starts_nothing(agent: Agent) -> None:
    """Reconcile first, as the directive says: an operation left open by the last holder is looked up before any
    new side effect — the grant's answer starts nothing."""
    task_id, lease, op, _version = first_intent(agent)
    assert agent.call("delete", f"/tasks/{task_id}/lease", Reckon_Lease=str(lease)).status_code == 204
    operations = Operation.objects.filter(task_id=task_id).count()

    first = grant(agent, task_id).json()["next"]

    assert (first["kind"], first["op_key"], first["started"]) == ("reconcile", op["op_key"], False)
    assert Operation.objects.filter(task_id=task_id).count() == operations


def test_without_start_next_the_grant_answers_no_directive_and_starts_nothing(agent: Agent) -> None:
    task = created(agent, plan=chain_plan("a"))
    answered = grant(agent, task["id"], start_next=False)
    assert answered.status_code == 201 and answered.json()["next"] is None
    assert not Operation.objects.filter(task_id=task["id"]).exists()


def test_a_replayed_grant_answers_the_same_first_node_and_starts_it_once(agent: Agent) -> None:
    task = created(agent, plan=chain_plan("a", "b"))
    first = grant(agent, task["id"], Idempotency_Key="grant-1")
    again = grant(agent, task["id"], Idempotency_Key="grant-1")
    assert first.status_code == again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Operation.objects.filter(task_id=task["id"]).count() == 1
