"""The work queue's rows (progress, badge, holder, what needs a person), its keyset pages, and its cost: a fixed
number of queries whatever the number of tasks."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import NoReverseMatch, reverse

from audit.principals import Principal
from console.views import queue as views
from leases.services import lease_reserve
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed
from tasks.models import Task
from tests.conftest import chain_plan, person
from tests.steps import record, send

pytestmark = pytest.mark.django_db

# The queries the queue itself runs, besides the frame (session, user, the role checks of console/access.py and
# the roles helper's): the page of tasks (one statement: progress, holder and reasons are correlated subqueries)
# and the user's saved views. An HTMX refresh of the rows runs the page of tasks only.
PAGE_QUERIES = 2
ROWS_QUERIES = 1
QUEUE_TABLES = ('"tasks_task"', '"console_savedview"')
# The whole request: the session, the user, the user's roles (once per request, console/access.py), then the above.
PAGE_TOTAL = 3 + PAGE_QUERIES
ROWS_TOTAL = 3 + ROWS_QUERIES


def matched(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in the page"
    return found


@pytest.fixture
def client(client):
    """An admin's browser (the access tests are in test_console_queue.py)."""
    client.force_login(person("ada", "admin").user)
    return client


def task_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr data-task="(\d+)">', html)]


def row_of(html: str, task: Task) -> str:
    return html[html.index(f'<tr data-task="{task.pk}">') :].split("</tr>")[0]


def next_link(html: str) -> str | None:
    found = re.search(r'href="([^"]*)" rel="next"', html)
    return found.group(1).replace("&amp;", "&") if found else None


def queue_queries(queries: CaptureQueriesContext) -> list[str]:
    """The statements that read the queue's own tables (not the session, the user or the roles)."""
    return [q["sql"] for q in queries.captured_queries if any(t in q["sql"] for t in QUEUE_TABLES)]


def test_a_row_shows_progress_holder_badge_and_what_needs_a_person(client, make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b", "c"), title="migrate acme", project="acme")
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    record(send(task, lease, "b"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    waiting = make_task(title="waits for ann")
    lease_reserve(task_id=waiting.pk, operator_id="ann")
    html = client.get(reverse("task-list")).content.decode()
    row = row_of(html, task)
    assert '<progress max="3" value="1"' in row and "1 / 3" in row
    assert "1 open operation" in row
    assert "agent agent-1" in row
    assert "operation outcome unknown" in row
    assert "acme" in row and "migrate acme" in row
    assert "takeover requested" in row_of(html, waiting)
    assert "nobody" in row_of(html, waiting)


def test_the_state_badge_says_the_state_in_words_with_an_icon_and_what_it_waits_for(client, make_task, clock) -> None:
    stopping, stopped_pending, completed, paused = (make_task() for _ in range(4))
    Task.objects.filter(pk=stopping.pk).update(status="stopping", cancel_requested_at=clock.now())
    Task.objects.filter(pk=stopped_pending.pk).update(status="stopped_pending", cancel_requested_at=clock.now())
    Task.objects.filter(pk=completed.pk).update(status="completed")
    Task.objects.filter(pk=paused.pk).update(status="paused", status_reason="input_changed")
    html = client.get(reverse("task-list")).content.decode()
    badges = {
        name: matched(r'<span class="badge [^"]*" title="([^"]+)">.*?</span></span>', row_of(html, task)).group(0)
        for name, task in [("stopping", stopping), ("pending", stopped_pending), ("done", completed), ("p", paused)]
    }
    assert "stopping" in badges["stopping"] and "waiting for operations already sent" in badges["stopping"]
    assert "stopped, to reconcile" in badges["pending"] and "unknown outcome" in badges["pending"]
    assert "completed" in badges["done"] and "Nothing more will happen" in badges["done"]
    assert "paused: input changed" in badges["p"]
    # Three distinct texts and icons: never told apart by colour alone; the meaning is in text for screen readers.
    icons = {matched(r'aria-hidden="true">([^<]+)<', badge).group(1) for badge in badges.values()}
    assert len(icons) == 4
    assert all('class="visually-hidden"' in badge for badge in badges.values())


def test_a_task_links_to_its_detail_page_when_that_page_exists(client, make_task, clock) -> None:
    task = make_task()
    html = client.get(reverse("task-list")).content.decode()
    try:
        url = reverse("task-detail", args=[task.pk])
    except NoReverseMatch:  # the detail page is another helper's: the list must not depend on it
        assert f"<td>{task.pk}</td>" in row_of(html, task)
    else:
        assert f'<a href="{url}">{task.pk}</a>' in row_of(html, task)


@pytest.mark.parametrize("url_name", ["task-list", "attention"])
@pytest.mark.parametrize("role", ["admin", "operator"])
def test_a_queue_costs_the_same_queries_for_0_3_or_30_tasks(client, make_task, clock, url_name, role) -> None:
    if role == "operator":  # sees the tasks of a granted project: the grant is read in the same statement
        ann = person("ann", "operator").user
        permission_grant(actor=Principal.of_user(User.objects.get(username="ada")), user=ann, project="acme")
        client.force_login(ann)
    totals = []
    for count in (0, 3, 27):
        for index in range(count):
            task = make_task(project="acme")
            if index % 3 == 0:
                Task.objects.filter(pk=task.pk).update(status="paused", status_reason="needs_replan")
            if index % 3 == 1:
                Task.objects.filter(pk=task.pk).update(status="human")
        filters = {"project": "acme", "exclude": "completed", "q": "test", "holder": "none"}
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse(url_name), filters)
        assert response.status_code == 200
        assert len(queue_queries(queries)) == PAGE_QUERIES, queue_queries(queries)
        totals.append(len(queries))
    assert totals == [PAGE_TOTAL] * 3, totals
    shown = task_ids(response.content.decode())
    assert len(shown) == (30 if url_name == "task-list" else 20)


def test_a_refresh_of_the_rows_costs_one_query_however_many_tasks(client, make_task, clock) -> None:
    totals = []
    for count in (3, 27):
        for _ in range(count):
            make_task()
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse("task-list"), headers={"HX-Request": "true"})
        assert len(queue_queries(queries)) == ROWS_QUERIES
        totals.append(len(queries))
    assert totals == [ROWS_TOTAL] * 2, totals
    assert len(task_ids(response.content.decode())) == 30


def test_pages_run_newest_task_first_and_a_task_created_meanwhile_changes_no_later_page(
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


def test_pages_never_repeat_or_skip_a_task_while_tasks_change(client, make_task, clock, monkeypatch) -> None:
    """The work queue pages by task id: a task that changes keeps its place, one created sorts before the cursor."""
    monkeypatch.setattr(views, "PAGE_SIZE", 3)
    made = []
    for _ in range(10):
        made.append(make_task().pk)
        clock.advance(timedelta(seconds=1))
    seen: list[int] = []
    link: str | None = reverse("task-list")
    step = 0
    while link is not None:
        html = client.get(link).content.decode()
        seen += task_ids(html)
        link = next_link(html)
        # Between pages: tasks change (an unseen one and a seen one), and a new one arrives.
        clock.advance(timedelta(seconds=1))
        Task.objects.filter(pk=made[step]).update(status="human", updated_at=clock.now())
        Task.objects.filter(pk=seen[0]).update(status="paused", status_reason="needs_replan", updated_at=clock.now())
        make_task()
        step += 1
    assert sorted(seen) == sorted(made)
    assert len(seen) == len(set(seen))


def test_the_next_link_keeps_the_filters(client, make_task, clock, monkeypatch) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 1)
    for _ in range(3):
        make_task(project="acme")
    make_task(project="globex")
    html = client.get(reverse("task-list"), {"project": "acme"}).content.decode()
    link = next_link(html)
    assert link is not None and "project=acme" in link
    second = client.get(link).content.decode()
    assert all(Task.objects.get(pk=pk).project == "acme" for pk in task_ids(second))


def test_a_page_after_the_last_task_says_there_are_no_more(client, make_task, clock, monkeypatch) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 1)
    make_task()
    make_task()
    link = next_link(client.get(reverse("task-list")).content.decode())
    assert link is not None
    html = client.get(link).content.decode()
    assert len(task_ids(html)) == 1 and next_link(html) is None
    cursor = link.split("after=")[1]
    from tasks.reads.queries import _decode, _encode  # the cursor of the last row: nothing after it

    updated_at, pk = _decode(cursor)
    html = client.get(reverse("task-list"), {"after": _encode(updated_at, pk - 1)}).content.decode()
    assert task_ids(html) == [] and "No more tasks." in html


@pytest.mark.parametrize("cursor", ["not-a-cursor", "bm90IGEgY3Vyc29y", "MjAzMC0wMS0wMVQwMDowMDowMHw3", "%%%"])
@pytest.mark.parametrize("url_name", ["task-list", "attention"])
def test_a_forged_cursor_is_a_bad_request_with_a_sentence(client, db, cursor, url_name) -> None:
    response = client.get(reverse(url_name), {"after": cursor})
    assert response.status_code == 400
    assert b"start again from the first page" in response.content


def test_an_empty_queue_says_so(client, make_task) -> None:
    html = client.get(reverse("task-list")).content.decode()
    assert "No tasks yet." in html and 'rel="next"' not in html
    make_task(project="acme")
    html = client.get(reverse("task-list"), {"project": "globex"}).content.decode()
    assert "No task matches these filters." in html
    assert "No task needs a person right now." in client.get(reverse("attention")).content.decode()
