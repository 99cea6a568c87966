"""A remote that stays down, shown on the task: the task page, the work queue and the API say
since when the task's remote is unreachable, after how many tries, and when it is asked next — from the wake-up row
the worker wrote (tasks.engine.recovery.remote_down_record), so a person on call sees a task that waits, not one that is
stuck. A task whose remote answers, or that has ended, shows nothing; no page or answer costs a query per row."""

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import dateformat, timezone

from api.tokens import api_token_issue
from leases.clock import ControllableClock
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed, NotFound, Outcome
from tasks.engine.connectors import Connector
from tasks.engine.plans import task_create
from tasks.engine.runner import run_task_once
from tasks.models import Task, TaskWakeUp
from tasks.reads.detail import RemoteDown, remote_down, remote_down_of_row
from tests.conftest import chain_plan, person
from tests.kinds import kind_registered

pytestmark = pytest.mark.django_db

KIND = "remote_down_shown"
TRIES = 3


class Remote(Connector):
    """An in-process remote: ``down``, every call fails as a refused connection does."""

    def __init__(self) -> None:
        self.down = True
        self.done: set[str] = set()

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        if self.down:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, "connection refused")
        self.done.add(op_key)
        return Committed(remote_id=f"r-{op_key[-12:]}")

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self.submit(op_key, request)

    def lookup(self, op_key: str) -> Outcome:
        if self.down:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, "connection refused")
        return Committed(remote_id=f"r-{op_key[-12:]}") if op_key in self.done else NotFound()

    def current_version(self, locator: str) -> str:
        return "1"

    def delete(self, op_key: str, locator: str) -> Outcome:
        return Committed(remote_id=f"d-{op_key[-12:]}")


@pytest.fixture
def remote() -> Iterator[Remote]:
    connector = Remote()
    with kind_registered(KIND, connector=lambda: connector):
        yield connector


def new_task(title: str = "copy to a remote that is down") -> Task:
    return task_create(kind=KIND, title=title, plan=chain_plan("a", "b"), created_by="agent:tester")


def woken(task: Task, clock: ControllableClock, remote: Remote, times: int) -> None:
    """Wake the task ``times`` times, each when the backoff before it is over, as the scan would."""
    for n in range(times):
        wake = run_task_once(task_id=task.pk, holder_id=f"worker-{n}", connector=remote)
        assert wake.wake_at is not None and "remote_unreachable" in wake.summary, wake.summary
        if n < times - 1:
            clock.set(wake.wake_at)


@pytest.fixture
def down(remote: Remote, clock: ControllableClock) -> Callable[[], tuple[Task, RemoteDown]]:
    """Make a task whose remote was found down TRIES wake-ups in a row; what tasks.reads.detail reads of it."""

    def make() -> tuple[Task, RemoteDown]:
        task = new_task()
        woken(task, clock, remote, TRIES)
        shown = remote_down(Task.objects.get(pk=task.pk))
        assert shown is not None and shown.tries == TRIES
        return task, shown

    return make


def stamp(moment: datetime, format_string: str) -> str:
    return dateformat.format(timezone.localtime(moment), format_string)


@pytest.fixture
def admin(client: Client) -> Client:
    client.force_login(person("ada", "admin").user)
    return client


def state_section(client: Client, task: Task) -> str:
    response = client.get(reverse("task-detail", args=[task.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    start = html.index('id="state"')
    return html[start : html.index("</section>", start)]


# --- the task page -------------------------------------------------------------------------------------------------


def test_the_task_page_says_since_when_how_many_tries_and_when_the_remote_is_asked_next(
    admin: Client, down: Callable[[], tuple[Task, RemoteDown]], clock: ControllableClock
) -> None:
    task, shown = down()
    row = TaskWakeUp.objects.get(task=task)
    assert (shown.since, shown.next_ask_at) == (row.remote_down_since, row.remote_next_ask_at)
    state = state_section(admin, task)
    assert 'class="remote-down"' in state
    assert f'since <time datetime="{stamp(shown.since, "c")}">{stamp(shown.since, "Y-m-d H:i:s T")}</time>' in state
    assert f"{TRIES} tries in a row found it down" in state
    assert f'Next ask at <time datetime="{stamp(shown.next_ask_at, "c")}">' in state
    wait = int((shown.next_ask_at - clock.now()).total_seconds())
    assert wait > 0 and f"(in {wait} s, on the database clock)" in state
    clock.set(shown.next_ask_at + timedelta(seconds=1))
    assert "(due now, on the database clock)" in state_section(admin, task)


def test_a_task_whose_remote_answers_shows_nothing_and_the_outage_goes_once_it_answers(
    admin: Client, down: Callable[[], tuple[Task, RemoteDown]], clock: ControllableClock, remote: Remote
) -> None:
    never_tried = new_task("not woken yet")
    assert "remote-down" not in state_section(admin, never_tried)
    assert remote_down(never_tried) is None

    task, shown = down()
    assert "Remote unreachable" in state_section(admin, task)
    remote.down = False
    clock.set(shown.next_ask_at)
    run_task_once(task_id=task.pk, holder_id="worker-up", connector=remote)
    assert Task.objects.get(pk=task.pk).status == "completed"
    assert "remote-down" not in state_section(admin, task)


def test_an_ended_task_shows_no_outage_even_if_its_wake_up_row_still_counts_one(
    admin: Client, down: Callable[[], tuple[Task, RemoteDown]]
) -> None:
    task, _ = down()
    Task.objects.filter(pk=task.pk).update(status="stopped")
    assert TaskWakeUp.objects.get(task=task).remote_down_tries == TRIES
    assert "remote-down" not in state_section(admin, task)
    assert remote_down(Task.objects.get(pk=task.pk)) is None


# --- the work queue ------------------------------------------------------------------------------------------------


def queue_row(html: str, task: Task) -> str:
    start = html.index(f'<tr data-task="{task.pk}">')
    return html[start : html.index("</tr>", start)]


def test_the_work_queue_row_says_it_with_the_page_read_not_a_query_per_row(
    admin: Client, down: Callable[[], tuple[Task, RemoteDown]]
) -> None:
    fine = new_task("a task whose remote answers")

    def listed() -> tuple[str, int]:
        with CaptureQueriesContext(connection) as queries:
            response = admin.get(reverse("task-list"))
        assert response.status_code == 200
        return response.content.decode(), len(queries)

    _, before = listed()
    task, shown = down()
    for _ in range(2):
        down()
    html, after = listed()
    assert after == before  # three tasks down more on the page: not one query more
    row = queue_row(html, task)
    assert f'remote unreachable since <time datetime="{stamp(shown.since, "c")}">' in row
    assert f"({TRIES} tries), next ask" in row and stamp(shown.next_ask_at, "H:i:s T") in row
    assert "remote unreachable" not in queue_row(html, fine)


# --- the API -------------------------------------------------------------------------------------------------------


def api_read(client: Client, token: str, task: Task) -> tuple[dict[str, Any], int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/api/v1/tasks/{task.pk}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body, len(queries)


def test_the_api_task_carries_remote_down_while_the_remote_stays_down_and_null_otherwise(
    client: Client, down: Callable[[], tuple[Task, RemoteDown]], clock: ControllableClock, remote: Remote
) -> None:
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=[KIND], projects=[])
    fine = new_task("a task whose remote answers")
    api_read(client, token, fine)  # the token's last use is noted once a minute: out of the counts below
    body, answered_cost = api_read(client, token, fine)
    assert body["remote_down"] is None

    task, shown = down()
    body, down_cost = api_read(client, token, task)
    assert down_cost == answered_cost
    assert body["remote_down"]["tries"] == TRIES
    got = {name: datetime.fromisoformat(body["remote_down"][name]) for name in ("unreachable_since", "next_ask_at")}
    to_ms = timedelta(milliseconds=1)  # JSON carries milliseconds
    assert abs(got["unreachable_since"] - shown.since) < to_ms and abs(got["next_ask_at"] - shown.next_ask_at) < to_ms

    remote.down = False
    clock.set(shown.next_ask_at)
    run_task_once(task_id=task.pk, holder_id="worker-up", connector=remote)
    assert api_read(client, token, task)[0]["remote_down"] is None


def test_the_openapi_document_describes_remote_down_as_an_object_or_null(client: Client) -> None:
    document = client.get("/api/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    field = schemas["TaskOut"]["properties"]["remote_down"]
    assert {"$ref": "#/components/schemas/RemoteDownOut"} in field["anyOf"] and {"type": "null"} in field["anyOf"]
    assert set(schemas["RemoteDownOut"]["required"]) == {"unreachable_since", "tries", "next_ask_at"}


def test_reading_it_is_one_query_by_primary_key_and_none_for_an_ended_task_or_a_page_read_with_it(
    down: Callable[[], tuple[Task, RemoteDown]], django_assert_num_queries: Any
) -> None:
    task, shown = down()
    task = Task.objects.get(pk=task.pk)
    with django_assert_num_queries(1):
        assert remote_down(task) == shown
    with django_assert_num_queries(1):
        rows = list(Task.objects.filter(kind=KIND).select_related("wake_up"))
    with django_assert_num_queries(0):
        assert [remote_down_of_row(row) for row in rows] == [shown]
    task.status = "completed"
    with django_assert_num_queries(0):
        assert remote_down(task) is None
