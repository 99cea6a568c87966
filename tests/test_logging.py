"""Logs (observability/logs.py): each record printed once, whatever logger it came from; JSON lines that parse and
carry the task id, version and op key where the caller or the wake-up knows them.

The doubled lines once seen: Django's own "django" logger had a console handler of its own (under DEBUG) and also
propagated to the root's handler. Checked in a fresh process, as the settings configure logging at start-up."""

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from celery.signals import task_postrun, task_prerun

from leases.services import lease_acquire, lease_ttl
from leases.state import lease_grace
from observability.logs import (
    STATE_EVENTS,
    STATE_LOGGER,
    ContextFilter,
    JsonFormatter,
    TextFormatter,
    bound,
    logging_config,
)
from reference.demo import migration_plan
from reference.objectstore import ObjectStoreConnector
from tasks.core.errors import VersionConflict
from tasks.engine.plans import task_create
from tasks.engine.protocol import operation_start, snapshot_at
from tasks.engine.runner import run_steps
from tasks.jobs import drive_task, recovery_scan
from tasks.models import Event, Operation
from tests.conftest import chain_plan
from tests.simulator_fixture import Simulator

ROOT = Path(__file__).resolve().parent.parent

# One record from each kind of logger a Reckon process has: Django's request and server loggers, Django's parent
# logger, a project logger with the task fields passed by the caller, and one with an exception.
EMIT = """
import logging, django
django.setup()
logging.getLogger("django.request").warning("request-line")
logging.getLogger("django.server").info("server-line")
logging.getLogger("django").info("django-line")
logging.getLogger("tasks.jobs").info("task-line", extra={"task_id": 7, "task_version": 12, "op_key": "rk-abc-0"})
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("hooks.services").exception("failure-line")
"""


def emitted(log_format: str) -> list[str]:
    env = os.environ | {
        "RECKON_LOG_FORMAT": log_format,
        "DJANGO_DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "console.settings",
    }
    run = subprocess.run(  # noqa: S603
        [sys.executable, "-c", EMIT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return (run.stderr + run.stdout).splitlines()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_each_record_is_printed_once(log_format: str) -> None:
    lines = emitted(log_format)
    for message in ("request-line", "server-line", "django-line", "task-line", "failure-line"):
        assert sum(message in line for line in lines) == 1, (message, lines)


def test_json_lines_parse_and_carry_what_the_caller_knows() -> None:
    lines = emitted("json")
    records = [json.loads(line) for line in lines]  # every line is one JSON object: a traceback spans no lines
    by_message = {r["message"]: r for r in records}
    task = by_message["task-line"]
    assert (task["task_id"], task["task_version"], task["op_key"]) == (7, 12, "rk-abc-0")
    assert (task["level"], task["logger"]) == ("INFO", "tasks.jobs")
    assert task["time"].endswith("+00:00")
    request = by_message["request-line"]
    assert request["level"] == "WARNING" and "task_id" not in request and "op_key" not in request
    failure = by_message["failure-line"]
    assert "ZeroDivisionError" in failure["exception"] and failure["level"] == "ERROR"


def test_the_text_format_shows_the_task_fields_after_the_message() -> None:
    line = next(line for line in emitted("text") if "task-line" in line)
    assert line.endswith("INFO tasks.jobs: task-line [task_id=7 task_version=12 op_key=rk-abc-0]")


def test_an_unknown_format_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="RECKON_LOG_FORMAT"):
        logging_config(log_format="xml", level="INFO")
    env = os.environ | {"RECKON_LOG_FORMAT": "xml", "DJANGO_SETTINGS_MODULE": "console.settings"}
    run = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode != 0 and "RECKON_LOG_FORMAT" in run.stderr


def capture(formatter: logging.Formatter) -> tuple[logging.Logger, StringIO]:
    stream = StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(f"tests.logging.{id(stream)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return logger, stream


def parsed(stream: StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_fields_bound_around_code_reach_every_record_and_the_caller_s_own_win() -> None:
    logger, stream = capture(JsonFormatter())
    with bound(task_id=3, task_version=5):
        logger.info("inside")
        with bound(op_key="rk-x-1"):
            logger.info("deeper", extra={"task_version": 6})
    logger.info("outside")
    inside, deeper, outside = parsed(stream)
    assert (inside["task_id"], inside["task_version"]) == (3, 5) and "op_key" not in inside
    assert (deeper["task_id"], deeper["task_version"], deeper["op_key"]) == (3, 6, "rk-x-1")
    assert not {"task_id", "task_version", "op_key"} & outside.keys()


def test_a_wake_up_binds_its_task_for_the_records_logged_while_it_runs() -> None:
    """The Celery signals around drive_task(task_id, seen_version) (observability/apps.py); other jobs bind
    nothing, and nothing stays bound after the job."""
    logger, stream = capture(JsonFormatter())
    task_prerun.send(sender=drive_task, task_id="celery-1", task=drive_task, args=(41, 9), kwargs={})
    logger.info("during")
    task_postrun.send(sender=drive_task, task_id="celery-1", task=drive_task, args=(41, 9), kwargs={})
    logger.info("after")
    task_prerun.send(sender=recovery_scan, task_id="celery-2", task=recovery_scan, args=("q",), kwargs={})
    logger.info("scan")
    task_postrun.send(sender=recovery_scan, task_id="celery-2", task=recovery_scan, args=("q",), kwargs={})
    during, after, scan = parsed(stream)
    assert (during["task_id"], during["task_version"]) == (41, 9)
    assert "task_id" not in after and "task_id" not in scan


def test_a_multi_line_message_stays_one_json_line_and_one_text_record() -> None:
    logger, stream = capture(JsonFormatter())
    logger.info("first\nsecond", extra={"op_key": "rk-y-0"})
    [record] = parsed(stream)
    assert record["message"] == "first\nsecond" and record["op_key"] == "rk-y-0"
    text_logger, text = capture(TextFormatter())
    text_logger.info("first\nsecond", extra={"task_id": 1})
    assert text.getvalue().splitlines()[0].endswith("first [task_id=1]")


# --- state changes, from the event log ------------------------------------------------------------------------------


@pytest.fixture
def json_lines() -> Iterator[StringIO]:
    """Every record the root logger prints, as the JSON lines RECKON_LOG_FORMAT=json prints (the settings' filter and
    formatter on a handler of the test's own)."""
    stream = StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield stream
    finally:
        root.removeHandler(handler)


def state_lines(stream: StringIO) -> list[dict[str, Any]]:
    return [r for r in parsed(stream) if r["logger"] == STATE_LOGGER]


@pytest.mark.django_db
def test_a_step_run_logs_each_state_change_once_with_its_task_version_and_op_key(
    store: Simulator, json_lines: StringIO
) -> None:
    """The reference task up to its approval point, one answer dropped on the way: every event the run appended is one
    JSON line — task id, the version it made, the event — and each operation's op key is on the line of its intent
    and on the line of its outcome."""
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    store.fault("accept_then_drop", times=1)
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert report.directive is not None and report.directive.reason == "awaiting_approval"
    lines = state_lines(json_lines)
    events = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", "type"))
    assert [(r["task_id"], r["task_version"], r["event"]) for r in lines] == [(task.pk, s, t) for s, t in events]

    operations = list(Operation.objects.filter(task=task).order_by("pk"))
    assert len(operations) == 6  # six effects up to the approval point
    for op in operations:
        mine = [r for r in lines if r.get("op_key") == op.op_key]
        intents = [r for r in mine if r["message"].startswith("intent registered: ")]
        outcomes = [r for r in mine if r["message"].startswith("outcome recorded: ")]
        assert intents and {r["node"] for r in intents} == {f"p1/{op.node.key}"}, mine
        assert outcomes and outcomes[-1]["outcome"] == "committed", mine
        assert outcomes[-1]["node_status"] == "succeeded" and "node advanced" in outcomes[-1]["message"]
    # The dropped answer: recorded unknown (connection_interrupted), then settled once asked by op key (committed, or
    # not found and sent again under the same op key if the remote had not finished it yet).
    [dropped] = [op for op in operations if op.failure_class == "connection_interrupted"]
    settled = [
        (r["outcome"], r.get("failure_class"))
        for r in lines
        if r.get("op_key") == dropped.op_key and r["message"].startswith("outcome recorded: ")
    ]
    assert settled[0] == ("unknown", "connection_interrupted") and settled[-1] == ("committed", None), settled
    # And the reconcile itself: the runner asked the remote by that op key (tasks/engine/runner.py).
    asked = [
        r for r in parsed(json_lines) if r["logger"] == "tasks.engine.runner" and r.get("op_key") == dropped.op_key
    ]
    assert asked and all(r["message"].startswith("reconcile: asked the remote by op key") for r in asked)
    assert asked[0]["task_id"] == task.pk and isinstance(asked[0]["task_version"], int)


class LosesItsLease:
    """The object store, except that the worker's first call outlasts its lease: past its TTL and grace another
    worker takes the task."""

    def __init__(self, inner: ObjectStoreConnector, task_id: int, clock: Any) -> None:
        self.inner, self.task_id, self.clock, self.calls = inner, task_id, clock, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, op_key: str, request: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.clock.advance(lease_ttl() + lease_grace() + timedelta(seconds=1))
            lease_acquire(task_id=self.task_id, holder_kind="agent", holder_id="worker-2")
        return self.inner.submit(op_key, request)


@pytest.mark.django_db
def test_a_lease_lost_mid_step_is_one_line_with_the_op_key_in_flight(
    store: Simulator, json_lines: StringIO, clock: Any
) -> None:
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    connector = LosesItsLease(ObjectStoreConnector(store.url), task.pk, clock)
    report = run_steps(task_id=task.pk, lease=lease, connector=connector)
    assert report.stopped_by == "lease_lost"
    [sent] = Operation.objects.filter(task=task)
    [stopped] = [r for r in parsed(json_lines) if r["message"].startswith("run stopped: ")]
    assert (stopped["logger"], stopped["refusal"], stopped["task_id"], stopped["op_key"]) == (
        "tasks.engine.runner",
        "lease_lost",
        task.pk,
        sent.op_key,
    )
    intent = next(r for r in state_lines(json_lines) if r.get("op_key") == sent.op_key)
    assert stopped["task_version"] == intent["task_version"]  # the version the run last wrote: its intent
    # The call's outcome was not recorded: no line claims it was (the next holder reconciles it by op key).
    assert [r["event"] for r in state_lines(json_lines) if r.get("op_key") == sent.op_key] == ["operation_dispatched"]


@pytest.mark.django_db
def test_a_refused_change_logs_nothing_and_a_task_s_creation_logs_its_events(json_lines: StringIO) -> None:
    """A change refused by the compare-and-set (a stale version) wrote no event and prints no line; the lines of a
    new task are its events, version by version."""
    task = task_create(kind="copy", title="kept", plan=chain_plan("a"), created_by="agent:m")
    events = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", "type"))
    lines = state_lines(json_lines)
    assert [(r["task_id"], r["task_version"], r["event"]) for r in lines] == [(task.pk, s, t) for s, t in events]
    assert lines[0]["event"] == "task_created" and lines[0]["message"] == "task changed: task_created; task pending"
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    with pytest.raises(VersionConflict):
        operation_start(snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version - 1), "a", lease=lease)
    assert len(state_lines(json_lines)) == len(lines)


def test_every_event_type_the_domain_appends_has_a_line() -> None:
    """An event type added to tasks/ without a line here would be a state change nobody sees in the logs."""
    sources = "\n".join(p.read_text() for p in (ROOT / "tasks").rglob("*.py") if "migrations" not in p.parts)
    appended = set(re.findall(r'\bevent(?:, fields)?\s*=\s*\(?\s*"([a-z_]+)"', sources))
    appended |= set(re.findall(r'\btype="([a-z_]+)"', sources))
    appended |= set(re.findall(r'^[A-Z_]*EVENT = "([a-z_]+)"', sources, re.MULTILINE))
    assert len(appended) > 30
    assert appended <= STATE_EVENTS, appended - STATE_EVENTS
