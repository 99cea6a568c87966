"""GET /metrics (observability/): scraped from a live server after the reference task ran, the figures are the
database's; without the token nothing is read and nothing is shown."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection
from django.db.models import Count
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from agents.demo import migration_plan
from leases.models import Lease
from leases.services import lease_acquire, lease_release
from tasks.connectors.objectstore import ObjectStoreConnector
from tasks.models import Event, Operation, Task
from tasks.plans import task_create
from tasks.recovery import wake_up_claim
from tasks.runner import run_steps
from tests.conftest import person
from tests.simulator_fixture import Simulator

TOKEN = "metrics-test-token-0123456789"


@pytest.fixture
def metrics_on(settings: Any) -> Iterator[None]:
    settings.RECKON_METRICS_TOKEN = TOKEN
    settings.RECKON_METRICS_CACHE_SECONDS = 0.0
    yield


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def reference_task_ran(store: Simulator) -> Task:
    """The demo plan up to its approval point, one answer dropped on the way (settled by a query by op key)."""
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    store.fault("accept_then_drop", times=1)
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert report.directive is not None and report.directive.reason == "awaiting_approval"
    lease_release(lease=report.lease)
    task.refresh_from_db()
    return task


@pytest.mark.django_db(transaction=True)
def test_a_scrape_of_a_live_server_after_the_reference_task_shows_the_database_figures(
    store: Simulator, live_server: Any, metrics_on: None
) -> None:
    task = reference_task_ran(store)
    response = httpx.get(f"{live_server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    found = samples(response.text)

    # The figures of this run, as the simulator and the runner made them: six effects up to the approval point,
    # one of them answered after its answer was dropped (connection_interrupted, then settled by op key).
    assert value(found, "reckon_tasks", status=task.status, reason="") == 1
    assert sum(v for (name, _), v in found.items() if name == "reckon_tasks") == 1
    assert value(found, "reckon_steps_total", outcome="succeeded") == 6
    assert value(found, "reckon_steps_total", outcome="unknown") == 1
    assert value(found, "reckon_steps_total", outcome="rejected") == 0
    assert value(found, "reckon_operation_failures_total", failure_class="connection_interrupted") == 1
    assert value(found, "reckon_operations_open", status="unknown") == 0
    # Settled by a query by op key: nothing was sent again, so no retry.
    assert not [labels for name, labels in found if name == "reckon_retries_total"]
    assert value(found, "reckon_operations_unprovable") == 0
    assert value(found, "reckon_reconciliation_seconds_count") == 1
    assert value(found, "reckon_lease_grants_total", holder_kind="agent") == 1
    assert value(found, "reckon_lease_releases_total", reason="released") == 1
    assert value(found, "reckon_leases_open", state="live") == 0
    assert value(found, "reckon_quarantines_total") == 0
    assert value(found, "reckon_wake_ups_queued") == 0
    assert value(found, "reckon_tasks_remote_down") == 0

    # And each is the database's own count.
    outcomes = dict(Event.objects.filter(task=task).order_by().values_list("type").annotate(n=Count("pk")))
    assert value(found, "reckon_steps_total", outcome="succeeded") == outcomes["node_succeeded"]
    assert value(found, "reckon_steps_total", outcome="unknown") == outcomes["operation_unknown"]
    assert value(found, "reckon_operation_failures_total", failure_class="connection_interrupted") == (
        Operation.objects.filter(failure_class="connection_interrupted").count()
    )
    assert value(found, "reckon_lease_grants_total", holder_kind="agent") == Lease.objects.count()
    assert (
        value(found, "reckon_cleanup_backlog", status="active") == task.temp_resources.filter(status="active").count()
    )


@pytest.mark.django_db(transaction=True)
def test_the_figures_follow_the_database_not_the_process(live_server: Any, metrics_on: None, make_task) -> None:
    """A task created after the first scrape is in the second: nothing is counted in memory."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    first = samples(httpx.get(f"{live_server.url}/metrics", headers=headers).text)
    assert value(first, "reckon_tasks", status="pending", reason="") == 0
    make_task()
    make_task()
    second = samples(httpx.get(f"{live_server.url}/metrics", headers=headers).text)
    assert value(second, "reckon_tasks", status="pending", reason="") == 2 == Task.objects.count()
    # A wake-up claimed (queued) and a second refused for the same version: one queued, as the database says.
    task = Task.objects.first()
    assert task is not None
    assert wake_up_claim(task_id=task.pk, version=task.version)
    assert not wake_up_claim(task_id=task.pk, version=task.version)
    third = samples(httpx.get(f"{live_server.url}/metrics", headers=headers).text)
    assert value(third, "reckon_wake_ups_queued") == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"],
)
def test_without_the_token_the_scrape_is_refused_and_reads_nothing(
    client: Client, metrics_on: None, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"reckon_" not in response.content
    assert not [q for q in queries.captured_queries if "tasks_" in q["sql"] or "leases_" in q["sql"]]


@pytest.mark.django_db
def test_metrics_are_off_unless_a_token_is_set(client: Client, settings: Any) -> None:
    """Never open by default: unset, nobody scrapes, not even with an empty bearer or from loopback."""
    settings.RECKON_METRICS_TOKEN = ""
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer"}):
        response = client.get("/metrics", headers=headers, REMOTE_ADDR="127.0.0.1")
        assert response.status_code == 404
        assert b"reckon_" not in response.content


@pytest.mark.django_db
def test_a_logged_in_session_is_not_a_token(client: Client, metrics_on: None) -> None:
    """The console's login does not open the metrics: only the token does (and the login middleware, which would
    send a scraper to the login page, is not in the way of one that has it)."""
    user = person("root", "admin", superuser=True).user
    client.force_login(user)
    assert client.get("/metrics").status_code == 401
    client.logout()
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


@pytest.mark.django_db
def test_only_get_is_answered(client: Client, metrics_on: None) -> None:
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


@pytest.mark.django_db
def test_a_lease_is_live_then_in_grace_then_lapsed_on_the_database_clock(
    client: Client, metrics_on: None, make_task, agent_lease, clock, settings: Any
) -> None:
    task = make_task()
    agent_lease(task, ttl=timedelta(seconds=30))
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def states() -> tuple[float, float, float]:
        found = samples(client.get("/metrics", headers=headers).content.decode())
        return tuple(value(found, "reckon_leases_open", state=s) for s in ("live", "grace", "lapsed"))  # type: ignore[return-value]

    assert states() == (1, 0, 0)
    clock.advance(timedelta(seconds=31))
    assert states() == (0, 1, 0)
    clock.advance(settings.RECKON_LEASE_GRACE)
    assert states() == (0, 0, 1)
    found = samples(client.get("/metrics", headers=headers).content.decode())
    assert value(found, "reckon_lease_grants_total", holder_kind="agent") == 1
    assert value(found, "reckon_lease_releases_total", reason="expired") == 0  # closed only by the next grant


@pytest.mark.django_db
def test_a_refused_write_tried_again_is_one_retry_of_its_class(
    store: Simulator, client: Client, metrics_on: None, clock
) -> None:
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    store.fault("dependency_unavailable", times=1, action="copy_batch")
    first = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    lease_release(lease=first.lease)
    clock.advance(timedelta(minutes=15))  # past the node's backoff
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    done = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert done.directive is not None and done.directive.reason == "awaiting_approval"
    found = samples(client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode())
    assert value(found, "reckon_operation_failures_total", failure_class="dependency_unavailable") == 1
    assert value(found, "reckon_retries_total", failure_class="dependency_unavailable") == 1
    assert value(found, "reckon_steps_total", outcome="rejected") == 1
    assert value(found, "reckon_steps_total", outcome="succeeded") == 6
    assert value(found, "reckon_lease_grants_total", holder_kind="agent") == 2
