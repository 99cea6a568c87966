"""The console's task list: progress, what needs a person, keyset pages — at a cost that does not grow with the
number of tasks."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console.views import queue as views
from leases.services import lease_reserve
from tasks.lifecycle import FailureClass
from tasks.models import Task
from tasks.outcomes import Committed, Failed
from tests.conftest import chain_plan, person
from tests.steps import record, send

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(client):  # type: ignore[no-untyped-def]
    """An admin's browser: the list needs a login and a role (the access tests are the console's own)."""
    client.force_login(person("ada", "admin").user)
    return client


LIST_QUERIES = 6  # session, user, the role checks (3), the page of tasks with progress and reasons; nothing per task


def task_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r"<tr>\s*<td>(\d+)</td>", html)]


def next_link(html: str) -> str | None:
    found = re.search(r'href="([^"]*)" rel="next"', html)
    return found.group(1).replace("&amp;", "&") if found else None


def test_the_list_shows_progress_open_operations_and_what_needs_a_person(client, make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b", "c"), title="migrate acme")
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    record(send(task, lease, "b"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    waiting = make_task(title="waits for ann")
    lease_reserve(task_id=waiting.pk, operator_id="ann")
    html = client.get(reverse("task-list")).content.decode()
    row = html[html.index("migrate acme") :].split("</tr>")[0]
    assert "<td>1 / 3</td><td>1</td>" in row
    assert "operation outcome unknown" in row
    assert "takeover requested" in html[html.index("waits for ann") :].split("</tr>")[0]


@pytest.mark.parametrize("count", [3, 30])
def test_the_list_costs_the_same_queries_for_3_tasks_as_for_30(client, make_task, clock, count) -> None:
    for index in range(count):
        task = make_task()
        if index % 3 == 0:
            Task.objects.filter(pk=task.pk).update(status="paused", status_reason="needs_replan")
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("task-list"))
    assert response.status_code == 200
    assert len(task_ids(response.content.decode())) == count
    assert len(queries) == LIST_QUERIES, [q["sql"][:120] for q in queries.captured_queries]


def test_the_list_pages_by_cursor_and_a_task_created_meanwhile_changes_no_later_page(
    client, make_task, clock, monkeypatch
) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    made = []
    for _ in range(5):
        made.append(make_task().pk)
        clock.advance(timedelta(seconds=1))
    first = client.get(reverse("task-list")).content.decode()
    assert task_ids(first) == made[4:2:-1]
    make_task()  # newer than every row shown
    link = next_link(first)
    assert link is not None
    second = client.get(link).content.decode()
    assert task_ids(second) == made[2:0:-1]
    assert "first page" in second
    last_link = next_link(second)
    assert last_link is not None
    last = client.get(last_link).content.decode()
    assert task_ids(last) == made[:1]
    assert next_link(last) is None


def test_a_page_after_the_last_task_says_there_are_no_more(client, make_task, clock, monkeypatch) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 1)
    make_task()
    clock.advance(timedelta(seconds=1))
    make_task()
    link = next_link(client.get(reverse("task-list")).content.decode())
    assert link is not None
    # The older task changes meanwhile: it moves to the top, before the cursor (tasks are never deleted).
    Task.objects.filter(pk=min(Task.objects.values_list("pk", flat=True))).update(
        updated_at=clock.now() + timedelta(hours=1)
    )
    html = client.get(link).content.decode()
    assert task_ids(html) == [] and "No more tasks." in html


def test_a_forged_cursor_is_a_bad_request(client, db) -> None:
    response = client.get(reverse("task-list"), {"after": "not-a-cursor"})
    assert response.status_code == 400


def test_an_empty_list_says_how_to_load_the_demo(client, db) -> None:
    html = client.get(reverse("task-list")).content.decode()
    assert "No tasks yet." in html and 'rel="next"' not in html
