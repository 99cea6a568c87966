"""Traces (observability/tracing.py): one trace from the code that queues a wake-up, through the worker's job, to
each connector call, carrying the task id, the version and the op key. The worker is a real Celery process exporting
its spans to a file (RECKON_TRACES=file:…); this process keeps its spans in memory."""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.tokens import api_token_issue
from leases.services import lease_acquire, lease_release
from observability import tracing
from reference.demo import migration_plan
from reference.objectstore import ObjectStoreConnector
from tasks.access.permissions import permission_grant
from tasks.engine import registry
from tasks.engine.plans import task_create
from tasks.engine.runner import run_steps
from tasks.jobs import drive_task
from tasks.models import Event, Operation, Task
from tasks.people.takeover import takeover_claim
from tests.conftest import chain_plan, person
from tests.simulator_fixture import Simulator
from tests.steps import asked
from tests.workers import celery_worker

EXPORTED = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process traced into memory (the global provider is set once per process: the first test sets it), and
    untraced again after the test."""
    tracing.configure(SimpleSpanProcessor(EXPORTED))
    EXPORTED.clear()
    try:
        yield EXPORTED
    finally:
        tracing.disable()
        EXPORTED.clear()


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def to_approval(store: Simulator) -> tuple[Task, Any]:
    """The reference task run up to its approval point, then taken over by ann (an operator): the task and ann."""
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert report.directive is not None and report.directive.reason == "awaiting_approval"
    lease_release(lease=report.lease)
    ann = person("ann", "operator")
    permission_grant(actor=person("root", "admin"), user=ann.user, task=task)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    return Task.objects.get(pk=task.pk), ann


@pytest.mark.django_db(transaction=True)
def test_a_console_request_a_real_worker_and_its_connector_calls_are_one_trace_with_versions_and_op_keys(
    store: Simulator, client: Client, tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ann approves and hands the task back in the console (a server span, in this process); the wake-up it queues
    after the commit runs in a real Celery worker process (its spans exported to a file): the worker's job is a
    child of the request, each connector call a child of the job carrying the task id, the version the task was at
    when the call was made and the op key; the job's events are the state changes it wrote, version by version."""
    span_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv("RECKON_TRACES", f"file:{span_file}")
    task, ann = to_approval(store)
    before = set(Operation.objects.filter(task=task).values_list("op_key", flat=True))
    with celery_worker(store.url) as queue:
        # The console queues drive_task on the default queue; this test's worker listens on a queue of its own.
        options = drive_task._get_exec_options()  # type: ignore[attr-defined]
        monkeypatch.setattr(drive_task, "_exec_options", options | {"queue": queue})
        client.force_login(ann.user)
        spans.clear()
        response = client.post(
            reverse("takeover-approve", args=[task.pk]),
            {
                "node_key": "approve-cleanup",
                "expected_version": task.version,
                "approving": asked(task, "approve-cleanup"),
                "resume": "on",
            },
        )
        assert response.status_code == 303
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ended = Task.objects.filter(pk=task.pk, status="completed").exists()
            if ended and any(s["name"] == "tasks.drive_task" for s in read_spans(span_file)):
                break
            time.sleep(0.2)
    [request] = [s for s in spans.get_finished_spans() if s.name.startswith("POST ")]
    trace_id = f"0x{request.context.trace_id:032x}"
    worker_spans = read_spans(span_file)
    [job] = [s for s in worker_spans if s["name"] == "tasks.drive_task"]
    assert job["context"]["trace_id"] == trace_id
    assert job["parent_id"] == f"0x{request.context.span_id:016x}"
    assert job["attributes"]["reckon.task_id"] == task.pk
    # The request's events are the person's changes; the job's, every change the wake-up wrote next, version by
    # version, as the task's log has them.
    assert request.events and request.events[-1].attributes is not None
    handed_back = int(str(request.events[-1].attributes["reckon.task_version"]))
    assert request.events[-1].attributes["reckon.event"] == "takeover_result_submitted"
    written = [e["attributes"] for e in job["events"]]
    log = dict(Event.objects.filter(task=task).values_list("seq", "type"))
    assert [w["reckon.task_version"] for w in written] == list(range(handed_back + 1, handed_back + 1 + len(written)))
    assert all(log[w["reckon.task_version"]] == w["reckon.event"] for w in written)
    # Each operation the wake-up sent is one connector call in the same trace, under the job, with its op key and
    # the version the task was at when it was sent: the version its intent's write made (a step an approval gates
    # records the approval's execution in that same write, as the next version).
    intents = {}
    for w, following in zip(written, [*written[1:], None], strict=True):
        if w["reckon.event"].endswith("_dispatched"):
            joined = following is not None and following["reckon.event"] == "approval_executed"
            intents[w["reckon.op_key"]] = following["reckon.task_version"] if joined else w["reckon.task_version"]
    sends = [s for s in worker_spans if s["name"] in ("connector.submit", "connector.delete", "connector.compensate")]
    assert len(intents) >= 2 and sorted(s["attributes"]["reckon.op_key"] for s in sends) == sorted(intents)
    assert set(intents) <= set(Operation.objects.filter(task=task).values_list("op_key", flat=True)) - before
    for call in sends:
        attributes = call["attributes"]
        assert call["context"]["trace_id"] == trace_id and call["parent_id"] == job["context"]["span_id"]
        assert attributes["reckon.task_id"] == task.pk
        assert attributes["reckon.task_version"] == intents[attributes["reckon.op_key"]], attributes


@pytest.mark.django_db
def test_an_api_request_is_a_server_span_naming_its_task(client: Client, spans: InMemorySpanExporter) -> None:
    task = task_create(kind="copy", title="t", plan=chain_plan("a"), created_by="agent:m")
    token = api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=("copy",), projects=())[1]
    response = client.get(f"/api/v1/tasks/{task.pk}", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    [span] = [s for s in spans.get_finished_spans() if s.name.startswith("GET ")]
    assert span.attributes is not None
    assert span.attributes["reckon.task_id"] == task.pk
    assert span.attributes["http.response.status_code"] == 200
    spans.clear()
    assert client.get("/metrics").status_code == 404  # metrics off in this test; scrapes are never traced
    assert not spans.get_finished_spans()


def test_tracing_is_off_unless_asked() -> None:
    assert tracing.processor_for("") is None
    assert not tracing.enabled()  # RECKON_TRACES is unset in the tests, and a traced test turns it off after
    with pytest.raises(Exception, match="RECKON_TRACES"):
        tracing.processor_for("zipkin")


@pytest.mark.django_db(transaction=True)
def test_a_person_s_hand_back_in_the_console_is_one_trace_down_to_the_connector(
    store: Simulator, client: Client, spans: InMemorySpanExporter, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's approve-and-hand-back wakes the agent after its commit; the wake-up runs in place here (Celery
    eager: the message's trace headers are the other test's), so the request span, the job span and the connector
    spans of the steps it ran are one trace in this process."""
    settings.RECKON_OBJECTSTORE_URL = store.url
    monkeypatch.setitem(drive_task.app.conf, "task_always_eager", True)
    original = registry._KINDS["migrate_project"]
    tracing.trace_registered_connectors()
    try:
        task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
        lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
        report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
        assert report.directive is not None and report.directive.reason == "awaiting_approval"
        lease_release(lease=report.lease)
        root = person("root", "admin")
        ann = person("ann", "operator")
        permission_grant(actor=root, user=ann.user, task=task)
        assert takeover_claim(actor=ann, task_id=task.pk).granted
        client.force_login(ann.user)
        before = set(Operation.objects.filter(task=task).values_list("op_key", flat=True))
        spans.clear()
        response = client.post(
            reverse("takeover-approve", args=[task.pk]),
            {
                "node_key": "approve-cleanup",
                "expected_version": Task.objects.get(pk=task.pk).version,
                "approving": asked(task, "approve-cleanup"),
                "resume": "on",
            },
        )
        assert response.status_code == 303
    finally:
        registry._KINDS["migrate_project"] = original
    finished = spans.get_finished_spans()
    [request] = [s for s in finished if s.name.startswith("POST ")]
    [job] = [s for s in finished if s.name == "tasks.drive_task"]
    calls = [
        s for s in finished if s.name.startswith("connector.") and s.attributes and "reckon.op_key" in s.attributes
    ]
    trace_id = request.context.trace_id
    assert request.attributes is not None and request.attributes["reckon.task_id"] == task.pk
    assert job.context.trace_id == trace_id and job.parent is not None
    assert job.parent.span_id == request.context.span_id
    # Every operation a connector sent after the hand-back (effects and the temp copies' deletes; the approval is
    # the person's own, sent by nobody).
    sent = Operation.objects.filter(task=task).exclude(action="approval")
    after = set(sent.values_list("op_key", flat=True)) - before
    assert len(after) >= 2, "the hand-back ran no step"
    assert {s.attributes["reckon.op_key"] for s in calls if s.attributes} == after
    assert all(s.context.trace_id == trace_id for s in calls)
