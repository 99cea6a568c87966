"""The agent API's first slice (/api/v1/): Bearer tokens only, the two reads, problem+json for every error, the
body cap and the OpenAPI document. Each test tries to get past a rule; a refusal discloses nothing and writes
nothing."""

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from api.errors import CONTENT_TYPE, STATUS_OF, problem, problem_type, status_of
from api.models import ApiToken
from api.tokens import api_token_issue, api_token_revoke
from api.urls import MAX_BODY
from audit.hygiene import SecretInPayload
from audit.principals import Principal
from leases.errors import LeaseHeld
from tasks.access.permissions import PermissionDenied
from tasks.core.errors import TaskNotFound, VersionConflict
from tasks.models import Task
from tests.conftest import chain_plan, person, snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin() -> Principal:
    return person("root", "admin")


@pytest.fixture
def issue(admin: Principal) -> Callable[..., str]:
    def make(kinds: tuple[str, ...] = ("copy",), projects: tuple[str, ...] = (), agent: str = "agent-7") -> str:
        return api_token_issue(actor=admin, agent_id=agent, kinds=kinds, projects=projects)[1]

    return make


def bearer(token: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == CONTENT_TYPE
    body: dict[str, Any] = json.loads(response.content)
    assert body["type"] == f"https://reckon.dev/problems/{code}"
    assert body["status"] == status and body["code"] == code
    assert body["title"] and isinstance(body["detail"], str)
    return body


# --- authentication ---------------------------------------------------------------------------------------------


def test_a_token_in_scope_reads_its_task_with_the_version_as_etag(client: Client, make_task, issue) -> None:
    task = make_task(kind="copy", plan=chain_plan("a", "b", "c"))
    response = client.get(f"/api/v1/tasks/{task.pk}", **bearer(issue()))
    assert response.status_code == 200
    body = response.json()
    task.refresh_from_db()
    assert response["ETag"] == f'"{task.version}"'
    assert body["id"] == task.pk and body["version"] == task.version and body["status"] == task.status
    assert body["plan_version"] == task.plan_version
    assert [n["key"] for n in body["nodes"]] == ["a", "b", "c"]
    assert all(n["status"] for n in body["nodes"]) and body["open_operations"] == []


def test_a_project_scope_reads_tasks_of_that_project(client: Client, make_task, issue) -> None:
    task = make_task(kind="other", project="acme")
    token = issue(kinds=(), projects=("acme",))
    assert client.get(f"/api/v1/tasks/{task.pk}", **bearer(token)).status_code == 200


def test_a_task_out_of_scope_is_answered_as_if_it_did_not_exist(client: Client, make_task, issue) -> None:
    hidden = make_task(kind="secret-kind", title="the merger of acme and globex")
    token = issue(kinds=("copy",))
    out_of_scope = client.get(f"/api/v1/tasks/{hidden.pk}", **bearer(token))
    missing = client.get("/api/v1/tasks/999999", **bearer(token))
    body = assert_problem(out_of_scope, 404, "task_not_found")
    assert_problem(missing, 404, "task_not_found")
    text = out_of_scope.content.decode()
    assert "merger" not in text and "secret-kind" not in text and "ETag" not in out_of_scope
    assert body["detail"].replace(str(hidden.pk), "X") == missing.json()["detail"].replace("999999", "X")


@pytest.mark.parametrize(
    "header",
    [None, "Bearer rk_unknown", "Bearer", "Basic dXNlcjpwYXNz", "Token rk_x", "Bearer " + "x" * 5000],
)
def test_no_token_or_an_unknown_one_is_401(client: Client, make_task, header: str | None) -> None:
    task = make_task(kind="copy")
    extra: dict[str, Any] = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    for url in (f"/api/v1/tasks/{task.pk}", "/api/v1/tasks"):
        response = client.get(url, **extra)
        assert_problem(response, 401, "unauthenticated")
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_401(client: Client, make_task, admin: Principal, issue) -> None:
    task = make_task(kind="copy")
    token = issue()
    assert client.get(f"/api/v1/tasks/{task.pk}", **bearer(token)).status_code == 200
    api_token_revoke(actor=admin, token_id=ApiToken.objects.get().pk, reason="the agent's host was retired")
    assert_problem(client.get(f"/api/v1/tasks/{task.pk}", **bearer(token)), 401, "unauthenticated")


def test_a_console_session_does_not_authenticate_on_the_api(client: Client, make_task) -> None:
    task = make_task(kind="copy")
    client.force_login(person("ann", "admin").user)
    assert client.get("/").status_code in (200, 302)  # the session works on the console
    assert_problem(client.get(f"/api/v1/tasks/{task.pk}"), 401, "unauthenticated")
    assert_problem(client.get("/api/v1/tasks"), 401, "unauthenticated")


def test_a_token_does_not_open_the_console(client: Client, issue) -> None:
    token = issue()
    for url in ("/", "/api-tokens/", "/roles/"):
        response = client.get(url, **bearer(token))
        assert response.status_code == 302 and "/login" in response["Location"], url


def test_the_api_needs_no_csrf_token_and_a_cookie_does_not_help(make_task, issue) -> None:
    task = make_task(kind="copy")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person("ann", "admin").user)
    assert browser.get(f"/api/v1/tasks/{task.pk}", **bearer(issue())).status_code == 200
    # The session alone, even on a browser that passes CSRF checks elsewhere: refused as unauthenticated.
    assert_problem(browser.get("/api/v1/tasks"), 401, "unauthenticated")
    # A POST without a CSRF token is answered by the API (a problem), never by Django's CSRF page: there is no
    # cookie credential to protect: without a token, 401.
    assert_problem(browser.post("/api/v1/tasks", {}), 401, "unauthenticated")


def test_the_last_use_is_noted_at_most_once_a_minute(client: Client, make_task, issue) -> None:
    task = make_task(kind="copy")
    token = issue()
    client.get(f"/api/v1/tasks/{task.pk}", **bearer(token))
    first = ApiToken.objects.get().last_used_at
    assert first is not None
    client.get(f"/api/v1/tasks/{task.pk}", **bearer(token))
    assert ApiToken.objects.get().last_used_at == first


# --- the list ---------------------------------------------------------------------------------------------------


def test_the_list_holds_only_tasks_in_scope_a_page_at_a_time(client: Client, make_task, issue) -> None:
    mine = [make_task(kind="copy") for _ in range(5)]
    make_task(kind="other")
    token = issue()
    seen: list[int] = []
    after: str | None = None
    while True:
        query = {"size": 2} | ({"after": after} if after else {})
        body = client.get("/api/v1/tasks", query, **bearer(token)).json()
        assert len(body["items"]) <= 2
        seen += [item["id"] for item in body["items"]]
        after = body["next_cursor"]
        if after is None:
            break
    assert seen == sorted((t.pk for t in mine), reverse=True)


@pytest.mark.parametrize(("query", "field"), [({"size": 0}, "size"), ({"size": 1000}, "size"), ({"size": "x"}, "size")])
def test_a_bad_page_size_is_a_422_with_field_errors(client: Client, issue, query: dict[str, Any], field: str) -> None:
    body = assert_problem(client.get("/api/v1/tasks", query, **bearer(issue())), 422, "validation_error")
    assert any(e["field"].endswith(field) for e in body["errors"])


def test_a_forged_cursor_is_a_422(client: Client, issue) -> None:
    assert_problem(client.get("/api/v1/tasks", {"after": "not-a-cursor"}, **bearer(issue())), 422, "invalid_cursor")


def test_a_bad_task_id_is_a_422_with_field_errors(client: Client, issue) -> None:
    body = assert_problem(client.get("/api/v1/tasks/abc", **bearer(issue())), 422, "validation_error")
    assert body["errors"]


# --- problems for everything ------------------------------------------------------------------------------------


def test_an_unknown_path_and_a_wrong_method_are_problems(client: Client, make_task, issue) -> None:
    task = make_task(kind="copy")
    assert_problem(client.get("/api/v1/nothing-here", **bearer(issue())), 404, "not_found")
    response = client.delete(f"/api/v1/tasks/{task.pk}", **bearer(issue(agent="a2")))
    assert_problem(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"]


def test_an_oversized_body_is_a_413_and_nothing_is_written(client: Client, make_task, issue) -> None:
    task = make_task(kind="copy")
    token = issue()
    before = snapshot()
    response = client.generic(
        "POST", "/api/v1/tasks", b"x" * (MAX_BODY + 1), content_type="application/json", **bearer(token)
    )
    assert_problem(response, 413, "payload_too_large")
    response = client.generic(
        "GET", f"/api/v1/tasks/{task.pk}", b"{}" + b" " * MAX_BODY, content_type="application/json", **bearer(token)
    )
    assert_problem(response, 413, "payload_too_large")
    assert snapshot() == before


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (VersionConflict("the task moved on"), 412),
        (LeaseHeld(4, "agent-2", datetime(2026, 1, 1, tzinfo=UTC)), 409),
        (PermissionDenied("not yours"), 403),
        (TaskNotFound("no task 4"), 404),
        (SecretInPayload("a token in the evidence"), 422),
    ],
)
def test_each_named_error_is_a_problem_with_its_status_and_type(rf, error: Exception, status: int) -> None:
    from api.errors import problem_of

    response = problem_of(rf.get("/api/v1/tasks/4"), error)
    body = assert_problem(response, status, error.code)  # type: ignore[attr-defined]
    assert body["detail"] == str(error) and body["instance"] == "/api/v1/tasks/4"


def test_the_mapping_names_the_statuses_the_protocol_needs() -> None:
    assert STATUS_OF["version_conflict"] == 412 and STATUS_OF["lease_held"] == 409
    assert STATUS_OF["lease_reserved"] == 423 and STATUS_OF["takeover_held"] == 423
    assert STATUS_OF["payload_too_large"] == 413 and STATUS_OF["secret_in_payload"] == 422
    assert status_of("a_code_nobody_mapped") == 409  # a refusal, never a 500
    assert problem_type("lease_held") == "https://reckon.dev/problems/lease_held"
    assert json.loads(problem(None, code="x", detail="y", status=418).content)["title"] == "I'm a Teapot"


# --- the contract -----------------------------------------------------------------------------------------------


def test_the_openapi_document_names_the_endpoints_without_a_token(client: Client) -> None:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    document = json.loads(response.content)
    assert document["openapi"].startswith("3.1")
    assert {"/api/v1/tasks", "/api/v1/tasks/{task_id}"} <= set(document["paths"])
    schemes = document["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())
    assert client.get("/api/v1/docs").status_code == 200  # its assets local: tests/test_api_docs.py


# --- query budgets ----------------------------------------------------------------------------------------------


def _count(client: Client, url: str, token: str) -> int:
    client.get(url, **bearer(token))  # the token's last use is noted once a minute: out of the count
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url, **bearer(token)).status_code == 200
    return len(queries)


def test_reading_a_task_costs_the_same_with_3_or_30_nodes(client: Client, make_task, issue) -> None:
    token = issue()
    small = make_task(kind="copy", plan=chain_plan(*(f"n{i}" for i in range(3))))
    large = make_task(kind="copy", plan=chain_plan(*(f"n{i}" for i in range(30))))
    # The token read with the task's scope (api/auth.py: its kind and project by primary key, in the same query),
    # the snapshot's three, the task's wake-up row (remote_down, by primary key).
    assert _count(client, f"/api/v1/tasks/{small.pk}", token) == 5
    assert _count(client, f"/api/v1/tasks/{large.pk}", token) == 5


def test_listing_tasks_costs_the_same_with_3_or_30_tasks(client: Client, make_task, issue) -> None:
    token = issue()
    for _ in range(3):
        make_task(kind="copy")
    assert _count(client, "/api/v1/tasks", token) == 2  # the token, the page
    for _ in range(27):
        make_task(kind="copy")
    assert _count(client, "/api/v1/tasks", token) == 2
    assert Task.objects.count() == 30
