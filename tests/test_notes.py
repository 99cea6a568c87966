"""Operator notes: a note is an audit row written by a person who may operate the task, refused
with a credential in it (nothing written), counted per task in the same query as the page; its endpoint refuses
whoever may not act and a POST without a CSRF token."""

from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from guardian.shortcuts import assign_perm

from audit.hygiene import SecretInPayload
from audit.models import AuditEvent
from audit.principals import Principal
from tasks.access.permissions import PermissionDenied
from tasks.core.errors import TaskNotFound
from tasks.models import Task
from tasks.people.notes import NOTE_ACTION, NoteRefused, task_note_add, with_note_count
from tests.conftest import person, snapshot

pytestmark = pytest.mark.django_db

OPERATE = "tasks.operate_task"
NOTE = "the store answered 503 all morning; waiting for their status page"
SECRET = "use password=hunter2hunter2 to log in"


def operator_of(task: Task, name: str = "ann") -> Principal:
    who = person(name, "operator")
    assign_perm(OPERATE, who.user, task)
    return who


def test_a_note_is_an_audit_row_of_the_task_and_changes_no_state(make_task: Callable[..., Task]) -> None:
    task = make_task()
    ann = operator_of(task)
    event = task_note_add(actor=ann, task_id=task.pk, text=f"  {NOTE}  ")
    assert (event.action, event.task_id, event.actor_id, event.details) == (NOTE_ACTION, task.pk, "ann", {"text": NOTE})
    assert event.version_before == event.version_after == task.version
    assert Task.objects.get(pk=task.pk).version == task.version  # no event, no new version


@pytest.mark.parametrize("text", [SECRET, "token ghp_" + "a" * 36, "x" * 2001, "   "])
def test_a_note_with_a_secret_or_too_long_or_empty_is_refused_and_nothing_is_written(
    make_task: Callable[..., Task], text: str
) -> None:
    task = make_task()
    ann = operator_of(task)
    before = snapshot()
    with pytest.raises((SecretInPayload, NoteRefused)):
        task_note_add(actor=ann, task_id=task.pk, text=text)
    assert snapshot() == before


def test_only_a_person_who_may_operate_the_task_writes_a_note(make_task: Callable[..., Task]) -> None:
    task = make_task()
    # People are made first: making them is itself captured (audit_accountchange), and the snapshot is of the refusals.
    refused = (person("aud", "auditor"), person("op", "operator"), person("out"))
    ada = person("ada", "admin")
    before = snapshot()
    for who in refused:
        with pytest.raises(PermissionDenied):
            task_note_add(actor=who, task_id=task.pk, text=NOTE)
    with pytest.raises(TaskNotFound):
        task_note_add(actor=ada, task_id=999_999, text=NOTE)
    assert snapshot() == before


@pytest.mark.parametrize("tasks", [3, 30])
def test_the_note_count_is_part_of_the_one_query_of_a_page(make_task: Callable[..., Task], tasks: int) -> None:
    made = [make_task(title=f"t{i}") for i in range(tasks)]
    ada = person("ada", "admin")
    for i, task in enumerate(made):
        for _ in range(i % 3):
            task_note_add(actor=ada, task_id=task.pk, text=NOTE)
    with CaptureQueriesContext(connection) as queries:
        counted = {t.pk: t.note_count for t in with_note_count(Task.objects.filter(pk__in=[t.pk for t in made]))}  # type: ignore[attr-defined]
    assert len(queries) == 1
    assert counted == {task.pk: i % 3 for i, task in enumerate(made)}


# ------------------------------------------------------------------------------------------------ the endpoint


def test_the_notes_endpoint_refuses_whoever_may_not_act(client: Client, make_task: Callable[..., Task]) -> None:
    task = make_task()
    url = reverse("task-notes", args=[task.pk])
    assert client.get(url).status_code == 302  # logged out: to the login page
    assert client.post(url, {"text": NOTE}).status_code == 302
    refusals = {
        person("out").user: 403,  # no role
        person("aud", "auditor").user: 403,  # sees it, may not act
        person("op", "operator").user: 404,  # may not even see it
    }
    for user, status in refusals.items():
        client.force_login(user)
        assert client.get(url).status_code == status
        assert client.post(url, {"text": NOTE}).status_code == status
    assert not AuditEvent.objects.filter(action=NOTE_ACTION).exists()


def test_a_note_without_a_csrf_token_is_refused(make_task: Callable[..., Task]) -> None:
    task = make_task()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator_of(task).user)
    assert strict.post(reverse("task-notes", args=[task.pk]), {"text": NOTE}).status_code == 403
    assert not AuditEvent.objects.filter(action=NOTE_ACTION).exists()


def test_an_operator_adds_a_note_with_htmx_and_without(client: Client, make_task: Callable[..., Task]) -> None:
    task = make_task()
    client.force_login(operator_of(task).user)
    url = reverse("task-notes", args=[task.pk])
    page = client.get(url)
    assert page.status_code == 200 and b'hx-post="' + url.encode() in page.content and b'action="' in page.content
    response = client.post(url, {"text": NOTE}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert NOTE.encode() in response.content and b"<html" not in response.content
    assert "HX-Request" in response["Vary"]
    response = client.post(url, {"text": "second note, checked the dashboard"})
    assert response.status_code == 303 and response["Location"] == url
    assert AuditEvent.objects.filter(action=NOTE_ACTION, task_id=task.pk).count() == 2


def test_a_secret_posted_as_a_note_is_refused_on_the_page_and_nothing_is_written(
    client: Client, make_task: Callable[..., Task]
) -> None:
    task = make_task()
    client.force_login(operator_of(task).user)
    before = snapshot()
    response = client.post(reverse("task-notes", args=[task.pk]), {"text": SECRET}, headers={"HX-Request": "true"})
    assert response.status_code == 400
    assert b"Refused" in response.content and b"hunter2" not in response.content.split(b"</textarea>")[-1]
    assert snapshot() == before


def test_the_notes_page_reads_a_fixed_number_of_queries(
    client: Client, make_task: Callable[..., Task], django_assert_num_queries: Callable[..., object]
) -> None:
    task = make_task()
    ada = person("ada", "admin")
    client.force_login(ada.user)
    url = reverse("task-notes", args=[task.pk])
    counts = []
    for _ in range(2):
        for _ in range(10):
            task_note_add(actor=ada, task_id=task.pk, text=NOTE)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts.append(len(queries))
    # Session, user, roles, the task, its notes: the same for 10 and for 20 notes.
    assert counts == [5, 5], counts
