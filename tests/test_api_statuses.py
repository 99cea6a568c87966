"""Each operation of the agent API declares the problem statuses it can answer, and only those: the ones its inputs
imply (api.errors.implied_codes: a path, a query, a body, the headers it reads, the token) and the ones its route
says its services refuse with (api.http.documented). These tests hold the declarations to the truth from both sides:

- nothing is declared that the operation's inputs cannot reach (no 412/428 without the header, no 413 or a
  malformed body without a body, no 422 without anything to validate), and every code a description names is a
  code of that status;
- every status the inputs imply is provoked, on every operation of the served document, by a request that differs
  from a good one in that input only.

The statuses only a service's rule reaches (403, 409 lease_held, 410, 423, …: each route's ``refuses``) are provoked
per operation and code in test_api_refusals_declared.py; schemathesis (test_api_schemathesis.py) checks the other
direction on every answer: no status is answered that is not declared."""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import Client

from api.api import api
from api.errors import STATUS_OF, implied_codes
from api.tokens import api_token_issue
from api.urls import MAX_BODY
from leases.services import lease_acquire
from tasks.engine.plans import plan_propose, task_create
from tests.conftest import chain_plan, person

pytestmark = pytest.mark.django_db

AGENT, KIND = "agent-statuses", "copy"

# A body each operation takes (a good request's), by operationId: the provocations change one input of it.
GOOD_BODIES: dict[str, Any] = {
    "api_tasks_task_new": {"kind": KIND, "title": "t", "plan": chain_plan("a")},
    "api_tasks_task_cancel": {"reason": "r"},
    "api_tasks_plan_new": {"plan": chain_plan("a")},
    "api_steps_lease_take": {"ttl_seconds": 60},
    "api_steps_lease_extend": {"renewal_seq": 0},
    "api_steps_operation_register": {"node_key": "a"},
    "api_steps_outcome_report": {"result": "not_found"},
    "api_steps_cleanup_report": {"result": "not_found", "op_key": "k"},
    "api_steps_inputs_report": {"current_versions": {}},
    "api_retained_retained_new": {"kind": "temp_material", "name": "n", "content": "eA=="},
    "hooks_api_webhook_create": {"url": "https://agent.example.com/hooks", "events": ["task_finished"]},
}


# Implied codes provoked elsewhere: a key is recorded only for a success, which the state here does not give every
# operation (test_api_steps.py replays and reuses keys); the rate is provoked after the rest, with a fresh token.
ELSEWHERE = {"idempotency_key_reused": "test_api_steps.py", "rate_limited": "below"}


def document() -> dict[str, Any]:
    served: dict[str, Any] = json.loads(json.dumps(api.get_openapi_schema()))
    return served


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document()["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


def problem_statuses(operation: dict[str, Any]) -> dict[int, list[str]]:
    """Status → the codes the document says the operation answers it with."""
    declared = {}
    for status, answer in operation["responses"].items():
        if int(status) >= 400:
            words = answer["description"].removeprefix("Problem codes: ").split(", ")
            declared[int(status)] = [word.strip("`") for word in words]
    return declared


def test_no_operation_declares_a_status_its_inputs_cannot_reach() -> None:
    for method, path, operation in operations():
        label = f"{method.upper()} {path}"
        headers = {p["name"].lower(): p for p in operation.get("parameters", []) if p["in"] == "header"}
        has_body = "requestBody" in operation
        declared = problem_statuses(operation)
        for status, codes in declared.items():
            assert all(STATUS_OF.get(code) == status for code in codes), (label, status, codes)
        if "if-match" not in headers:
            assert 412 not in declared, f"{label} takes no If-Match, yet declares 412"
        if not any(h["required"] for h in headers.values()):
            assert 428 not in declared, f"{label} requires no header, yet declares 428"
        if not has_body:
            assert 413 not in declared and "malformed_body" not in declared.get(400, []), label
        if not has_body and not operation.get("parameters"):
            assert 422 not in declared and 400 not in declared, label
        assert {401, 429, 503} <= declared.keys(), label  # the token, its rate, the database: every request


@dataclass
class World:
    client: Client
    token: str
    task_id: int
    lease_id: int
    version: int
    theirs: int  # a lease of another agent on another task

    def request(
        self,
        method: str,
        path: str,
        operation: dict[str, Any],
        *,
        drop: str = "",
        path_value: str | None = None,
        headers: dict[str, str] | None = None,
        body: Any = None,
        raw: bytes | None = None,
        **meta: Any,
    ) -> Any:
        """The operation's good request, but for what the arguments change."""
        values = {"task_id": str(self.task_id), "kind": KIND, "revision": "2"}
        url = path.removeprefix("/api/v1")
        for parameter in (p for p in operation.get("parameters", []) if p["in"] == "path"):
            value = path_value if path_value is not None else values.get(parameter["name"], "1")
            url = url.replace("{" + parameter["name"] + "}", value, 1)
            path_value = None  # only the first parameter is changed
        sent = {
            "Authorization": f"Bearer {self.token}",
            "Reckon-Lease": str(self.lease_id),
            "If-Match": f'"{self.version}"',
        }
        declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        sent = {name: value for name, value in sent.items() if name in declared or name == "Authorization"}
        sent.update(headers or {})
        sent.pop(drop, None)
        extra = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in sent.items()}
        if "requestBody" in operation:
            good = GOOD_BODIES[operation["operationId"]]
            payload = raw if raw is not None else json.dumps(body if body is not None else good)
            extra.update(meta)
            return getattr(self.client, method)("/api/v1" + url, payload, content_type="application/json", **extra)
        return getattr(self.client, method)("/api/v1" + url, **extra, **meta)


@pytest.fixture
def world(client: Client, settings: Any) -> World:
    settings.RECKON_API_RATE = 0
    token = api_token_issue(actor=person("root", "admin"), agent_id=AGENT, kinds=(KIND,), projects=())[1]
    task = task_create(kind=KIND, title="t", plan=chain_plan("a"), created_by=f"agent:{AGENT}")
    other = task_create(kind=KIND, title="u", plan=chain_plan("a"), created_by="agent:else")
    mine = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=AGENT)
    theirs = lease_acquire(task_id=other.pk, holder_kind="agent", holder_id="agent-else")
    task.refresh_from_db()
    # Revision 2, proposed: what …/plans/{revision}/accept names.
    by = f"agent:{AGENT}"
    plan_propose(task_id=task.pk, plan=chain_plan("a", "b"), proposed_by=by, expected_version=task.version, lease=mine)
    task.refresh_from_db()
    return World(client, token, task.pk, mine.pk, task.version, theirs.pk)


def _unreachable_database(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    raise OperationalError("the server closed the connection unexpectedly")


READ_HEADERS = {"If-Match", "Reckon-Lease"}
# Every field of every body, of a type none of them takes.
WRONG_TYPES: dict[str, Any] = {name: [[]] for body in GOOD_BODIES.values() for name in body}


def provocations(world: World, method: str, path: str, operation: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Code → a request that answers it, for every code an operation's inputs imply."""
    call = world.request
    headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
    made: dict[str, Callable[[], Any]] = {
        "unauthenticated": lambda: call(method, path, operation, drop="Authorization"),
        "database_unavailable": lambda: _without_database(lambda: call(method, path, operation)),
        "not_found": lambda: call(method, path, operation, path_value="99999999999999999999"),
        "task_not_found": lambda: call(method, path, operation, path_value=str(world.task_id + 1000)),
        "kind_not_found": lambda: call(method, path, operation, path_value="not-in-scope"),
        "invalid_header": lambda: call(method, path, operation, headers=dict.fromkeys(headers & READ_HEADERS, "x")),
        "precondition_required": lambda: call(method, path, operation, drop=min(headers & READ_HEADERS)),
        "version_conflict": lambda: call(method, path, operation, headers={"If-Match": '"999"'}),
        "lease_not_held": lambda: call(method, path, operation, headers={"Reckon-Lease": str(world.theirs)}),
        "malformed_body": lambda: call(method, path, operation, raw=b"{"),
        "payload_too_large": lambda: call(method, path, operation, CONTENT_LENGTH=str(MAX_BODY + 1)),
    }
    if "requestBody" in operation:
        made["validation_error"] = lambda: call(method, path, operation, body=WRONG_TYPES)
    elif any(p["in"] == "query" for p in operation.get("parameters", [])):
        bearer = f"Bearer {world.token}"
        made["validation_error"] = lambda: world.client.get(path + "?size=0", HTTP_AUTHORIZATION=bearer)
    else:
        made["validation_error"] = lambda: call(method, path, operation, path_value="1%00")
    return made


def _without_database(request: Callable[[], Any]) -> Any:
    with connection.execute_wrapper(_unreachable_database):
        return request()


def test_every_status_an_operations_inputs_imply_is_answered(world: World, settings: Any) -> None:
    for method, path, operation in operations():
        label = f"{method.upper()} {path}"
        if "requestBody" in operation:
            assert operation["operationId"] in GOOD_BODIES, f"{label}: add its good body to GOOD_BODIES"
        made = provocations(world, method, path, operation)
        for code in sorted(implied_codes(operation) - set(ELSEWHERE)):
            answered = made[code]()
            assert answered.status_code == STATUS_OF[code], (label, code, answered.content[:300])
    # The rate: every operation counts the token's requests before it reads anything else.
    settings.RECKON_API_RATE = 1
    admin = person("rate-admin", "admin")
    for method, path, operation in operations():
        world.token = api_token_issue(actor=admin, agent_id=AGENT, kinds=(KIND,), projects=())[1]
        world.request(method, path, operation)
        assert world.request(method, path, operation).status_code == 429, f"{method.upper()} {path}"
