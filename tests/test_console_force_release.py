"""Force release from the console: admins only, justification and impact, consequence
sentences from the live lease and operations, a typed confirmation; every refusal writes nothing."""

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.models import AuditEvent
from leases.models import ForcedRelease, Lease
from tasks.models import Task
from tests.conftest import chain_plan, person, snapshot
from tests.steps import send
from tests.test_consequences import in_flight
from tests.test_console_reconcile import operator_of, version

pytestmark = pytest.mark.django_db

JUSTIFICATION = "agent-1 stopped renewing sensibly and blocks the migration"
IMPACT = "batch b may be in flight; the next holder reconciles it by op key"


def url(task: Task) -> str:
    return reverse("force-release", args=[task.pk])


def form(task: Task, **fields: Any) -> dict[str, Any]:
    data = {"version": version(task), "confirm": str(task.pk), "justification": JUSTIFICATION, "impact": IMPACT}
    return data | fields


@pytest.fixture
def held(make_task, agent_lease, clock) -> Task:
    task: Task = make_task(chain_plan("a", "b", "c"))
    agent_lease(task, holder="agent-1")
    return task


@pytest.mark.parametrize(
    ("who", "expected"),
    [("logged_out", 302), ("outsider", 403), ("unseen", 404), ("auditor", 403), ("operator", 403)],
)
def test_force_release_is_refused_to_everyone_but_admins(client, held, who, expected) -> None:
    if who == "operator":
        client.force_login(operator_of(held).user)  # may operate this very task, and still may not force it
    elif who != "logged_out":
        roles = {"outsider": (), "unseen": ("operator",), "auditor": ("auditor",)}[who]
        client.force_login(person("x", *roles).user)
    before = snapshot()
    assert client.get(url(held)).status_code == expected
    assert client.post(url(held), form(held)).status_code == expected
    assert snapshot() == before


def test_force_release_without_the_csrf_token_is_refused(held) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person("ada", "admin").user)
    before = snapshot()
    assert browser.post(url(held), form(held)).status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("flying", [1, 4])
def test_the_consequences_name_the_holder_and_count_what_it_may_have_in_flight(client, held, flying) -> None:
    in_flight(held, flying)
    client.force_login(person("ada", "admin").user)
    html = client.get(url(held)).content.decode()
    assert "The lease of agent agent-1 (epoch 1) is closed now" in html
    assert f"may have {flying} operation{'s' if flying > 1 else ''} in flight" in html
    assert f'data-impact="{flying}"' in html
    assert "review by another admin" in html
    assert f"Type {held.pk} to confirm" in html


def test_an_admin_force_releases_the_lease_recorded_for_review_and_audited(client, held) -> None:
    ada = person("ada", "admin")
    client.force_login(ada.user)
    response = client.post(url(held), form(held))
    assert response.status_code == 303, response.content.decode()[-3000:]
    forced = ForcedRelease.objects.get(task=held)
    assert (forced.removed_holder, forced.forced_by, forced.status) == ("agent:agent-1", str(ada), "pending")
    assert Lease.objects.get(task=held).released_at is not None
    audit = AuditEvent.objects.get(action="lease_forced_release")
    assert (audit.reason, audit.impact) == (JUSTIFICATION, IMPACT)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"confirm": "release"}, "Type exactly"),
        ({"justification": "stuck"}, "at least 20 characters"),
        ({"impact": ""}, "This field is required"),
    ],
)
def test_a_wrong_confirmation_or_a_short_justification_writes_nothing(client, held, fields, says) -> None:
    client.force_login(person("ada", "admin").user)
    before = snapshot()
    response = client.post(url(held), form(held, **fields))
    assert response.status_code == 400
    assert says in response.content.decode()
    assert snapshot() == before


def test_a_release_confirmed_on_a_stale_version_writes_nothing(client, held, agent_lease) -> None:
    client.force_login(person("ada", "admin").user)
    seen = version(held)
    send(held, Lease.objects.get(task=held), "a")  # the holder moved on after the admin read the consequences
    before = snapshot()
    response = client.post(url(held), form(held, version=seen))
    assert response.status_code == 409
    assert "changed since" in response.content.decode()
    assert snapshot() == before


def test_a_free_task_has_nothing_to_release_and_the_refusal_writes_nothing(client, make_task, clock) -> None:
    task = make_task()
    client.force_login(person("ada", "admin").user)
    assert "nothing to release" in client.get(url(task)).content.decode()
    before = snapshot()
    response = client.post(url(task), form(task))
    assert response.status_code == 409  # a rule refused (console/errors.py: STATUS_OF)
    assert snapshot() == before


FORCE_QUERIES = 6  # session, user, roles, task, the lease holder, the in-flight count; nothing per operation


@pytest.mark.parametrize("flying", [1, 12])
def test_the_form_costs_the_same_queries_for_1_operation_as_for_12(client, held, flying) -> None:
    in_flight(held, flying)
    client.force_login(person("ada", "admin").user)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url(held)).status_code == 200
    assert len(queries) == FORCE_QUERIES, [q["sql"][:100] for q in queries.captured_queries]
