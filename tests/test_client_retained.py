"""reckon_client's retained objects against Reckon itself (pytest-django's live server: real HTTP), sync and async:
``retain`` answers the reference a checkpoint keeps, ``fetch`` reads it back, and ``fetch_or_recreate`` re-creates
an object whose retention has ended from external facts — the caller's ``recreate`` — and retains it again, so no
checkpoint goes on with a reference to something that is gone. A corrupt object is refused, never re-created over.

(The protocol's mechanics against a scripted server are tests/test_client.py.)"""

import asyncio
import base64
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings
from reckon_client import ApiError, AsyncReckon, Reckon, RetainedRef

from api.tokens import api_token_issue
from leases.clock import ControllableClock
from retention.models import RetainedObject
from retention.services import object_path, retention_sweep
from tasks.models import Task
from tests.conftest import person

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "copy"
CONTEXT = b"model context: the customer's migration notes, CANARY-7f3a9c"
FRESH = b"manifest of projects/acme@7, re-read from the store"
ARTIFACT = {"tool": "store.list", "status": 503, "request_id": "req-81"}


@pytest.fixture(autouse=True)
def data(settings: Settings, tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    settings.DATA_DIR = folder
    settings.RECKON_RETENTION_KEY = base64.b64encode(bytes(range(32))).decode()
    return folder


@pytest.fixture
def token(db: None) -> str:
    return api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=(KIND,), projects=())[1]


@pytest.fixture
def task(make_task: Callable[..., Task]) -> Task:
    return make_task(kind=KIND)


@pytest.fixture
def reckon(live_server: Any, token: str) -> Any:
    with Reckon(live_server.url, token) as client:
        yield client


class Source:
    """The external facts: what ``recreate`` reads again, counted."""

    def __init__(self, content: Any = FRESH) -> None:
        self.content, self.reads = content, 0

    def __call__(self) -> Any:
        self.reads += 1
        return self.content


def test_retain_answers_the_checkpoint_reference_and_fetch_reads_it_back(reckon: Reckon, task: Task) -> None:
    ref = reckon.retain(task.pk, "sensitive_input", "context", CONTEXT, ttl_seconds=3600)
    assert (ref.task_id, ref.version) == (task.pk, 1)
    assert ref.as_checkpoint() == {"retained": ref.id, "version": 1}
    assert RetainedRef.of_checkpoint(task.pk, ref.as_checkpoint()) == ref
    read = reckon.fetch(ref)
    assert (read.ref, read.kind, read.name, read.content) == (ref, "sensitive_input", "context", CONTEXT)
    assert read.expires_at is not None
    artifact = reckon.fetch(reckon.retain(task.pk, "debug_artifact", "list-503", ARTIFACT))
    assert (artifact.kind, artifact.content) == ("debug_artifact", ARTIFACT)
    assert reckon.retain(task.pk, "sensitive_input", "context", b"again").version == 2


def test_fetch_or_recreate_reads_a_live_object_and_recreates_an_expired_one_from_external_facts(
    reckon: Reckon, task: Task, clock: ControllableClock
) -> None:
    ref = reckon.retain(task.pk, "sensitive_input", "context", CONTEXT, ttl_seconds=3600)
    source = Source()
    assert reckon.fetch_or_recreate(ref, recreate=source).content == CONTEXT
    assert source.reads == 0  # live: read as kept, nothing re-created
    clock.advance(timedelta(hours=1))
    with pytest.raises(ApiError) as gone:
        reckon.fetch(ref)
    assert (gone.value.status, gone.value.code) == (410, "retention_expired")
    assert (gone.value.problem["kind"], gone.value.problem["name"]) == ("sensitive_input", "context")
    retention_sweep()  # the file is gone now
    again = reckon.fetch_or_recreate(ref, recreate=source)
    assert (again.content, source.reads) == (FRESH, 1)
    assert (again.ref.id != ref.id, again.ref.version, again.kind, again.name) == (
        True,
        2,
        "sensitive_input",
        "context",
    )
    assert reckon.fetch(again.ref).content == FRESH  # the new reference is the one to keep
    with pytest.raises(ApiError, match="retention_expired"):
        reckon.fetch(ref)  # the old one still names an expired object, never a path
    assert RetainedObject.objects.filter(task=task).count() == 2


def test_a_recreated_debug_artifact_is_retained_as_one_again(
    reckon: Reckon, task: Task, clock: ControllableClock
) -> None:
    ref = reckon.retain(task.pk, "debug_artifact", "list-503", ARTIFACT, ttl_seconds=60)
    clock.advance(timedelta(minutes=1))
    again = reckon.fetch_or_recreate(ref, recreate=Source(ARTIFACT | {"status": 200}))
    assert (again.kind, again.content, again.ref.version) == ("debug_artifact", ARTIFACT | {"status": 200}, 2)


def test_a_corrupt_object_is_refused_and_never_recreated(reckon: Reckon, task: Task) -> None:
    ref = reckon.retain(task.pk, "sensitive_input", "context", CONTEXT)
    row = RetainedObject.objects.get(pk=ref.id)
    path = object_path(task.uid, row.uid, 1)
    sealed = bytearray(path.read_bytes())
    sealed[-1] ^= 1
    path.write_bytes(bytes(sealed))
    source = Source()
    with pytest.raises(ApiError) as refused:
        reckon.fetch_or_recreate(ref, recreate=source)
    assert (refused.value.status, refused.value.code, source.reads) == (409, "retention_corrupt", 0)
    assert RetainedObject.objects.filter(task=task).count() == 1


def test_refusals_are_api_errors_and_retain_nothing(reckon: Reckon, task: Task, make_task: Callable[..., Task]) -> None:
    with pytest.raises(ApiError) as secret:
        reckon.retain(task.pk, "debug_artifact", "leak", {"token": "ghp_" + "a" * 36})
    assert (secret.value.status, secret.value.code) == (422, "secret_in_payload")
    with pytest.raises(ApiError) as hidden:
        reckon.retain(make_task(kind="not-in-scope").pk, "sensitive_input", "context", CONTEXT)
    assert (hidden.value.status, hidden.value.code) == (404, "task_not_found")
    with pytest.raises(TypeError):
        reckon.retain(task.pk, "sensitive_input", "context", "text, not bytes")  # type: ignore[arg-type]
    assert not RetainedObject.objects.exists()


def test_the_async_client_retains_fetches_and_recreates_with_a_coroutine(
    live_server: Any, token: str, task: Task, clock: ControllableClock
) -> None:
    reads: list[int] = []

    async def recreate() -> bytes:
        reads.append(1)
        return FRESH

    async def main() -> tuple[Any, Any, Any]:
        async with AsyncReckon(live_server.url, token) as reckon:
            ref = await reckon.retain(task.pk, "temp_material", "scratch", CONTEXT, ttl_seconds=60)
            live = await reckon.fetch_or_recreate(ref, recreate=recreate)
            clock.advance(timedelta(minutes=1))
            again = await reckon.fetch_or_recreate(ref, recreate=recreate)
            return ref, live, again

    ref, live, again = asyncio.run(main())
    assert live.content == CONTEXT and live.ref == ref
    assert (again.content, again.ref.version, again.kind, reads) == (FRESH, 2, "temp_material", [1])
