"""Cancel from the console: the confirmation counts what is really there, a wrong confirmation or
a stale page writes nothing, and the page follows the task through stopping → stopped_pending → stopped, polling
until it ends."""

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.models import AuditEvent
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed
from tasks.models import Task, TempResource
from tests.conftest import chain_plan, person, snapshot
from tests.steps import record, send
from tests.test_consequences import in_flight
from tests.test_console_reconcile import operator_of, version

pytestmark = pytest.mark.django_db

REASON = "the customer withdrew the migration"


def cancel_url(task: Task) -> str:
    return reverse("task-cancel", args=[task.pk])


def confirm(task: Task, **fields: Any) -> dict[str, Any]:
    return {"version": version(task), "confirm": str(task.pk), "reason": REASON} | fields


def status_panel(client: Client, task: Task) -> Any:
    return client.get(reverse("task-actions-status", args=[task.pk]), headers={"HX-Request": "true"})


@pytest.mark.parametrize(
    ("who", "expected"), [("logged_out", 302), ("outsider", 403), ("unseen", 404), ("auditor", 403)]
)
def test_cancel_refuses_whoever_may_not_operate_the_task(client, make_task, clock, who, expected) -> None:
    task = make_task()
    roles = {"outsider": (), "unseen": ("operator",), "auditor": ("auditor",)}
    if who != "logged_out":
        client.force_login(person("x", *roles[who]).user)
    before = snapshot()
    assert client.get(cancel_url(task)).status_code == expected
    assert client.post(cancel_url(task), confirm(task)).status_code == expected
    assert snapshot() == before


def test_cancel_without_the_csrf_token_is_refused(make_task, clock) -> None:
    task = make_task()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator_of(task).user)
    before = snapshot()
    assert browser.post(cancel_url(task), confirm(task)).status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize(("flying", "temps"), [(1, 2), (4, 7)])
def test_the_confirmation_counts_the_operations_in_flight_and_the_temp_resources(
    client, make_task, agent_lease, clock, flying, temps
) -> None:
    task = make_task(chain_plan("a", "b", "c"))
    lease = agent_lease(task)
    locators = [f"staging/{n}" for n in range(temps)]
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": locators}), lease)
    in_flight(task, flying)
    client.force_login(operator_of(task).user)
    html = client.get(cancel_url(task)).content.decode()
    assert f'data-impact="{flying}">{flying}</strong> operation{"s" if flying > 1 else ""} in flight' in html
    assert f"{flying} operation{'s' if flying > 1 else ''} in flight will be awaited" in html
    assert "1 committed effect stays as recorded" in html
    assert f"{temps} temp resources will be cleaned up once the task has stopped" in html
    assert TempResource.objects.filter(task=task).count() == temps


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"confirm": "yes"}, "Type exactly"),
        ({"reason": ""}, "This field is required"),
        ({"reason": "because"}, "at least 10 characters"),
    ],
)
def test_a_wrong_confirmation_or_a_missing_reason_writes_nothing(client, make_task, clock, fields, says) -> None:
    task = make_task()
    client.force_login(operator_of(task).user)
    before = snapshot()
    response = client.post(cancel_url(task), confirm(task, **fields))
    assert response.status_code == 400
    assert says in response.content.decode()
    assert snapshot() == before


def test_a_cancel_confirmed_on_a_stale_version_writes_nothing(client, make_task, agent_lease, clock) -> None:
    task = make_task()
    client.force_login(operator_of(task).user)
    seen = version(task)
    lease = agent_lease(task)
    send(task, lease, "a")  # the task moved after the person read the consequences
    before = snapshot()
    response = client.post(cancel_url(task), confirm(task, version=seen))
    assert response.status_code == 409
    assert "changed since" in response.content.decode()
    assert snapshot() == before


def test_the_page_follows_stopping_then_stopped_and_stops_polling(client, make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    client.force_login(operator_of(task).user)
    audits = AuditEvent.objects.count()
    response = client.post(cancel_url(task), confirm(task))
    assert response.status_code == 303
    assert response["Location"] == reverse("task-actions", args=[task.pk])
    assert Task.objects.get(pk=task.pk).status == "stopping"
    assert AuditEvent.objects.filter(action="cancel_requested").count() == 1
    assert AuditEvent.objects.count() == audits + 1

    panel = status_panel(client, task)
    html = panel.content.decode()
    assert panel.status_code == 200 and "<html" not in html
    assert "Stopping" in html and op.op_key in html and "1 operation in flight" in html
    assert 'hx-trigger="every 2s' in html
    assert "HX-Request" in panel["Vary"]

    record(op, Committed(remote_id="r-a"), lease)  # the call in flight ends; nothing new starts
    panel = status_panel(client, task)
    assert panel.status_code == 286  # htmx stops polling
    html = panel.content.decode()
    assert "Stopped" in html and "hx-get" not in html and "no longer refreshes" in html


def test_an_unknown_outcome_shows_stopped_with_pending_reconciliation(client, make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    client.force_login(operator_of(task).user)
    assert client.post(cancel_url(task), confirm(task)).status_code == 303
    assert Task.objects.get(pk=task.pk).status == "stopped_pending"
    panel = status_panel(client, task)
    html = panel.content.decode()
    assert panel.status_code == 200
    assert "Stopped, to reconcile" in html and "1 operation of unknown outcome" in html and op.op_key in html


def test_without_htmx_the_status_link_serves_the_whole_page(client, make_task, clock) -> None:
    task = make_task()
    client.force_login(operator_of(task).user)
    response = client.get(reverse("task-actions-status", args=[task.pk]))
    assert response.status_code == 200 and "<html" in response.content.decode()


CONFIRM_QUERIES = 9  # session, user, roles, task, 2 object-permission reads (access), 3 counts
STATUS_QUERIES = 9  # the same: access (6, see CONFIRM_QUERIES) + the stopping counts (3)


@pytest.mark.parametrize("rows", [1, 15])
def test_the_confirmation_and_the_status_cost_the_same_for_1_row_as_for_15(client, make_task, clock, rows) -> None:
    task = make_task(chain_plan("a", "b"))
    in_flight(task, rows)
    Task.objects.filter(pk=task.pk).update(status="stopping")
    client.force_login(operator_of(task).user)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(cancel_url(task)).status_code == 200
    assert len(queries) == CONFIRM_QUERIES, [q["sql"][:100] for q in queries.captured_queries]
    with CaptureQueriesContext(connection) as queries:
        assert status_panel(client, task).status_code == 200
    assert len(queries) == STATUS_QUERIES, [q["sql"][:100] for q in queries.captured_queries]
