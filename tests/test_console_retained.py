"""The console's retention page (/tasks/<id>/retained/): a person who may operate the task keeps a live retained
object longer, until a time, with a reason — bounded from creation, limited in number, audited. Each refusal (a
reason too short, past the bound, the limit reached, changed since the page was read, expired meanwhile, another
task's object) is a message on the page, never a 500, and writes nothing; whoever may not operate is refused by the
view itself; a POST without a CSRF token is refused."""

import base64
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from guardian.shortcuts import assign_perm
from pytest_django.fixtures import Settings

from audit.models import AuditEvent
from audit.principals import Principal
from leases.clock import ControllableClock
from retention.models import RetainedObject
from retention.queries import live_retained_for_task
from retention.services import Ref, retain, retention_extend, retention_sweep
from tasks.models import Task
from tests.conftest import person, snapshot

pytestmark = pytest.mark.django_db

OPERATE = "tasks.operate_task"
REASON = "the failed copy is still being investigated with the store's support"
LATER = "2030-01-10T00:00"  # objects are made at 2030-01-01 00:00 (the test clock), kept 7 days by default


@pytest.fixture(autouse=True)
def data(settings: Settings, tmp_path: Path, clock: ControllableClock) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    settings.DATA_DIR = folder
    settings.RECKON_RETENTION_KEY = base64.b64encode(bytes(range(32))).decode()
    return folder


@pytest.fixture
def task(make_task: Callable[..., Task]) -> Task:
    return make_task()


@pytest.fixture
def ann(task: Task) -> Principal:
    """An operator granted the task."""
    who = person("ann", "operator")
    assign_perm(OPERATE, who.user, task)
    return who


def keep(task: Task, name: str = "context", **kwargs: Any) -> Ref:
    kwargs.setdefault("kind", "sensitive_input")
    kwargs.setdefault("content", b"model context, keep private")
    return retain(task_id=task.pk, name=name, **kwargs)


def token(ref: Ref, seen: int = 0) -> str:
    return f"{ref.id}:{ref.version}:{seen}"


def url(task: Task) -> str:
    return reverse("task-retained", args=[task.pk])


def everything(folder: Path) -> dict[str, Any]:
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    return {"rows": snapshot(), "files": files}


def test_the_task_page_offers_the_retention_page_to_who_may_operate_only(
    client: Client, task: Task, ann: Principal
) -> None:
    keep(task)
    link = url(task).encode()
    client.force_login(ann.user)
    assert link in client.get(reverse("task-detail", args=[task.pk])).content
    client.force_login(person("aude", "auditor").user)
    page = client.get(reverse("task-detail", args=[task.pk]))
    assert page.status_code == 200 and link not in page.content


def test_the_page_lists_the_live_objects_with_their_expiry_and_extensions_used(
    client: Client, task: Task, ann: Principal, clock: ControllableClock, make_task: Callable[..., Task]
) -> None:
    keep(task, name="tool-response", kind="debug_artifact", content={"status": 503}, ttl=timedelta(hours=1))
    kept = keep(task, name="context")
    retention_extend(actor=ann, ref=kept, until=clock.now() + timedelta(days=9), reason=REASON)
    gone = keep(task, name="scratch", kind="temp_material", content=b"x", ttl=timedelta(minutes=5))
    keep(make_task(title="another task"), name="theirs")
    clock.advance(timedelta(minutes=5))
    retention_sweep()  # "scratch" is purged: not live, not listed
    listed = live_retained_for_task(task.pk)
    assert [(o.row.name, o.extensions_left) for o in listed] == [("tool-response", 3), ("context", 2)]
    assert listed[1].kept_at_most_until == listed[1].row.created_at + timedelta(days=30)
    client.force_login(ann.user)
    page = client.get(url(task))
    assert page.status_code == 200
    text = page.content.decode()
    for shown in (
        "tool-response",
        "debug_artifact",
        "context",
        "sensitive_input",
        "2030-01-10 00:00",
        "1 of 3",
        "2030-01-31 00:00",
    ):
        assert shown in text, shown
    assert "scratch" not in text and "theirs" not in text and f'value="{token(gone)}"' not in text
    assert f'value="{token(kept, 1)}"' in text and 'name="csrfmiddlewaretoken"' in text


def test_an_operator_keeps_a_live_object_longer_with_a_reason(client: Client, task: Task, ann: Principal) -> None:
    ref = keep(task)
    client.force_login(ann.user)
    response = client.post(url(task), {"retained": token(ref), "until": LATER, "reason": f"  {REASON}  "})
    assert response.status_code == 303 and response["Location"] == url(task)
    row = RetainedObject.objects.get(pk=ref.id)
    assert (row.expires_at.isoformat(), row.extended_count) == ("2030-01-10T00:00:00+00:00", 1)
    event = AuditEvent.objects.get(action="retention_extended")
    assert (event.actor_id, event.task_id, event.reason, event.details["retained"]) == ("ann", task.pk, REASON, ref.id)
    page = client.get(response["Location"]).content.decode()
    assert "is kept until 2030-01-10 00:00 UTC" in page and "1 of 3" in page


def _extended(times: int) -> Callable[[Task, Principal, ControllableClock], tuple[Ref, int]]:
    def make(task: Task, who: Principal, clock: ControllableClock) -> tuple[Ref, int]:
        ref = keep(task)
        for n in range(times):
            retention_extend(actor=who, ref=ref, until=clock.now() + timedelta(days=8 + n), reason=REASON)
        return ref, times

    return make


@pytest.mark.parametrize(
    ("setup", "form", "said"),
    [
        pytest.param(_extended(0), {"reason": "because"}, "Give a reason to extend retention", id="reason-too-short"),
        pytest.param(_extended(0), {"reason": ""}, "Give a reason to extend retention", id="no-reason"),
        pytest.param(_extended(0), {"until": "2030-02-05T00:00"}, "cannot be extended that far", id="past-the-bound"),
        pytest.param(_extended(3), {"until": "2030-01-20T00:00"}, "the most times allowed", id="limit-reached"),
        pytest.param(_extended(0), {"until": "2030-01-05T00:00"}, "already lasts until", id="not-later"),
        pytest.param(
            _extended(0), {"reason": "password=hunter2hunter2 is what broke"}, "holds a credential", id="secret"
        ),
    ],
)
def test_each_refusal_is_said_on_the_page_and_nothing_is_written(
    client: Client,
    task: Task,
    ann: Principal,
    clock: ControllableClock,
    data: Path,
    setup: Callable[..., tuple[Ref, int]],
    form: dict[str, str],
    said: str,
) -> None:
    ref, seen = setup(task, ann, clock)
    client.force_login(ann.user)
    before = everything(data)
    response = client.post(url(task), {"retained": token(ref, seen), "until": LATER, "reason": REASON} | form)
    assert response.status_code == 400
    text = response.content.decode()
    assert "Refused:" in text and "Nothing was written." in text and said in text, text
    assert everything(data) == before


def test_an_object_changed_since_the_page_was_read_is_refused(
    client: Client, task: Task, ann: Principal, clock: ControllableClock, data: Path
) -> None:
    ref = keep(task)
    client.force_login(ann.user)
    seen = client.get(url(task))
    assert f'value="{token(ref, 0)}"'.encode() in seen.content
    other = person("olga", "operator")
    assign_perm(OPERATE, other.user, task)
    retention_extend(actor=other, ref=ref, until=clock.now() + timedelta(days=8), reason=REASON)  # meanwhile
    before = everything(data)
    response = client.post(url(task), {"retained": token(ref, 0), "until": LATER, "reason": REASON})
    assert response.status_code == 400 and "changed meanwhile" in response.content.decode()
    assert everything(data) == before


def test_an_object_expired_meanwhile_or_of_another_task_is_refused(
    client: Client, task: Task, ann: Principal, clock: ControllableClock, data: Path, make_task: Callable[..., Task]
) -> None:
    short = keep(task, ttl=timedelta(hours=1))
    other = make_task(title="another task")
    assign_perm(OPERATE, ann.user, other)
    theirs = keep(other, name="theirs")
    client.force_login(ann.user)
    clock.advance(timedelta(hours=1))
    before = everything(data)
    for ref, said in ((short, "has expired"), (theirs, "does not exist")):
        response = client.post(url(task), {"retained": token(ref), "until": LATER, "reason": REASON})
        assert response.status_code == 400 and said in response.content.decode()
    assert everything(data) == before


@pytest.mark.parametrize(
    "form",
    [
        {"until": LATER, "reason": REASON},  # no object chosen
        {"retained": "1:1", "until": LATER, "reason": REASON},  # not a token of the page
        {"retained": "{ref}", "until": "next tuesday", "reason": REASON},
        {"retained": "{ref}", "reason": REASON},
    ],
)
def test_a_form_that_cannot_be_read_is_a_400_and_nothing_is_written(
    client: Client, task: Task, ann: Principal, data: Path, form: dict[str, str]
) -> None:
    ref = keep(task)
    client.force_login(ann.user)
    before = everything(data)
    sent = {name: value.replace("{ref}", token(ref)) for name, value in form.items()}
    response = client.post(url(task), sent)
    assert response.status_code == 400 and b'role="alert"' in response.content
    assert everything(data) == before


def test_the_page_refuses_whoever_may_not_operate_the_task(client: Client, task: Task, data: Path) -> None:
    ref = keep(task)
    form = {"retained": token(ref), "until": LATER, "reason": REASON}
    assert client.get(url(task)).status_code == 302  # logged out: to the login page
    assert client.post(url(task), form).status_code == 302
    refusals = {
        person("out").user: 403,  # no role
        person("aud", "auditor").user: 403,  # sees it, may not act
        person("op", "operator").user: 404,  # may not even see it
    }
    before = everything(data)
    for user, status in refusals.items():
        client.force_login(user)
        assert client.get(url(task)).status_code == status
        assert client.post(url(task), form).status_code == status
    assert client.get(reverse("task-retained", args=[task.pk + 1000])).status_code == 404
    assert everything(data) == before


def test_an_extension_without_a_csrf_token_is_refused(task: Task, ann: Principal, data: Path) -> None:
    ref = keep(task)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(ann.user)
    before = everything(data)
    assert strict.post(url(task), {"retained": token(ref), "until": LATER, "reason": REASON}).status_code == 403
    assert everything(data) == before


def test_the_page_reads_a_fixed_number_of_queries(client: Client, task: Task) -> None:
    client.force_login(person("ada", "admin").user)
    counts = []
    for objects in (3, 12):
        while RetainedObject.objects.filter(task=task).count() < objects:
            keep(task, name=f"object-{RetainedObject.objects.count()}")
        with CaptureQueriesContext(connection) as queries:
            page = client.get(url(task))
        assert page.status_code == 200 and page.content.count(b'type="radio"') == objects
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
