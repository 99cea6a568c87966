"""Retained objects over the agent API (/api/v1/tasks/{id}/retained): an agent retains a sensitive input or a debug
artifact and keeps only the reference; reads it back while it lives; an expired or purged one answers 410 with what
to re-create. Each test tries to get past a rule — another token's scope, a secret in a debug artifact, bytes sent
as an object, a ttl past the bound, a corrupt file, a replayed key — and checks that a refusal writes nothing: no
row (retention and audit included), no file."""

import base64
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from pytest_django.fixtures import Settings

from api.errors import CONTENT_TYPE
from api.models import IdempotencyRecord
from api.tokens import api_token_issue
from audit.principals import Principal
from leases.clock import ControllableClock
from retention.models import RetainedObject
from retention.services import object_path, retention_sweep
from tasks.models import Task
from tests.conftest import person, snapshot

pytestmark = pytest.mark.django_db

KIND = "copy"
CONTEXT = b"model context: the customer's migration notes, CANARY-7f3a9c, keep private"
ARTIFACT = {"tool": "store.list", "status": 503, "request_id": "req-81", "excerpt": "Service Unavailable"}
KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.fixture(autouse=True)
def data(settings: Settings, tmp_path: Path) -> Path:
    """A private data folder and a known key for every test."""
    folder = tmp_path / "data"
    folder.mkdir()
    settings.DATA_DIR = folder
    settings.RECKON_RETENTION_KEY = KEY
    return folder


@pytest.fixture
def admin() -> Principal:
    return person("root", "admin")


@pytest.fixture
def issue(admin: Principal) -> Callable[..., str]:
    def make(kinds: tuple[str, ...] = (KIND,), projects: tuple[str, ...] = (), agent: str = "agent-7") -> str:
        return api_token_issue(actor=admin, agent_id=agent, kinds=kinds, projects=projects)[1]

    return make


@pytest.fixture
def task(make_task: Callable[..., Task]) -> Task:
    return make_task(kind=KIND)


class Agent:
    def __init__(self, client: Client, token: str) -> None:
        self.client, self.token = client, token

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        extra = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"}
        extra.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()})
        data = json.dumps(body) if body is not None else None
        return getattr(self.client, method)("/api/v1" + path, data=data, content_type="application/json", **extra)

    def retain(self, task_id: int, **body: Any) -> Any:
        body.setdefault("kind", "sensitive_input")
        body.setdefault("name", "context")
        body.setdefault("content", base64.b64encode(CONTEXT).decode())
        headers = body.pop("headers", {})
        return self.call("post", f"/tasks/{task_id}/retained", body, **headers)

    def read(self, task_id: int, ref: dict[str, Any]) -> Any:
        return self.call("get", f"/tasks/{task_id}/retained/{ref['retained']}/versions/{ref['version']}")


def agent_of(client: Client, token: str) -> Agent:
    """An agent whose token was used once already: its last-use hint (written at most once a minute, whatever the
    answer) is out of the snapshots of the refusals."""
    agent = Agent(client, token)
    assert agent.call("get", "/tasks").status_code == 200
    return agent


@pytest.fixture
def agent(client: Client, issue: Callable[..., str]) -> Agent:
    return agent_of(client, issue())


def problem_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == CONTENT_TYPE
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["type"].endswith("/" + code), body
    return body


def retained(response: Any) -> dict[str, Any]:
    assert response.status_code == 201, response.content
    body: dict[str, Any] = response.json()
    return body


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def everything(folder: Path) -> dict[str, Any]:
    """Every Reckon row (retention and audit included) and every file under the data folder."""
    return {"rows": snapshot(), "files": files(folder)}


# --- retain and read ----------------------------------------------------------------------------------------------


def test_an_agent_retains_a_sensitive_input_and_reads_it_back_by_its_checkpoint_reference(
    agent: Agent, task: Task, data: Path
) -> None:
    response = agent.retain(task.pk, ttl_seconds=3600)
    ref = retained(response)
    assert set(ref) == {"retained", "version"} and ref["version"] == 1  # what a checkpoint keeps, nothing else
    location = f"/api/v1/tasks/{task.pk}/retained/{ref['retained']}/versions/1"
    assert response["Location"] == location
    row = RetainedObject.objects.get(pk=ref["retained"])
    assert (row.task_id, row.kind, row.name, row.size) == (task.pk, "sensitive_input", "context", len(CONTEXT))
    sealed = object_path(task.uid, row.uid, 1).read_bytes()
    assert CONTEXT not in sealed and b"CANARY" not in sealed  # ciphertext at rest
    answer = agent.read(task.pk, ref)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert base64.b64decode(body.pop("content")) == CONTEXT
    assert body == {
        "retained": ref["retained"],
        "version": 1,
        "kind": "sensitive_input",
        "name": "context",
        "expires_at": body["expires_at"],
    }
    said = datetime.fromisoformat(body["expires_at"])  # JSON times are to the millisecond, never later
    assert timedelta(0) <= row.created_at + timedelta(hours=1) - said < timedelta(milliseconds=1)


def test_a_debug_artifact_goes_in_and_comes_back_as_a_json_object(agent: Agent, task: Task) -> None:
    ref = retained(agent.retain(task.pk, kind="debug_artifact", name="list-503", content=ARTIFACT))
    body = agent.read(task.pk, ref).json()
    assert (body["kind"], body["name"], body["content"]) == ("debug_artifact", "list-503", ARTIFACT)


def test_each_retain_of_a_name_answers_its_next_version(agent: Agent, task: Task) -> None:
    refs = [retained(agent.retain(task.pk, content=base64.b64encode(b"v%d" % n).decode())) for n in (1, 2, 3)]
    assert [r["version"] for r in refs] == [1, 2, 3] and len({r["retained"] for r in refs}) == 3
    for n, ref in enumerate(refs, 1):
        assert base64.b64decode(agent.read(task.pk, ref).json()["content"]) == b"v%d" % n


def test_a_retain_retried_with_its_idempotency_key_answers_the_first_reference(agent: Agent, task: Task) -> None:
    first = agent.retain(task.pk, headers={"Idempotency-Key": "retain:context:1"})
    again = agent.retain(task.pk, headers={"Idempotency-Key": "retain:context:1"})
    assert retained(again) == retained(first) and again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"]
    assert RetainedObject.objects.filter(task=task).count() == 1 and IdempotencyRecord.objects.count() == 1
    other = agent.retain(
        task.pk, content=base64.b64encode(b"else").decode(), headers={"Idempotency-Key": "retain:context:1"}
    )
    problem_of(other, 422, "idempotency_key_reused")
    assert RetainedObject.objects.filter(task=task).count() == 1


# --- refusals write nothing ---------------------------------------------------------------------------------------


def test_a_secret_in_a_debug_artifact_is_refused_422_and_nothing_is_written(
    agent: Agent, task: Task, data: Path
) -> None:
    before = everything(data)
    leaked = ARTIFACT | {"headers": {"Authorization": "Bearer ghp_" + "a" * 36}}
    body = problem_of(
        agent.retain(task.pk, kind="debug_artifact", name="list-503", content=leaked), 422, "secret_in_payload"
    )
    assert "ghp_" not in json.dumps(body)  # the refusal names the place, never the secret
    assert everything(data) == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(
            {"kind": "debug_artifact", "content": "aGVsbG8="}, 422, "retention_refused", id="artifact-as-bytes"
        ),
        pytest.param({"content": {"a": 1}}, 422, "retention_refused", id="bytes-as-object"),
        pytest.param({"ttl_seconds": 31 * 24 * 3600}, 422, "retention_refused", id="ttl-past-the-bound"),
        pytest.param({"ttl_seconds": 0}, 422, "validation_error", id="ttl-zero"),
        pytest.param({"ttl_seconds": "60"}, 422, "validation_error", id="ttl-as-text"),
        pytest.param({"content": "not base64!"}, 422, "validation_error", id="not-base64"),
        pytest.param({"content": "aGVsbG8"}, 422, "validation_error", id="base64-unpadded"),
        pytest.param({"kind": "transcript"}, 422, "validation_error", id="unknown-kind"),
        pytest.param({"name": ""}, 422, "validation_error", id="empty-name"),
        pytest.param({"name": "password=hunter2hunter2"}, 422, "secret_in_payload", id="credential-in-the-name"),
        pytest.param(
            {"kind": "debug_artifact", "content": {"excerpt": "x" * 70_000}},
            413,
            "payload_too_large",
            id="artifact-too-large",
        ),
    ],
)
def test_what_cannot_be_retained_is_refused_and_nothing_is_written(
    agent: Agent, task: Task, data: Path, body: dict[str, Any], status: int, code: str
) -> None:
    before = everything(data)
    problem_of(agent.retain(task.pk, **body), status, code)
    assert everything(data) == before


def test_a_task_outside_the_tokens_scope_is_not_found_on_both_routes_before_anything_is_read(
    client: Client,
    issue: Callable[..., str],
    agent: Agent,
    task: Task,
    make_task: Callable[..., Task],
    data: Path,
    clock: ControllableClock,
) -> None:
    ref = retained(agent.retain(task.pk, ttl_seconds=60))
    hidden = make_task(kind="not-in-scope")
    other = agent_of(client, issue(kinds=("other-kind",), agent="agent-9"))  # another agent, another scope
    missing = hidden.pk + 1000
    before = everything(data)
    leaked = {"kind": "debug_artifact", "content": {"token": "ghp_" + "a" * 36}}  # would be 422 in scope
    answers = {
        "post out of scope": other.retain(task.pk, **leaked),
        "post missing": other.retain(missing, **leaked),
        "get out of scope": other.read(task.pk, ref),
        "get missing": other.read(missing, ref),
        "get hidden task": agent.read(hidden.pk, ref),
    }
    clock.advance(timedelta(minutes=1))
    answers["get out of scope, expired"] = other.read(task.pk, ref)  # not 410: its existence is not disclosed
    for name, response in answers.items():
        body = problem_of(response, 404, "task_not_found")
        assert body["detail"] in (f"task {t} does not exist" for t in (task.pk, missing, hidden.pk)), name
        assert set(body) == {"type", "title", "status", "detail", "code", "instance"}, name
    assert everything(data) == before


def test_another_tasks_object_or_a_missing_version_is_not_found(
    agent: Agent, task: Task, make_task: Callable[..., Task]
) -> None:
    ref = retained(agent.retain(task.pk))
    sibling = make_task(kind=KIND, title="another task in scope")
    problem_of(agent.read(sibling.pk, ref), 404, "retention_not_found")
    problem_of(agent.read(task.pk, ref | {"version": 2}), 404, "retention_not_found")
    problem_of(agent.read(task.pk, ref | {"retained": ref["retained"] + 1}), 404, "retention_not_found")


# --- gone, and corrupt ---------------------------------------------------------------------------------------------


def test_an_expired_object_answers_410_with_what_to_recreate_and_so_does_a_purged_one(
    agent: Agent, task: Task, clock: ControllableClock, data: Path
) -> None:
    ref = retained(agent.retain(task.pk, kind="debug_artifact", name="list-503", content=ARTIFACT, ttl_seconds=3600))
    clock.advance(timedelta(hours=1) - timedelta(microseconds=1))
    assert agent.read(task.pk, ref).status_code == 200  # one tick before its expiry
    clock.advance(timedelta(microseconds=1))
    for purged in (False, True):
        if purged:
            assert retention_sweep().purged == 1  # the file is gone now
            assert files(data) == {}
        before = everything(data)
        body = problem_of(agent.read(task.pk, ref), 410, "retention_expired")
        assert {k: body[k] for k in ("retained", "version", "kind", "name")} == ref | {
            "kind": "debug_artifact",
            "name": "list-503",
        }
        assert "re-create" in body["detail"].lower() and f"POST /api/v1/tasks/{task.pk}/retained" in body["detail"]
        assert ("purged" in body["detail"]) is purged
        assert everything(data) == before
    # Re-created from external facts and retained again: the next version of the same name, a new reference.
    new = retained(agent.retain(task.pk, kind="debug_artifact", name="list-503", content=ARTIFACT | {"status": 200}))
    assert new["version"] == 2 and new["retained"] != ref["retained"]
    assert agent.read(task.pk, new).json()["content"]["status"] == 200


def test_a_corrupt_object_answers_409_and_is_never_offered_for_recreation(agent: Agent, task: Task) -> None:
    ref = retained(agent.retain(task.pk))
    row = RetainedObject.objects.get(pk=ref["retained"])
    path = object_path(task.uid, row.uid, 1)
    sealed = bytearray(path.read_bytes())
    sealed[-1] ^= 1  # one bit of the ciphertext's tag: it no longer authenticates
    path.write_bytes(bytes(sealed))
    body = problem_of(agent.read(task.pk, ref), 409, "retention_corrupt")
    assert "kind" not in body and "name" not in body


# --- who, and the document -----------------------------------------------------------------------------------------


def test_no_token_is_401_on_both_routes(client: Client, task: Task, data: Path) -> None:
    before = everything(data)
    anonymous = Agent(client, "rk_not-a-token")
    problem_of(anonymous.retain(task.pk), 401, "unauthenticated")
    problem_of(anonymous.read(task.pk, {"retained": 1, "version": 1}), 401, "unauthenticated")
    assert everything(data) == before


def test_the_openapi_document_describes_both_routes_and_the_410(client: Client) -> None:
    document = client.get("/api/v1/openapi.json").json()
    post = document["paths"]["/api/v1/tasks/{task_id}/retained"]["post"]
    get = document["paths"]["/api/v1/tasks/{task_id}/retained/{retained_id}/versions/{version}"]["get"]
    assert {"201", "404", "413", "422"} <= set(post["responses"]) and "Idempotency-Key" in json.dumps(post)
    assert {"200", "404", "409", "410"} <= set(get["responses"])
    gone = get["responses"]["410"]["content"][CONTENT_TYPE]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert {"kind", "name", "retained", "version"} <= set(document["components"]["schemas"][gone]["properties"])
    kinds = document["components"]["schemas"]["RetainedKind"]["enum"]
    assert kinds == ["sensitive_input", "debug_artifact", "temp_material"]
