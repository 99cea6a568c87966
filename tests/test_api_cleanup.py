"""Cleanup over the API: an agent whose task has ended is told to delete each temp resource its receipts named
(directive ``cleanup``: temp id, locator, op key — the delete registered and marked sent before the answer) and
reports the delete's answer (``POST …/temp-resources/{id}/cleanup``). Each test tries to get past a rule — another
op key, another task's temp resource, a stale If-Match, a token out of scope, a replay, a temporary refusal spent as
an attempt, a delete sent twice after a crash — and checks the database: a refusal changes nothing."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from api.tokens import api_token_issue
from leases.clock import ControllableClock
from leases.models import Lease
from tasks.core.lifecycle import OperationStatus, TempResourceStatus
from tasks.engine.cleanup import MAX_CLEANUP_ATTEMPTS
from tasks.engine.verification import find_problems
from tasks.models import Event, Operation, OperationPurpose, Task, TempResource
from tests.conftest import chain_plan, person, snapshot
from tests.test_api_steps import KIND, Agent, created, problem_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def issue() -> Callable[..., str]:
    admin = person("root", "admin")

    def make(kinds: tuple[str, ...] = (KIND,), agent: str = "agent-7") -> str:
        return api_token_issue(actor=admin, agent_id=agent, kinds=kinds, projects=())[1]

    return make


@pytest.fixture
def agent(client: Client, issue: Callable[..., str]) -> Agent:
    return Agent(client, issue())


def ended_with_temps(agent: Agent, temps: dict[str, list[str]], **fields: Any) -> tuple[dict[str, Any], int]:
    """A task run to completion over the API whose nodes' receipts name ``temps`` (node → locators); its lease."""
    task = created(agent, plan=chain_plan(*temps), **fields)
    lease = agent.acquire(task["id"])["lease_id"]
    for key, locators in temps.items():
        d = agent.directive(task["id"], lease)
        assert (d["kind"], d["node_key"]) == ("execute", key)
        op = agent.start(task["id"], lease, key, d["task_version"]).json()
        receipt = {"result": "committed", "remote_id": f"r-{key}", "data": {"temp": locators} if locators else {}}
        assert agent.report(task["id"], lease, op["op_key"], d["task_version"] + 1, receipt).status_code == 200
    assert Task.objects.get(pk=task["id"]).status == "completed"
    return task, lease


def report(agent: Agent, task_id: int, lease: int, temp_id: int, version: int, body: Any, **headers: str) -> Any:
    return agent.call(
        "post",
        f"/tasks/{task_id}/temp-resources/{temp_id}/cleanup",
        body,
        Reckon_Lease=str(lease),
        If_Match=f'"{version}"',
        **headers,
    )


def deleted(op_key: str, locator: str) -> dict[str, Any]:
    return {"op_key": op_key, "result": "committed", "remote_id": locator, "count": 1}


def test_an_ended_task_s_agent_is_told_to_delete_each_temp_resource_and_its_receipts_delete_them(agent: Agent) -> None:
    task, lease = ended_with_temps(agent, {"a": ["tgt/tmp/batch-1"], "b": ["tgt/tmp/batch-2", "tgt/tmp/batch-3"]})
    seen: list[str] = []
    while (d := agent.directive(task["id"], lease))["kind"] == "cleanup":
        work = d["cleanup"]
        temp = TempResource.objects.get(pk=work["temp_id"])
        # The intent is registered and marked sent before the agent is told: the op key exists before any delete.
        op = Operation.objects.get(op_key=work["op_key"])
        assert (op.purpose, op.status, op.request) == (
            OperationPurpose.CLEANUP,
            OperationStatus.DISPATCHED,
            {"action": "delete", "locator": temp.locator},
        )
        assert (work["ask"], work["locator"], d["op_key"]) == ("delete", temp.locator, op.op_key)
        assert (
            temp.status == TempResourceStatus.CLEANING and d["task_version"] == Task.objects.get(pk=task["id"]).version
        )
        answer = report(agent, task["id"], lease, temp.pk, d["task_version"], deleted(op.op_key, temp.locator))
        assert answer.status_code == 200, answer.content
        body = answer.json()
        assert body["temp_resource"]["status"] == "deleted" and answer["ETag"] == f'"{body["task"]["version"]}"'
        seen.append(work["locator"])
    assert d["kind"] == "done"
    assert seen == ["tgt/tmp/batch-1", "tgt/tmp/batch-2", "tgt/tmp/batch-3"]
    temps = TempResource.objects.filter(task_id=task["id"])
    assert {t.status for t in temps} == {TempResourceStatus.DELETED} and all(t.cleanup_receipt_id for t in temps)
    types = list(Event.objects.filter(task_id=task["id"], type__startswith="cleanup").values_list("type", flat=True))
    assert types == ["cleanup_registered", "cleanup_dispatched", "cleanup_committed"] * 3
    assert find_problems(Task.objects.get(pk=task["id"])) == []
    # Nothing is left: asking again writes nothing.
    before = snapshot()
    assert agent.directive(task["id"], lease)["kind"] == "done" and snapshot() == before


def test_an_agent_that_crashed_after_the_directive_is_told_to_look_its_delete_up_never_to_send_it_again(
    agent: Agent,
) -> None:
    task, lease = ended_with_temps(agent, {"a": ["tgt/tmp/batch-1"]})
    first = agent.directive(task["id"], lease)
    # The agent is killed here (the delete may or may not have reached the remote). The next directive asks.
    again = agent.directive(task["id"], lease)
    assert (again["kind"], again["cleanup"]["ask"], again["op_key"]) == ("cleanup", "lookup", first["op_key"])
    assert Operation.objects.filter(task_id=task["id"], purpose=OperationPurpose.CLEANUP).count() == 1
    # The remote has no trace: the same op key is sent again (no attempt spent), then its receipt deletes it.
    temp_id = first["cleanup"]["temp_id"]
    answer = report(
        agent, task["id"], lease, temp_id, again["task_version"], {"op_key": first["op_key"], "result": "not_found"}
    )
    assert answer.status_code == 200, answer.content
    resend = agent.directive(task["id"], lease)
    assert (resend["cleanup"]["ask"], resend["op_key"]) == ("delete", first["op_key"])
    assert Operation.objects.get(op_key=first["op_key"]).dispatch_count == 2
    ok = report(agent, task["id"], lease, temp_id, resend["task_version"], deleted(first["op_key"], "tgt/tmp/batch-1"))
    assert ok.status_code == 200 and agent.directive(task["id"], lease)["kind"] == "done"


def test_a_temporary_refusal_backs_off_on_the_database_clock_and_spends_no_attempt(
    agent: Agent, clock: ControllableClock
) -> None:
    task, lease = ended_with_temps(agent, {"a": ["tgt/tmp/batch-1"]})
    refused = {"result": "failed", "failure_class": "dependency_unavailable", "detail": "HTTP 503"}
    waits = []
    for _ in range(MAX_CLEANUP_ATTEMPTS + 2):  # more temporary refusals than attempts: never stuck for them
        d = agent.directive(task["id"], lease)
        assert d["kind"] == "cleanup" and d["cleanup"]["attempts_spent"] == 0, d
        answer = report(
            agent, task["id"], lease, d["cleanup"]["temp_id"], d["task_version"], {"op_key": d["op_key"], **refused}
        )
        assert answer.status_code == 200, answer.content
        temp = TempResource.objects.get(pk=d["cleanup"]["temp_id"])
        assert temp.status == TempResourceStatus.CLEANING and temp.not_before is not None
        wait = agent.directive(task["id"], lease)
        assert (wait["kind"], wait["reason"]) == ("wait", "cleanup_backoff")
        assert wait["until"] is not None and temp.not_before > clock.now()
        waits.append(temp.not_before - clock.now())
        # The agent waits holding its lease: the client's renewer renews it every ttl/3 meanwhile.
        while clock.now() < temp.not_before:
            seq = Lease.objects.get(pk=lease).renewal_seq
            path = f"/tasks/{task['id']}/lease/renew"
            renewed = agent.call("post", path, {"renewal_seq": seq}, Reckon_Lease=str(lease))
            assert renewed.status_code == 200, renewed.content
            clock.set(min(temp.not_before, clock.now() + timedelta(seconds=10)))
    assert waits[-1] > waits[0], "a remote that stays refused is asked later and later"
    d = agent.directive(task["id"], lease)
    ok = report(agent, task["id"], lease, d["cleanup"]["temp_id"], d["task_version"], deleted(d["op_key"], "x"))
    assert ok.status_code == 200 and ok.json()["temp_resource"]["status"] == "deleted"
    logged = Event.objects.filter(task_id=task["id"], type="cleanup_rejected")
    assert logged.count() == MAX_CLEANUP_ATTEMPTS + 2
    assert all(e.payload["data"]["attempt_spent"] is False and e.payload["data"]["not_before"] for e in logged)


def test_definite_refusals_spend_the_attempts_and_leave_the_temp_resource_to_a_person(agent: Agent) -> None:
    task, lease = ended_with_temps(agent, {"a": ["tgt/tmp/batch-1"]})
    refused = {"result": "failed", "failure_class": "permission_revoked", "detail": "HTTP 403"}
    for spent in range(MAX_CLEANUP_ATTEMPTS):
        d = agent.directive(task["id"], lease)
        assert d["kind"] == "cleanup" and d["cleanup"]["attempts_spent"] == spent
        answer = report(
            agent, task["id"], lease, d["cleanup"]["temp_id"], d["task_version"], {"op_key": d["op_key"], **refused}
        )
        assert answer.status_code == 200 and answer.json()["temp_resource"]["attempts_spent"] == spent + 1
    assert agent.directive(task["id"], lease)["kind"] == "done"
    temp = TempResource.objects.get(task_id=task["id"])
    assert temp.status == TempResourceStatus.STUCK
    assert Event.objects.filter(task_id=task["id"], type="cleanup_needs_person").count() == 1
    assert find_problems(Task.objects.get(pk=task["id"])) == []


def test_a_fenced_delete_is_a_definite_refusal_the_temp_resource_stays_and_the_next_try_has_a_new_op_key(
    agent: Agent,
) -> None:
    """A delete the remote fenced never took effect and never will: the staging object is still there, so the temp
    resource is not deleted; it spends an attempt, and the next try is a new delete under a new op key."""
    task, lease = ended_with_temps(agent, {"a": ["tgt/tmp/batch-1"]})
    d = agent.directive(task["id"], lease)
    answer = report(
        agent,
        task["id"],
        lease,
        d["cleanup"]["temp_id"],
        d["task_version"],
        {"op_key": d["op_key"], "result": "fenced"},
    )
    assert answer.status_code == 200 and answer.json()["temp_resource"]["attempts_spent"] == 1
    temp = TempResource.objects.get(task_id=task["id"])
    assert temp.status != TempResourceStatus.DELETED and temp.cleanup_receipt_id is None
    assert Event.objects.filter(task_id=task["id"], type="cleanup_fenced").count() == 1
    again = agent.directive(task["id"], lease)
    assert again["kind"] == "cleanup" and again["op_key"] != d["op_key"]
    assert find_problems(Task.objects.get(pk=task["id"])) == []


def test_a_report_that_breaks_a_rule_is_refused_by_name_and_writes_nothing(
    agent: Agent, issue: Callable[..., str], client: Client
) -> None:
    task, lease = ended_with_temps(agent, {"a": ["tgt/tmp/batch-1"], "b": ["tgt/tmp/batch-2"]})
    other, other_lease = ended_with_temps(agent, {"a": ["tgt/tmp/other"]})
    d = agent.directive(task["id"], lease)
    agent.directive(other["id"], other_lease)
    temp_id, op_key, v = d["cleanup"]["temp_id"], d["op_key"], d["task_version"]
    second = TempResource.objects.get(task_id=task["id"], locator="tgt/tmp/batch-2")
    foreign = TempResource.objects.get(task_id=other["id"])
    outsider = Agent(client, issue(kinds=("elsewhere",), agent="agent-9"))
    cases = [
        (
            "another temp resource's op key",
            report(agent, task["id"], lease, second.pk, v, deleted(op_key, "x")),
            409,
            "invalid_transition",
        ),
        (
            "a key of no temp resource",
            report(agent, task["id"], lease, temp_id, v, deleted("rk-made-up", "x")),
            409,
            "invalid_transition",
        ),
        (
            "no such temp resource",
            report(agent, task["id"], lease, 999_999, v, deleted(op_key, "x")),
            404,
            "temp_resource_not_found",
        ),
        (
            "another task's temp resource",
            report(agent, task["id"], lease, foreign.pk, v, deleted(op_key, "x")),
            404,
            "temp_resource_not_found",
        ),
        (
            "a stale version",
            report(agent, task["id"], lease, temp_id, v - 1, deleted(op_key, "x")),
            412,
            "version_conflict",
        ),
        (
            "out of the token's scope (answered before the lease is read)",
            report(outsider, task["id"], lease, temp_id, v, deleted(op_key, "x")),
            404,
            "task_not_found",
        ),
        (
            "another task's lease",
            report(agent, task["id"], other_lease, temp_id, v, deleted(op_key, "x")),
            409,
            "lease_not_held",
        ),
        (
            "a committed without remote id",
            report(agent, task["id"], lease, temp_id, v, {"op_key": op_key, "result": "committed"}),
            422,
            "validation_error",
        ),
        ("no op key", report(agent, task["id"], lease, temp_id, v, {"result": "not_found"}), 422, "validation_error"),
    ]
    before = snapshot()
    for why, response, status, code in cases:
        assert response.status_code == status, (why, response.content)
        problem_of(response, status, code)
    assert snapshot() == before
    no_match = agent.call(
        "post", f"/tasks/{task['id']}/temp-resources/{temp_id}/cleanup", deleted(op_key, "x"), Reckon_Lease=str(lease)
    )
    problem_of(no_match, 428, "precondition_required")
    assert snapshot() == before
    # The same report, keyed, twice: one change, the second answer replayed.
    first = report(agent, task["id"], lease, temp_id, v, deleted(op_key, "x"), Idempotency_Key="del-1")
    replay = report(agent, task["id"], lease, temp_id, v, deleted(op_key, "x"), Idempotency_Key="del-1")
    assert first.status_code == replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert first.json() == replay.json()
    assert Event.objects.filter(task_id=task["id"], type="cleanup_committed").count() == 1
    # Settled: the same op key again (unkeyed) is refused, and the deleted resource stays deleted.
    after = snapshot()
    late = report(agent, task["id"], lease, temp_id, version_of_task(task["id"]), deleted(op_key, "x"))
    problem_of(late, 409, "invalid_transition")
    assert snapshot() == after


def version_of_task(task_id: int) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task_id)


def test_a_running_task_s_directive_never_asks_for_cleanup(agent: Agent) -> None:
    task = created(agent, plan=chain_plan("a", "b"))
    lease = agent.acquire(task["id"])["lease_id"]
    d = agent.directive(task["id"], lease)
    op = agent.start(task["id"], lease, "a", d["task_version"]).json()
    receipt = {"result": "committed", "remote_id": "r-a", "data": {"temp": ["tgt/tmp/batch-1"]}}
    agent.report(task["id"], lease, op["op_key"], d["task_version"] + 1, receipt)
    d = agent.directive(task["id"], lease)
    assert (d["kind"], d["node_key"], d["cleanup"]) == ("execute", "b", None)
    temp = TempResource.objects.get(task_id=task["id"])
    before = snapshot()
    early = report(agent, task["id"], lease, temp.pk, d["task_version"], deleted("rk-x", temp.locator))
    problem_of(early, 409, "invalid_transition")  # no delete is in flight for it: the task may still need it
    assert snapshot() == before and temp.status == TempResourceStatus.ACTIVE
