"""The step protocol over HTTP (/api/v1/): create, lease, directive, intent, outcome, cancel, re-plan. Each test
drives the API as an agent would and tries to get past a rule — a stale If-Match, a replayed or reused
Idempotency-Key, another agent's lease, a revoked token, an expired lease, a person's takeover, a secret in a
receipt, a body too large or not JSON — and checks the database: a refusal changes nothing."""

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings

from api.errors import CONTENT_TYPE
from api.models import IdempotencyRecord
from api.tokens import api_token_issue, api_token_revoke
from audit.models import AuditEvent
from audit.principals import Principal
from leases.models import Lease
from tasks.access.permissions import permission_grant
from tasks.models import Event, Operation, Task
from tasks.people.takeover import takeover_claim
from tests.conftest import EFFECT, chain_plan, person, snapshot
from tests.steps import past_deadline

pytestmark = pytest.mark.django_db

KIND = "copy"


@pytest.fixture
def admin() -> Principal:
    return person("root", "admin")


@pytest.fixture
def issue(admin: Principal) -> Callable[..., str]:
    def make(kinds: tuple[str, ...] = (KIND,), projects: tuple[str, ...] = (), agent: str = "agent-7") -> str:
        return api_token_issue(actor=admin, agent_id=agent, kinds=kinds, projects=projects)[1]

    return make


class Agent:
    """An agent's HTTP calls through Django's test client (the live-server tests are tests/test_agent_e2e.py)."""

    def __init__(self, client: Client, token: str, prefix: str = "/api/v1") -> None:
        self.client, self.token, self.prefix = client, token, prefix  # prefix "": paths given whole

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        extra = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"}
        extra.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()})
        data = json.dumps(body) if body is not None else None
        return getattr(self.client, method)(self.prefix + path, data=data, content_type="application/json", **extra)

    def create(self, plan: dict[str, Any] | None = None, **fields: Any) -> Any:
        body = {"kind": KIND, "title": "copy a project", "plan": plan or chain_plan("a", "b"), **fields}
        return self.call("post", "/tasks", body)

    def acquire(self, task_id: int, **body: Any) -> dict[str, Any]:
        response = self.call("post", f"/tasks/{task_id}/lease", body)
        assert response.status_code == 201, response.content
        lease: dict[str, Any] = response.json()
        return lease

    def directive(self, task_id: int, lease_id: int) -> dict[str, Any]:
        response = self.call("get", f"/tasks/{task_id}/directive", Reckon_Lease=str(lease_id))
        assert response.status_code == 200, response.content
        assert response["ETag"] == f'"{response.json()["task_version"]}"'
        body: dict[str, Any] = response.json()
        return body

    def start(self, task_id: int, lease_id: int, node_key: str, version: int, **headers: str) -> Any:
        return self.call(
            "post",
            f"/tasks/{task_id}/operations",
            {"node_key": node_key},
            Reckon_Lease=str(lease_id),
            If_Match=f'"{version}"',
            **headers,
        )

    def report(self, task_id: int, lease_id: int, op_key: str, version: int, outcome: dict[str, Any]) -> Any:
        return self.call(
            "post",
            f"/tasks/{task_id}/operations/{op_key}/outcome",
            outcome,
            Reckon_Lease=str(lease_id),
            If_Match=f'"{version}"',
        )


@pytest.fixture
def agent(client: Client, issue: Callable[..., str]) -> Agent:
    return Agent(client, issue())


def problem_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == CONTENT_TYPE
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["type"].endswith("/" + code), body
    return body


def created(agent: Agent, **fields: Any) -> dict[str, Any]:
    response = agent.create(**fields)
    assert response.status_code == 201, response.content
    body: dict[str, Any] = response.json()
    return body


def version_of(task_id: int) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task_id)


# --- the whole protocol ---------------------------------------------------------------------------------------------


def test_an_agent_runs_a_task_to_completion_over_http_and_is_named_as_the_principal(agent: Agent) -> None:
    task = created(agent)
    assert task["status"] == "pending" and [n["key"] for n in task["nodes"]] == ["a", "b"]
    assert Task.objects.get(pk=task["id"]).created_by == "agent:agent-7"
    lease = agent.acquire(task["id"])
    assert lease["holder"] == "agent:agent-7" and lease["epoch"] == 1
    assert not lease["cancel_requested"] and not lease["takeover_requested"]
    for key in ("a", "b"):
        d = agent.directive(task["id"], lease["lease_id"])
        assert (d["kind"], d["node_key"], d["op_key"]) == ("execute", key, "")
        started = agent.start(task["id"], lease["lease_id"], key, d["task_version"])
        assert started.status_code == 201, started.content
        op = started.json()
        assert op["status"] == "dispatched" and op["node"] == key and op["purpose"] == "effect"
        assert started["ETag"] == f'"{d["task_version"] + 1}"'
        # The intent is in the database before the agent calls the external system.
        assert Operation.objects.get(op_key=op["op_key"]).status == "dispatched"
        logged = Event.objects.filter(task_id=task["id"], type="operation_dispatched").latest("seq")
        assert logged.payload["data"]["by"] == "agent:agent-7"  # the event names the agent that wrote it
        settled = agent.report(
            task["id"],
            lease["lease_id"],
            op["op_key"],
            d["task_version"] + 1,
            {"result": "committed", "remote_id": f"r-{key}"},
        )
        assert settled.status_code == 200, settled.content
        assert settled.json()["operation"]["status"] == "committed"
        assert settled["ETag"] == f'"{version_of(task["id"])}"'
    assert agent.directive(task["id"], lease["lease_id"])["kind"] == "done"
    assert Task.objects.get(pk=task["id"]).status == "completed"
    assert agent.call("delete", f"/tasks/{task['id']}/lease", Reckon_Lease=str(lease["lease_id"])).status_code == 204
    assert Lease.objects.get(pk=lease["lease_id"]).released_at is not None


def test_an_agent_that_restarts_reconciles_its_open_operation_before_anything_new(agent: Agent, clock: Any) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"], ttl_seconds=5)
    d = agent.directive(task["id"], lease["lease_id"])
    op = agent.start(task["id"], lease["lease_id"], "a", d["task_version"]).json()
    # The process dies here (no outcome, no release); its lease lapses past its grace; a new process takes the task.
    clock.advance(timedelta(minutes=5))
    second = agent.acquire(task["id"])
    assert second["epoch"] == 2
    d = agent.directive(task["id"], second["lease_id"])
    assert (d["kind"], d["op_key"], d["reason"]) == ("reconcile", op["op_key"], "dispatched")
    assert d["operation"]["request"] == op["request"] and d["operation"]["action"] == EFFECT
    # The old lease can write nothing any more.
    stale = agent.report(task["id"], lease["lease_id"], op["op_key"], d["task_version"], {"result": "not_found"})
    assert stale.status_code == 409 and stale.json()["code"] in ("lease_lost", "lease_expired")
    found = agent.report(
        task["id"], second["lease_id"], op["op_key"], d["task_version"], {"result": "committed", "remote_id": "r"}
    )
    assert found.status_code == 200, found.content
    assert agent.directive(task["id"], second["lease_id"])["node_key"] == "b"


def test_after_a_cancel_the_directive_says_fence_and_only_a_final_answer_closes_the_operation(
    agent: Agent, clock: Any
) -> None:
    """docs/api.md, a final not found: the intent carries its deadline; once a cancel is recorded, the reconcile
    says fence; a not found before the deadline leaves the operation unknown and the directive waits until it is
    final; a fenced answer closes it as cancelled at once."""
    task = created(agent, plan=chain_plan("a"))
    lease = agent.acquire(task["id"], ttl_seconds=300)["lease_id"]
    d = agent.directive(task["id"], lease)
    started = agent.start(task["id"], lease, "a", d["task_version"])
    op = started.json()
    sent = Operation.objects.get(op_key=op["op_key"])
    assert sent.not_after is not None and op["not_after"] == sent.not_after.isoformat().replace("+00:00", "Z")
    lost = {"result": "failed", "failure_class": "connection_interrupted"}
    assert agent.report(task["id"], lease, op["op_key"], version_of(task["id"]), lost).status_code == 200
    assert agent.directive(task["id"], lease)["fence"] is False  # no cancel: a lookup is enough
    assert agent.call("post", f"/tasks/{task['id']}/cancel", {"reason": "withdrawn"}).status_code == 200
    d = agent.directive(task["id"], lease)
    assert (d["kind"], d["op_key"], d["fence"]) == ("reconcile", op["op_key"], True)

    early = agent.report(task["id"], lease, op["op_key"], version_of(task["id"]), {"result": "not_found"})
    assert early.status_code == 200, early.content
    assert (early.json()["operation"]["status"], early.json()["task"]["status"]) == ("unknown", "stopped_pending")
    d = agent.directive(task["id"], lease)
    assert (d["kind"], d["op_key"], d["reason"]) == ("wait", op["op_key"], "not_found_not_final")

    # A not found echoing a directive read before the deadline stays not final, even written after it.
    before = d["asked_at"]
    past_deadline(clock, sent)
    stale = {"result": "not_found", "asked_at": before}
    assert agent.report(task["id"], lease, op["op_key"], version_of(task["id"]), stale).json()["task"]["status"] == (
        "stopped_pending"
    )
    fenced = agent.report(task["id"], lease, op["op_key"], version_of(task["id"]), {"result": "fenced"})
    assert fenced.status_code == 200, fenced.content
    assert (fenced.json()["operation"]["status"], fenced.json()["task"]["status"]) == ("rejected", "stopped")
    assert Operation.objects.get(pk=sent.pk).failure_class == "cancelled"


# --- compare-and-set ------------------------------------------------------------------------------------------------


def test_a_stale_if_match_is_412_with_the_current_version_and_changes_nothing(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    before = snapshot()
    response = agent.start(task["id"], lease["lease_id"], "a", v - 1)
    body = problem_of(response, 412, "version_conflict")
    assert body["current_version"] == v and response["ETag"] == f'"{v}"'
    assert snapshot() == before


def test_a_write_without_if_match_or_lease_is_428_and_changes_nothing(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    before = snapshot()
    no_version = agent.call(
        "post", f"/tasks/{task['id']}/operations", {"node_key": "a"}, Reckon_Lease=str(lease["lease_id"])
    )
    problem_of(no_version, 428, "precondition_required")
    no_lease = agent.call("post", f"/tasks/{task['id']}/operations", {"node_key": "a"}, If_Match='"2"')
    problem_of(no_lease, 428, "precondition_required")
    garbage = agent.call(
        "post", f"/tasks/{task['id']}/operations", {"node_key": "a"}, Reckon_Lease="x; drop", If_Match='"2"'
    )
    problem_of(garbage, 400, "invalid_header")
    assert snapshot() == before


# --- leases ---------------------------------------------------------------------------------------------------------


def test_a_lease_held_by_another_agent_is_409_and_its_id_is_useless_to_anyone_else(
    agent: Agent, client: Client, issue: Callable[..., str]
) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    other = Agent(client, issue(agent="agent-8"))
    problem_of(other.call("post", f"/tasks/{task['id']}/lease", {}), 409, "lease_held")
    v = version_of(task["id"])
    before = snapshot()
    # agent-8 presents agent-7's lease id: refused before any write.
    problem_of(other.start(task["id"], lease["lease_id"], "a", v), 409, "lease_not_held")
    problem_of(
        other.call("delete", f"/tasks/{task['id']}/lease", Reckon_Lease=str(lease["lease_id"])), 409, "lease_not_held"
    )
    assert snapshot() == before


def test_renewals_go_in_order_and_say_cancel_requested(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    path = f"/tasks/{task['id']}/lease/renew"
    renewed = agent.call("post", path, {"renewal_seq": lease["renewal_seq"]}, Reckon_Lease=str(lease["lease_id"]))
    assert renewed.status_code == 200 and renewed.json()["renewal_seq"] == lease["renewal_seq"] + 1
    before = snapshot()
    replayed = agent.call("post", path, {"renewal_seq": lease["renewal_seq"]}, Reckon_Lease=str(lease["lease_id"]))
    problem_of(replayed, 409, "renewal_out_of_order")
    assert snapshot() == before
    cancelled = agent.call("post", f"/tasks/{task['id']}/cancel", {"reason": "the project was withdrawn"})
    assert cancelled.status_code == 200 and cancelled.json()["cancel_requested"]
    answer = agent.call("post", path, {"renewal_seq": lease["renewal_seq"] + 1}, Reckon_Lease=str(lease["lease_id"]))
    assert answer.json()["cancel_requested"] is True
    d = agent.directive(task["id"], lease["lease_id"])
    assert d["kind"] == "stop"  # nothing was in flight: stopped at once


def test_an_expired_lease_writes_nothing(agent: Agent, clock: Any) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"], ttl_seconds=5)
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    clock.advance(timedelta(minutes=1))
    before = snapshot()
    response = agent.start(task["id"], lease["lease_id"], "a", v)
    assert response.status_code == 409 and response.json()["code"] in ("lease_expired", "lease_lost")
    assert snapshot() == before


def test_a_person_taking_the_task_over_is_423_for_the_agent(agent: Agent, admin: Principal) -> None:
    task = created(agent)
    operator = person("olga", "operator")
    permission_grant(actor=admin, user=operator.user, task=Task.objects.get(pk=task["id"]))
    assert takeover_claim(actor=operator, task_id=task["id"]).granted
    before = snapshot()
    problem_of(agent.call("post", f"/tasks/{task['id']}/lease", {}), 423, "takeover_held")
    assert snapshot() == before


def test_a_takeover_requested_while_the_agent_holds_the_lease_is_said_by_the_renewal(
    agent: Agent, admin: Principal
) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    operator = person("olga", "operator")
    permission_grant(actor=admin, user=operator.user, task=Task.objects.get(pk=task["id"]))
    assert not takeover_claim(actor=operator, task_id=task["id"]).granted  # requested: waits for the agent
    answer = agent.call(
        "post", f"/tasks/{task['id']}/lease/renew", {"renewal_seq": 0}, Reckon_Lease=str(lease["lease_id"])
    ).json()
    assert answer["takeover_requested"] is True
    d = agent.directive(task["id"], lease["lease_id"])
    assert (d["kind"], d["reason"]) == ("stop", "takeover_requested")


# --- idempotency ----------------------------------------------------------------------------------------------------


def test_a_replayed_create_answers_the_first_task_and_makes_no_second(agent: Agent) -> None:
    body = {"kind": KIND, "title": "copy once", "plan": chain_plan("a")}
    first = agent.call("post", "/tasks", body, Idempotency_Key="create-1")
    assert first.status_code == 201
    again = agent.call("post", "/tasks", body, Idempotency_Key="create-1")
    assert again.status_code == 201 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and again["Location"] == first["Location"]
    assert Task.objects.filter(title="copy once").count() == 1
    before = snapshot()
    other = agent.call("post", "/tasks", {**body, "title": "another"}, Idempotency_Key="create-1")
    problem_of(other, 422, "idempotency_key_reused")
    assert snapshot() == before


def test_an_idempotency_key_is_per_token(agent: Agent, client: Client, issue: Callable[..., str]) -> None:
    """Another agent's token, and another token of the same agent, use the key as a new one (tests/test_api_scope.py
    tries the binding on every route)."""
    body = {"kind": KIND, "title": "same key", "plan": chain_plan("a")}
    assert agent.call("post", "/tasks", body, Idempotency_Key="k").status_code == 201
    for other in (Agent(client, issue(agent="agent-8")), Agent(client, issue())):
        response = other.call("post", "/tasks", body, Idempotency_Key="k")
        assert response.status_code == 201 and "Idempotent-Replayed" not in response
    assert Task.objects.filter(title="same key").count() == 3


def test_a_refused_request_stores_no_key_so_a_corrected_retry_succeeds(agent: Agent) -> None:
    bad = {"kind": KIND, "title": "bad plan", "plan": {"nodes": [{"key": "a", "action": "no.such.action"}]}}
    problem_of(agent.call("post", "/tasks", bad, Idempotency_Key="k2"), 422, "plan_invalid")
    assert not IdempotencyRecord.objects.exists() and not Task.objects.filter(title="bad plan").exists()
    good = {**bad, "plan": chain_plan("a")}
    assert agent.call("post", "/tasks", good, Idempotency_Key="k2").status_code == 201


def test_a_replayed_intent_answers_the_same_op_key(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    first = agent.start(task["id"], lease["lease_id"], "a", v, Idempotency_Key="intent-a")
    again = agent.start(task["id"], lease["lease_id"], "a", v, Idempotency_Key="intent-a")
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    assert Operation.objects.filter(task_id=task["id"]).count() == 1


# --- scope, identity ------------------------------------------------------------------------------------------------


def test_out_of_scope_is_404_to_read_or_write_and_403_to_create(
    agent: Agent, client: Client, issue: Callable[..., str]
) -> None:
    task = created(agent)
    stranger = Agent(client, issue(kinds=("other",), agent="agent-9"))
    assert stranger.call("get", "/tasks").status_code == 200
    before = snapshot()
    problem_of(stranger.call("post", f"/tasks/{task['id']}/lease", {}), 404, "task_not_found")
    problem_of(stranger.call("post", f"/tasks/{task['id']}/cancel", {"reason": "not mine"}), 404, "task_not_found")
    problem_of(stranger.create(), 403, "permission_denied")
    assert snapshot() == before


def test_an_agent_cancels_only_what_it_created_or_holds(
    agent: Agent, client: Client, issue: Callable[..., str]
) -> None:
    task = created(agent)
    colleague = Agent(client, issue(agent="agent-8"))  # same scope, another agent
    assert colleague.call("get", f"/tasks/{task['id']}").status_code == 200
    before = snapshot()
    problem_of(colleague.call("post", f"/tasks/{task['id']}/cancel", {"reason": "not mine"}), 403, "permission_denied")
    assert snapshot() == before
    done = agent.call("post", f"/tasks/{task['id']}/cancel", {"reason": "mine to stop"})
    assert done.status_code == 200
    row = AuditEvent.objects.get(action="cancel_requested")
    assert (row.actor_kind, row.actor_id) == ("agent", "agent-7")


def test_a_revoked_token_is_401_at_once(agent: Agent, admin: Principal) -> None:
    task = created(agent)
    from api.models import ApiToken

    api_token_revoke(actor=admin, token_id=ApiToken.objects.get(agent_id="agent-7").pk, reason="leaked in a log")
    before = snapshot()
    problem_of(agent.call("post", f"/tasks/{task['id']}/lease", {}), 401, "unauthenticated")
    assert snapshot() == before


# --- bodies ---------------------------------------------------------------------------------------------------------


def test_a_secret_in_a_receipt_is_refused_and_nothing_is_recorded(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    op = agent.start(task["id"], lease["lease_id"], "a", v).json()
    before = snapshot()
    leaked = {"result": "committed", "remote_id": "r", "data": {"password": "hunter2hunter2"}}
    response = agent.report(task["id"], lease["lease_id"], op["op_key"], v + 1, leaked)
    problem_of(response, 422, "secret_in_payload")
    assert "hunter2" not in response.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize(
    ("outcome", "field"),
    [
        ({"result": "committed"}, ""),
        ({"result": "failed"}, ""),
        ({"result": "accepted", "remote_id": "r", "count": 3}, ""),
        ({"result": "exploded"}, "body.payload.result"),
        ({"result": "failed", "failure_class": "gremlins"}, "body.payload.failure_class"),
    ],
)
def test_an_outcome_that_does_not_hold_together_is_422_with_field_details(
    agent: Agent, outcome: dict[str, Any], field: str
) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    op = agent.start(task["id"], lease["lease_id"], "a", v).json()
    before = snapshot()
    body = problem_of(
        agent.report(task["id"], lease["lease_id"], op["op_key"], v + 1, outcome), 422, "validation_error"
    )
    assert body["errors"] and all(e["message"] for e in body["errors"])
    if field:
        assert any(e["field"] == field for e in body["errors"]), body["errors"]
    assert snapshot() == before


def test_malformed_and_oversized_bodies_are_refused_before_anything_is_read(agent: Agent, client: Client) -> None:
    created(agent)
    before = snapshot()
    auth = {"Authorization": f"Bearer {agent.token}"}
    malformed = client.post("/api/v1/tasks", data="{not json", content_type="application/json", headers=auth)
    problem_of(malformed, 400, "malformed_body")
    huge = {"kind": KIND, "title": "huge", "plan": {"nodes": [], "pad": "x" * 300_000}}
    problem_of(agent.call("post", "/tasks", huge), 413, "payload_too_large")
    assert snapshot() == before


def test_an_unknown_outcome_op_key_is_404(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    problem_of(
        agent.report(task["id"], lease["lease_id"], "nope", v, {"result": "not_found"}), 404, "operation_not_found"
    )


# --- rate -----------------------------------------------------------------------------------------------------------


@override_settings(RECKON_API_RATE=3)
def test_past_its_rate_an_agent_gets_429_with_retry_after(agent: Agent) -> None:
    statuses = [agent.call("get", "/tasks").status_code for _ in range(4)]
    assert statuses[:3] == [200, 200, 200]
    response = agent.call("get", "/tasks")
    problem_of(response, 429, "rate_limited")
    assert 1 <= int(response["Retry-After"]) <= 61


# --- re-plan --------------------------------------------------------------------------------------------------------


def test_an_agent_proposes_and_accepts_a_replan_under_its_lease(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    v = agent.directive(task["id"], lease["lease_id"])["task_version"]
    proposed = agent.call(
        "post",
        f"/tasks/{task['id']}/plans",
        {"plan": chain_plan("a", "b", "c")},
        Reckon_Lease=str(lease["lease_id"]),
        If_Match=str(v),
    )
    assert proposed.status_code == 201, proposed.content
    assert proposed.json()["revision"] == 2 and proposed.json()["task_version"] == v + 1
    accepted = agent.call(
        "post",
        f"/tasks/{task['id']}/plans/2/accept",
        None,
        Reckon_Lease=str(lease["lease_id"]),
        If_Match=str(v + 1),
    )
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["plan_version"] == 2
    assert Event.objects.filter(task_id=task["id"], type="plan_proposed").get().payload["data"]["by"] == "agent:agent-7"


def test_the_recovery_scan_leaves_a_kind_agents_drive_over_the_api_to_its_agent(agent: Agent) -> None:
    """No connector is registered here for the API agent's kind: no worker is woken for it (it would only fail)."""
    from tasks.engine.recovery import tasks_needing_work
    from tasks.engine.registry import known_kinds
    from tasks.jobs import recovery_scan

    task = created(agent)
    assert KIND not in known_kinds()
    assert task["id"] in set(tasks_needing_work().values_list("pk", flat=True))  # it is workable…
    assert recovery_scan(queue="reckon-test-nobody") == 0  # …by its agent, not by a worker


def test_an_idempotency_key_is_kept_a_day_then_forgotten(agent: Agent, clock: Any) -> None:
    from api.idempotency import idempotency_records_expire

    body = {"kind": KIND, "title": "daily", "plan": chain_plan("a")}
    assert agent.call("post", "/tasks", body, Idempotency_Key="day").status_code == 201
    clock.advance(timedelta(hours=23))
    assert idempotency_records_expire() == 0
    assert agent.call("post", "/tasks", body, Idempotency_Key="day")["Idempotent-Replayed"] == "true"
    clock.advance(timedelta(hours=2))
    assert idempotency_records_expire() == 1
    again = agent.call("post", "/tasks", body, Idempotency_Key="day")
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert Task.objects.filter(title="daily").count() == 2


@pytest.mark.parametrize(
    ("where", "call"),
    [
        ("body", lambda a: a.call("post", "/tasks", {"kind": KIND, "title": "t\u0000", "plan": chain_plan("a")})),
        ("body", lambda a: a.call("post", "/tasks", {"kind": KIND, "title": "t", "plan": {"nodes": [], "\u0000": 1}})),
        ("path", lambda a: a.call("get", "/tasks/1%00")),
        ("query", lambda a: a.call("get", "/tasks?after=x%00")),
    ],
)
def test_a_nul_anywhere_is_422_before_any_column_sees_it(agent: Agent, where: str, call: Any) -> None:
    """PostgreSQL refuses NUL in text and jsonb: unrefused, it would be a 500 from the database."""
    created(agent)
    before = snapshot()
    body = problem_of(call(agent), 422, "validation_error")
    assert body["errors"][0]["field"] == where
    assert snapshot() == before


def test_a_renewal_replayed_with_its_key_answers_the_first_and_a_stale_one_says_the_seq(agent: Agent) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])
    path, held = f"/tasks/{task['id']}/lease/renew", str(lease["lease_id"])
    first = agent.call("post", path, {"renewal_seq": 0}, Reckon_Lease=held, Idempotency_Key="renew:0")
    again = agent.call("post", path, {"renewal_seq": 0}, Reckon_Lease=held, Idempotency_Key="renew:0")
    assert first.status_code == again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert Lease.objects.get(pk=lease["lease_id"]).renewal_seq == 1  # renewed once
    stale = problem_of(agent.call("post", path, {"renewal_seq": 0}, Reckon_Lease=held), 409, "renewal_out_of_order")
    assert stale["renewal_seq"] == 1


@pytest.mark.parametrize("budget", [True, "5", 2.5])
def test_a_number_field_takes_a_json_number_only(agent: Agent, budget: Any) -> None:
    """Found by schemathesis: pydantic's lax mode took ``"attempt_budget": true`` as 1."""
    created(agent)
    before = snapshot()
    response = agent.create(attempt_budget=budget)
    body = problem_of(response, 422, "validation_error")
    assert any(e["field"].endswith("attempt_budget") for e in body["errors"])
    assert snapshot() == before


def test_a_budget_past_the_policy_is_refused_as_a_field_of_the_plan(agent: Agent) -> None:
    """tasks/core/budget.py: a plan of one node may state at most 20 attempts; the refusal names the field."""
    created(agent)
    before = snapshot()
    body = problem_of(agent.create(plan=chain_plan("a") | {"attempt_budget": 21}), 422, "plan_invalid")
    assert [e["field"] for e in body["errors"]] == ["plan.attempt_budget"]
    assert "at most 20" in body["errors"][0]["message"]
    assert snapshot() == before
    assert created(agent, plan=chain_plan("a") | {"attempt_budget": 20})["attempt_budget"] == 20


@pytest.mark.parametrize("raw", ["true", "[]", '"x"', "null", "3"])
def test_a_body_that_is_not_a_json_object_is_malformed(agent: Agent, client: Client, raw: str) -> None:
    """Found by schemathesis: a lease acquire with the body ``true`` was granted as if it were ``{}``."""
    task = created(agent)
    before = snapshot()
    body = problem_of(post_raw(agent, client, f"/api/v1/tasks/{task['id']}/lease", raw), 400, "malformed_body")
    assert "not an object: send one JSON object" in body["detail"], body
    assert snapshot() == before


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("[" * 65 + "]" * 65, "nests deeper than 64 levels"),
        ('{"ttl_seconds": NaN}', "not a JSON number"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ("{", "not JSON"),
    ],
)
def test_a_malformed_body_is_refused_naming_why(agent: Agent, client: Client, raw: str, why: str) -> None:
    """The refusal says what was wrong with the body (it said only "Cannot parse request body")."""
    task = created(agent)
    before = snapshot()
    response = post_raw(agent, client, f"/api/v1/tasks/{task['id']}/lease", raw)
    assert why in problem_of(response, 400, "malformed_body")["detail"]
    assert snapshot() == before


def post_raw(agent: Agent, client: Client, path: str, raw: str) -> Any:
    """``raw`` as the body, sent as JSON with ``agent``'s token."""
    headers = {"Authorization": f"Bearer {agent.token}"}
    return client.post(path, data=raw, content_type="application/json", headers=headers)
