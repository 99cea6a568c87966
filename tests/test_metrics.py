"""GET /metrics (observability/): scraped from a live server after the reference task ran, the figures are the
database's; without the token nothing is read and nothing is shown."""

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from audit.models import VerificationRun
from leases.clock import now as clock_now
from leases.models import ForcedRelease, Lease
from leases.services import lease_acquire, lease_release
from observability.metrics import STEP_OUTCOME_EVENTS
from reference.demo import migration_plan
from reference.objectstore import ObjectStoreConnector
from tasks.core.lifecycle import PauseReason, TaskStatus
from tasks.engine.plans import task_create
from tasks.engine.recovery import wake_up_claim
from tasks.engine.runner import run_steps
from tasks.models import Event, Operation, Task, TaskWakeUp, TempResource
from tasks.people.forced_release import lease_force_release
from tasks.people.oversight import logs_verify
from tests.conftest import chain_plan, person
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


def from_the_database() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every figure of a scrape, computed again here a different way — each row read and counted in Python, not
    the grouped queries of observability/metrics.py — so a wrong query there cannot agree with itself here."""
    now = clock_now()
    figures: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

    def put(name: str, n: float = 1, **labels: str) -> None:
        key = (name, frozenset(labels.items()))
        figures[key] = figures.get(key, 0.0) + n

    for status in [s.value for s in TaskStatus]:  # every status and pause reason is shown, 0 or not
        for reason in [r.value for r in PauseReason] if status == TaskStatus.PAUSED else [""]:
            put("reckon_tasks", 0, status=status, reason=reason)
    for status, reason in Task.objects.values_list("status", "status_reason"):
        put("reckon_tasks", status=status, reason=reason)
    operations = list(
        Operation.objects.values_list(
            "pk", "node_id", "purpose", "status", "failure_class", "registered_at", "settled_at"
        )
    )
    for status in ("dispatched", "accepted", "unknown"):
        put("reckon_operations_open", sum(1 for op in operations if op[3] == status), status=status)
    put("reckon_operations_unprovable", sum(1 for op in operations if op[3] == "unknown" and op[4] == "unprovable"))
    unknown_since = [op[5] for op in operations if op[3] == "unknown"]
    put("reckon_operations_unknown_oldest_seconds", (now - min(unknown_since)).total_seconds() if unknown_since else 0)
    lost = sorted(
        (op[6] - op[5]).total_seconds()
        for op in operations
        if op[6] is not None and op[4] in ("connection_interrupted", "unprovable")
    )
    for bound in (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0):
        put("reckon_reconciliation_seconds_bucket", sum(1 for d in lost if d <= bound), le=repr(bound))
    put("reckon_reconciliation_seconds_bucket", len(lost), le="+Inf")
    put("reckon_reconciliation_seconds_count", len(lost))
    put("reckon_reconciliation_seconds_sum", sum(lost))
    events = Counter(Event.objects.values_list("type", flat=True))
    for event_type, outcome in STEP_OUTCOME_EVENTS.items():
        put("reckon_steps_total", events[event_type], outcome=outcome)
    put("reckon_quarantines_total", events["quarantined"])
    for op in operations:
        if op[4]:
            put("reckon_operation_failures_total", failure_class=op[4])
            tried_again = any(o[1] == op[1] and o[2] == op[2] and o[0] > op[0] for o in operations)
            if op[3] == "rejected" and tried_again:
                put("reckon_retries_total", failure_class=op[4])
    for kind in ("agent", "operator"):
        put("reckon_lease_grants_total", 0, holder_kind=kind)
    for reason in ("released", "expired", "forced"):
        put("reckon_lease_releases_total", 0, reason=reason)
    for state in ("live", "grace", "lapsed"):
        put("reckon_leases_open", 0, state=state)
    grace = django_settings.RECKON_LEASE_GRACE
    for kind, reason, released_at, expires_at in Lease.objects.values_list(
        "holder_kind", "release_reason", "released_at", "expires_at"
    ):
        put("reckon_lease_grants_total", holder_kind=kind)
        if reason:
            put("reckon_lease_releases_total", reason=reason)
        if released_at is None:
            state = "live" if expires_at > now else "grace" if expires_at > now - grace else "lapsed"
            put("reckon_leases_open", state=state)
    for review in ("pending", "accepted", "disputed"):
        put("reckon_forced_releases_total", 0, review=review)
    for review in ForcedRelease.objects.values_list("status", flat=True):
        put("reckon_forced_releases_total", review=review)
    for status in ("active", "cleaning", "stuck"):
        put("reckon_cleanup_backlog", 0, status=status)
    for status in TempResource.objects.exclude(status="deleted").values_list("status", flat=True):
        put("reckon_cleanup_backlog", status=status)
    wake_ups = list(
        TaskWakeUp.objects.values_list(
            "queued_version", "queued_until", "remote_down_tries", "queued_count", "deduplicated_count"
        )
    )
    put("reckon_wake_ups_queued_total", sum(w[3] for w in wake_ups))
    put("reckon_wake_ups_deduplicated_total", sum(w[4] for w in wake_ups))
    put("reckon_wake_ups_pending", sum(1 for w in wake_ups if w[0] is not None and w[1] is not None and w[1] > now))
    put("reckon_tasks_remote_down", sum(1 for w in wake_ups if w[2] > 0))
    runs = list(VerificationRun.objects.values_list("tasks_with_problems", "audit_problem"))
    put("reckon_chain_verification_failures_total", sum(r[0] for r in runs), chain="task_events")
    put("reckon_chain_verification_failures_total", sum(1 for r in runs if r[1]), chain="audit")
    put("reckon_chain_verification_runs_total", len(runs))
    return figures


@pytest.mark.django_db(transaction=True)
def test_a_scrape_of_a_live_server_after_the_reference_task_shows_the_database_figures(
    store: Simulator, live_server: Any, metrics_on: None, clock: Any, settings: Any
) -> None:
    """Every figure the issue names made non-zero by a real run, then each sample of the scrape compared with the
    database: the reference task (an answer dropped and settled by op key), a lease that lapsed and was closed by the
    next grant, a forced release, wake-ups queued and one deduplicated at enqueue, a tampered task found by a log
    verification run and quarantined."""
    settings.RECKON_ANCHOR_KEY = ""
    task = reference_task_ran(store)
    other = task_create(kind="copy", title="other", plan=chain_plan("a"), created_by="agent:m")
    lease_acquire(task_id=other.pk, holder_kind="agent", holder_id="worker-1", ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=31) + settings.RECKON_LEASE_GRACE)
    lease_acquire(task_id=other.pk, holder_kind="agent", holder_id="worker-2")  # closes the lapsed one: expired
    root = person("root", "admin")
    lease_force_release(actor=root, task_id=other.pk, justification="worker-2 is wedged " * 2, impact="none " * 8)
    task.refresh_from_db()
    assert wake_up_claim(task_id=task.pk, version=task.version)
    assert not wake_up_claim(task_id=task.pk, version=task.version)  # deduplicated at enqueue: nothing sent
    tampered = task_create(kind="copy", title="tampered", plan=chain_plan("a"), created_by="agent:m")
    Task.objects.filter(pk=tampered.pk).update(attempts_used=7)  # the row no longer folds from its log
    logs_verify(actor=root)

    response = httpx.get(f"{live_server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    found = samples(response.text)

    # The figures of this run, as the simulator and the runner made them: six effects up to the approval point,
    # one of them answered after its answer was dropped (connection_interrupted, then settled by op key).
    assert value(found, "reckon_tasks", status=task.status, reason="") == 1
    assert value(found, "reckon_tasks", status="quarantined", reason="") == 1
    assert value(found, "reckon_steps_total", outcome="succeeded") == 6
    assert value(found, "reckon_steps_total", outcome="unknown") == 1
    assert value(found, "reckon_steps_total", outcome="rejected") == 0
    assert value(found, "reckon_operation_failures_total", failure_class="connection_interrupted") == 1
    assert value(found, "reckon_operations_open", status="unknown") == 0
    # Settled by a query by op key: nothing was sent again, so no retry.
    assert not [labels for name, labels in found if name == "reckon_retries_total"]
    assert value(found, "reckon_reconciliation_seconds_count") == 1
    assert value(found, "reckon_lease_grants_total", holder_kind="agent") == 3
    assert value(found, "reckon_lease_releases_total", reason="released") == 1
    assert value(found, "reckon_lease_releases_total", reason="expired") == 1
    assert value(found, "reckon_lease_releases_total", reason="forced") == 1
    assert value(found, "reckon_forced_releases_total", review="pending") == 1
    assert value(found, "reckon_wake_ups_queued_total") == 1
    assert value(found, "reckon_wake_ups_deduplicated_total") == 1
    assert value(found, "reckon_wake_ups_pending") == 1
    assert value(found, "reckon_chain_verification_failures_total", chain="task_events") == 1
    assert value(found, "reckon_chain_verification_runs_total") == 1
    assert value(found, "reckon_quarantines_total") == 1
    assert value(found, "reckon_cleanup_backlog", status="active") > 0

    # And each sample is the database's own figure, computed again here; none is left unchecked.
    expected = from_the_database()
    shown = {key: v for key, v in found.items() if key[0] not in UNCHECKED}
    assert shown.keys() == expected.keys(), shown.keys() ^ expected.keys()
    for key, figure in expected.items():
        assert shown[key] == pytest.approx(figure), key
    assert {name for name, _ in found} >= ISSUE_METRICS


# reckon_metrics_scrape_seconds is the reading's own duration, not a figure of the database.
UNCHECKED = frozenset({"reckon_metrics_scrape_seconds"})
# What the metrics must cover: steps by outcome, operations unknown / unprovable now, reconciliation latency,
# lease grants, expiries and forced releases, retries by failure class, tasks by state and pause reason, wake-ups
# queued and deduplicated, cleanup backlog, chain verification failures.
ISSUE_METRICS = frozenset(
    {
        "reckon_steps_total",
        "reckon_operations_open",
        "reckon_operations_unprovable",
        "reckon_reconciliation_seconds_count",
        "reckon_lease_grants_total",
        "reckon_lease_releases_total",
        "reckon_forced_releases_total",
        "reckon_tasks",
        "reckon_wake_ups_queued_total",
        "reckon_wake_ups_deduplicated_total",
        "reckon_cleanup_backlog",
        "reckon_chain_verification_failures_total",
    }
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
    assert value(third, "reckon_wake_ups_pending") == 1
    assert value(third, "reckon_wake_ups_queued_total") == 1
    assert value(third, "reckon_wake_ups_deduplicated_total") == 1


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
