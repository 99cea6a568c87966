"""Scope first (issue 25): every route of the agent API that names a task answers a token outside that task's scope
exactly as it answers a task that does not exist — the same status, headers and bytes — and writes nothing; and an
``Idempotency-Key``'s stored answer is replayed to the token that made it and to no other.

The routes are not listed by hand: they are read from the API's OpenAPI document and checked against Django's
resolver, so a route added later is walked by the same test. The tokens that try to get past the rule are the
strongest there are: another token of the *same agent* (the lease's holder id matches), sending the lease, the
If-Match and the Idempotency-Key the in-scope token used."""

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from api.api import api
from api.models import IdempotencyRecord
from api.tokens import api_token_issue
from audit.principals import Principal
from leases.models import Lease
from tasks.models import Task
from tests.conftest import chain_plan, person, snapshot
from tests.test_api_steps import Agent

pytestmark = pytest.mark.django_db

KIND = "copy"
AGENT = "agent-7"
PREFIX = "/api/v1"
KEY = "walk-1"
WRITES = ("post", "put", "patch", "delete")


def _operations() -> list[tuple[str, str]]:
    """(method, path template) of every operation of the API's OpenAPI document."""
    document = api.get_openapi_schema(path_prefix=PREFIX)
    return sorted(
        (method, path)
        for path, operations in document["paths"].items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    )


OPERATIONS = _operations()
TASK_ROUTES = [op for op in OPERATIONS if "{task_id}" in op[1]]
# The routes that name no task, each under a rule of its own (tested below, or where named): a create's kind or
# project must be in the scope (403), a list holds only the scope's tasks, a webhook subscription is its agent's. A
# new route that names no task must be added here, with its rule, before this file passes.
NOT_TASK_ADDRESSED = {
    ("post", "/api/v1/tasks"),
    ("get", "/api/v1/tasks"),
    ("post", "/api/v1/webhooks"),
    ("get", "/api/v1/webhooks"),
    ("delete", "/api/v1/webhooks/{subscription_id}"),
    # A kind outside the scope answers as one no task can be of: tests/test_plan_contract.py.
    ("get", "/api/v1/kinds/{kind}/actions"),
}


def test_the_walk_covers_every_route_of_the_resolver() -> None:
    """Every URL pattern of /api/v1/ is an operation of the document (walked below) or one of the few views that
    are not operations (the document itself, its page, the root and the catch-all not-found)."""
    resolver = get_resolver().url_patterns
    (api_include,) = [p for p in resolver if isinstance(p, URLResolver) and p.namespace == "api-v1"]
    routed = set()
    for pattern in api_include.url_patterns:
        assert isinstance(pattern, URLPattern)
        if pattern.name in ("openapi-json", "openapi-view", "api-root") or pattern.name is None:
            continue
        routed.add(PREFIX + "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern)))
    assert routed == {path for _, path in OPERATIONS}
    assert {op for op in OPERATIONS if "{task_id}" not in op[1]} == NOT_TASK_ADDRESSED
    assert len(TASK_ROUTES) >= 14, TASK_ROUTES


# --- the world: one task of the in-scope token, with a lease, an operation, a proposed plan, a retained object -----


@pytest.fixture(autouse=True)
def data(settings: Any, tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    settings.DATA_DIR = folder
    settings.RECKON_RETENTION_KEY = base64.b64encode(bytes(range(32))).decode()
    return folder


class World:
    def __init__(self, client: Client, admin: Principal) -> None:
        def token(*kinds: str) -> Agent:
            agent = Agent(client, api_token_issue(actor=admin, agent_id=AGENT, kinds=kinds, projects=[])[1], prefix="")
            assert agent.call("get", PREFIX + "/tasks").status_code == 200  # its last-use hint: out of the snapshots
            return agent

        self.inside = token(KIND)
        # The same agent, another token, scoped to other kinds: the task is not its to see.
        self.outside = token("elsewhere")
        created = self.inside.call(
            "post", PREFIX + "/tasks", {"kind": KIND, "title": "walk", "plan": chain_plan("a", "b")}
        )
        assert created.status_code == 201, created.content
        self.task_id: int = created.json()["id"]
        base = f"{PREFIX}/tasks/{self.task_id}"
        lease = self.inside.call("post", base + "/lease", {})
        assert lease.status_code == 201, lease.content
        self.lease_id: int = lease.json()["lease_id"]
        retained = self.inside.call(
            "post", base + "/retained", {"kind": "sensitive_input", "name": "ctx", "content": "aGk="}
        )
        assert retained.status_code == 201, retained.content
        self.retained = retained.json()
        version = Task.objects.get(pk=self.task_id).version
        proposed = self.inside.call(
            "post", base + "/plans", {"plan": chain_plan("a", "b", "c")}, **self.headers(version)
        )
        assert proposed.status_code == 201, proposed.content
        self.revision: int = proposed.json()["revision"]
        version = Task.objects.get(pk=self.task_id).version
        started = self.inside.call("post", base + "/operations", {"node_key": "a"}, **self.headers(version))
        assert started.status_code == 201, started.content
        self.op_key: str = started.json()["op_key"]
        self.version = Task.objects.get(pk=self.task_id).version
        # A task id that is no task's, as many digits long as the real one (so the answers are the same length).
        self.missing = int("9" * len(str(self.task_id)))
        while Task.objects.filter(pk=self.missing).exists():  # PostgreSQL's sequences outlive a test's rows
            self.missing -= 1
        assert len(str(self.missing)) == len(str(self.task_id))

    def headers(self, version: int) -> dict[str, str]:
        return {"Reckon_Lease": str(self.lease_id), "If_Match": f'"{version}"'}

    def path(self, template: str, task_id: int | str) -> str:
        values = {
            "task_id": str(task_id),
            "op_key": self.op_key,
            "node_key": "a",
            "revision": str(self.revision),
            "retained_id": str(self.retained["retained"]),
            "version": str(self.retained["version"]),
        }
        # A parameter this file does not know (a route added later): any value — the scope is checked before it.
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "1"), template)


@pytest.fixture
def world(client: Client) -> World:
    return World(client, person("root", "admin"))


# What each route is sent: a body it would take from the in-scope token (a route added later gets {}).
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/api/v1/tasks/{task_id}/cancel"): {"reason": "walking the routes"},
    ("post", "/api/v1/tasks/{task_id}/lease"): {},
    ("post", "/api/v1/tasks/{task_id}/lease/renew"): {"renewal_seq": 0},
    ("post", "/api/v1/tasks/{task_id}/plans"): {"plan": chain_plan("a", "b", "d")},
    ("post", "/api/v1/tasks/{task_id}/operations"): {"node_key": "a"},
    ("post", "/api/v1/tasks/{task_id}/operations/{op_key}/outcome"): {"result": "committed", "remote_id": "r-1"},
    ("post", "/api/v1/tasks/{task_id}/temp-resources/{temp_id}/cleanup"): {"op_key": "x", "result": "not_found"},
    ("post", "/api/v1/tasks/{task_id}/inputs"): {"current_versions": {}},
    ("post", "/api/v1/tasks/{task_id}/retained"): {"kind": "sensitive_input", "name": "ctx", "content": "aGk="},
}


def _answer(response: Any) -> tuple[int, dict[str, str], bytes]:
    return response.status_code, dict(response.headers), response.content


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _as_if_for(answer: tuple[int, dict[str, str], bytes], missing_path: str, path: str, world: World) -> Any:
    """The not-found answer for the missing task, with its id put back as the real task's: what a token that may
    not see the real task must get for it, byte for byte."""
    status, headers, body = answer
    body = body.replace(missing_path.encode(), path.encode())
    body = body.replace(
        f"task {world.missing} does not exist".encode(), f"task {world.task_id} does not exist".encode()
    )
    return status, headers, body


@pytest.mark.parametrize(("method", "template"), TASK_ROUTES, ids=[f"{m} {p}" for m, p in TASK_ROUTES])
def test_a_token_out_of_scope_gets_the_not_found_answer_and_writes_nothing(
    world: World, data: Path, method: str, template: str
) -> None:
    body = BODIES.get((method, template), {} if method in WRITES else None)
    path, missing_path = world.path(template, world.task_id), world.path(template, world.missing)
    headers = {**world.headers(world.version), "Idempotency_Key": KEY}

    # The in-scope token first, with the key: whatever it gets is past the scope (and a 2xx is stored for the key).
    inside = world.inside.call(method, path, body, **headers)
    assert inside.status_code < 500, inside.content
    assert not (inside.status_code == 404 and inside.json()["code"] == "task_not_found"), inside.content

    before, files = snapshot(), _files(data)
    # The other token of the same agent, with the same lease, version, key and body; and both tokens on a task
    # that does not exist.
    outside = _answer(world.outside.call(method, path, body, **headers))
    missing_outside = _answer(world.outside.call(method, missing_path, body, **headers))
    missing_inside = _answer(world.inside.call(method, missing_path, body, **headers))
    assert snapshot() == before and _files(data) == files  # nothing written, not even a file

    assert missing_inside == missing_outside
    status, _, content = missing_inside
    problem = json.loads(content)
    assert (status, problem["code"], problem["type"]) == (
        404,
        "task_not_found",
        "https://reckon.dev/problems/task_not_found",
    )
    assert outside == _as_if_for(missing_inside, missing_path, path, world)
    assert "Idempotent-Replayed" not in outside[1] and "ETag" not in outside[1]


@pytest.mark.parametrize(("method", "template"), TASK_ROUTES, ids=[f"{m} {p}" for m, p in TASK_ROUTES])
def test_a_task_id_no_task_can_have_is_not_found_for_every_token(world: World, method: str, template: str) -> None:
    """The largest id a column holds, 0, a negative one, past any column's range (the guard's not_found), or not a
    number: one answer for every token, never a 5xx."""
    body = BODIES.get((method, template), {} if method in WRITES else None)
    before = snapshot()
    for beyond in ("9" * 30, "-" + "4" * 26):  # the fuzzer's negative id past bigint reached lease_acquire: a 500
        past = _answer(world.inside.call(method, world.path(template, beyond), body))
        assert past == _answer(world.outside.call(method, world.path(template, beyond), body))
        assert past[0] == 404 and json.loads(past[2])["code"] == "not_found", past
    for raw in (str(2**63 - 1), "0", "-58339300850", "-1"):  # the fuzzer's negative id reached lease_acquire: a 500
        path = world.path(template, raw)
        answers = [
            _answer(t.call(method, path, body, **world.headers(world.version))) for t in (world.inside, world.outside)
        ]
        assert answers[0] == answers[1]
        assert answers[0][0] == 404 and json.loads(answers[0][2])["code"] == "task_not_found", answers[0]
    not_a_number = world.path(template, "x1")
    answers = [_answer(t.call(method, not_a_number, body)) for t in (world.inside, world.outside)]
    assert answers[0] == answers[1] and 400 <= answers[0][0] < 500, answers[0]
    assert snapshot() == before


# --- the two findings of the issue, one by one --------------------------------------------------------------------


def test_another_token_of_the_holder_cannot_renew_or_release_a_lease_outside_its_scope(world: World) -> None:
    base = f"{PREFIX}/tasks/{world.task_id}/lease"
    lease = Lease.objects.get(pk=world.lease_id)
    before = snapshot()
    renew = world.outside.call("post", base + "/renew", {"renewal_seq": lease.renewal_seq}, Reckon_Lease=str(lease.pk))
    release = world.outside.call("delete", base, Reckon_Lease=str(lease.pk))
    for response in (renew, release):
        assert response.status_code == 404 and response.json()["code"] == "task_not_found", response.content
    assert snapshot() == before
    assert Lease.objects.get(pk=lease.pk).released_at is None  # still the in-scope token's to renew and release
    assert (
        world.inside.call(
            "post", base + "/renew", {"renewal_seq": lease.renewal_seq}, Reckon_Lease=str(lease.pk)
        ).status_code
        == 200
    )
    assert world.inside.call("delete", base, Reckon_Lease=str(lease.pk)).status_code == 204


def test_a_replay_goes_to_the_token_that_made_the_answer_and_to_no_other(world: World, client: Client) -> None:
    base = f"{PREFIX}/tasks/{world.task_id}/lease"
    assert world.inside.call("delete", base, Reckon_Lease=str(world.lease_id)).status_code == 204
    first = world.inside.call("post", base, {}, Idempotency_Key="lease-1")
    assert first.status_code == 201
    # Out of scope: the answer for a missing task, not the stored lease; nothing written.
    before = snapshot()
    stolen = world.outside.call("post", base, {}, Idempotency_Key="lease-1")
    assert stolen.status_code == 404 and stolen.json()["code"] == "task_not_found"
    assert "lease_id" not in stolen.json() and "Idempotent-Replayed" not in stolen
    assert snapshot() == before
    # A second in-scope token of the same agent: the key is one it has not used. Its request runs as a new one
    # (here refused: the agent already holds the lease) and it is never handed the stored answer.
    admin = person("root2", "admin")
    twin = Agent(client, api_token_issue(actor=admin, agent_id=AGENT, kinds=[KIND], projects=[])[1], prefix="")
    assert twin.call("get", PREFIX + "/tasks").status_code == 200
    records = list(IdempotencyRecord.objects.values_list("token_id", "key", "body"))
    answered = twin.call("post", base, {}, Idempotency_Key="lease-1")
    assert "Idempotent-Replayed" not in answered and answered.content != first.content
    assert answered.status_code >= 400 and answered.status_code < 500, answered.content
    assert list(IdempotencyRecord.objects.values_list("token_id", "key", "body")) == records  # a refusal stores nothing
    # The token that made it still gets it.
    again = world.inside.call("post", base, {}, Idempotency_Key="lease-1")
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content


def test_a_second_token_with_the_same_key_makes_its_own_change_and_gets_its_own_answer(
    world: World, client: Client
) -> None:
    twin = Agent(
        client, api_token_issue(actor=person("root2", "admin"), agent_id=AGENT, kinds=[KIND], projects=[])[1], prefix=""
    )
    body = {"kind": KIND, "title": "keyed", "plan": chain_plan("a")}
    first = world.inside.call("post", PREFIX + "/tasks", body, Idempotency_Key="create-1")
    second = twin.call("post", PREFIX + "/tasks", body, Idempotency_Key="create-1")
    assert first.status_code == second.status_code == 201
    assert "Idempotent-Replayed" not in second and second.json()["id"] != first.json()["id"]
    assert IdempotencyRecord.objects.filter(key="create-1").count() == 2
    for agent, answer in ((world.inside, first), (twin, second)):
        replay = agent.call("post", PREFIX + "/tasks", body, Idempotency_Key="create-1")
        assert replay["Idempotent-Replayed"] == "true" and replay.content == answer.content


def test_a_webhook_secret_is_replayed_to_its_own_token_only(world: World, client: Client) -> None:
    twin = Agent(
        client, api_token_issue(actor=person("root2", "admin"), agent_id=AGENT, kinds=[KIND], projects=[])[1], prefix=""
    )
    body = {"url": "https://agent.example/hook", "events": ["task_finished"]}
    first = world.inside.call("post", PREFIX + "/webhooks", body, Idempotency_Key="hook-1")
    assert first.status_code == 201, first.content
    other = twin.call("post", PREFIX + "/webhooks", body, Idempotency_Key="hook-1")
    assert other.status_code == 201 and "Idempotent-Replayed" not in other
    assert other.json()["secret"] != first.json()["secret"] and other.json()["id"] != first.json()["id"]


# --- the routes that name no task: each its own rule ---------------------------------------------------------------


def test_the_routes_without_a_task_keep_to_the_scope(world: World) -> None:
    listed = world.outside.call("get", PREFIX + "/tasks").json()["items"]
    assert world.task_id not in [t["id"] for t in listed]
    before = snapshot()
    body = {"kind": KIND, "title": "not mine", "plan": chain_plan("a")}
    refused = world.outside.call("post", PREFIX + "/tasks", body, Idempotency_Key="create-1")
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert snapshot() == before


@pytest.fixture(autouse=True)
def _no_rate_limit(settings: Any) -> Iterator[None]:
    settings.RECKON_API_RATE = 0
    yield


# --- the migration that binds the records of before ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_binds_each_record_to_its_agents_only_token_and_forgets_the_ambiguous() -> None:
    """api 0004: a record of an agent with one token is that token's; an agent with several cannot say which made
    it, so its records are forgotten (never replayed to the wrong token)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    before, after = [("api", "0003_token_changes_captured")], [("api", "0004_idempotency_bound_to_token")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        apps = executor.loader.project_state(before).apps
        token_model, record_model = apps.get_model("api", "ApiToken"), apps.get_model("api", "IdempotencyRecord")
        now = timezone.now()

        def token(agent: str, n: int) -> Any:
            return token_model.objects.create(agent_id=agent, token_hash=f"{agent}-{n}", created_by="t", created_at=now)

        only = token("solo", 1)
        for n in (1, 2):
            token("pair", n)
        for agent in ("solo", "pair"):
            record_model.objects.create(
                agent_id=agent, key="k", fingerprint="f", status=201, body="{}", headers={}, created_at=now
            )
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        assert list(IdempotencyRecord.objects.values_list("agent_id", "token_id")) == [("solo", only.pk)]
    finally:
        MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
