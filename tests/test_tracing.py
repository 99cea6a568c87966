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

from agents.demo import migration_plan
from api.tokens import api_token_issue
from leases.services import lease_acquire, lease_release
from observability import tracing
from tasks import registry
from tasks.connectors.objectstore import ObjectStoreConnector
from tasks.jobs import drive_task
from tasks.lifecycle import NodeStatus
from tasks.models import Node, Operation, Task
from tasks.permissions import permission_grant
from tasks.plans import task_create
from tasks.runner import run_steps
from tasks.takeover import takeover_claim
from tests.conftest import chain_plan, person
from tests.simulator_fixture import Simulator
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


@pytest.mark.django_db(transaction=True)
def test_a_wake_up_s_trace_carries_the_op_key_from_the_sender_to_the_connector(
    store: Simulator, tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    span_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv("RECKON_TRACES", f"file:{span_file}")
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
    with celery_worker(store.url) as queue:
        with tracing.tracer().start_as_current_span("operator asks for a wake-up") as sender:
            drive_task.apply_async((task.pk, task.version), queue=queue)
        trace_id = f"0x{sender.get_span_context().trace_id:032x}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = Node.objects.filter(task=task, status=NodeStatus.SUCCEEDED).count() >= 6
            jobs = [s for s in read_spans(span_file) if s["name"] == "tasks.drive_task"]
            if done and jobs:
                break
            time.sleep(0.2)
    worker_spans = read_spans(span_file)
    job = next(s for s in worker_spans if s["name"] == "tasks.drive_task")
    # The worker's job continues the sender's trace, a child of the sender's span.
    assert job["context"]["trace_id"] == trace_id
    assert job["parent_id"] == f"0x{sender.get_span_context().span_id:016x}"
    assert job["attributes"]["reckon.task_id"] == task.pk
    assert job["attributes"]["reckon.task_version"] == task.version
    # Each operation the wake-up sent is a connector span in the same trace, under the job, with its op key.
    submits = [s for s in worker_spans if s["name"] == "connector.submit" and s["context"]["trace_id"] == trace_id]
    op_keys = set(Operation.objects.filter(task=task).values_list("op_key", flat=True))
    assert op_keys and {s["attributes"]["reckon.op_key"] for s in submits} == op_keys
    assert all(s["attributes"]["reckon.task_id"] == task.pk for s in submits)
    assert all(s["attributes"]["reckon.outcome"] == "Committed" for s in submits)
    assert {s["parent_id"] for s in submits} <= {
        s["context"]["span_id"] for s in worker_spans if s["context"]["trace_id"] == trace_id
    }


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
            {"node_key": "approve-cleanup", "expected_version": Task.objects.get(pk=task.pk).version, "resume": "on"},
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
