"""The archive step (tasks/engine/archive.py): an ended task's events move out of the hot table and the log stays the
same log — every column of every row, the chain, the head, what verify_log, the anchors, the timeline and a later
cleanup read. Each test tries to break one promise: nothing leaves the log without its identical copy (the database
refuses it, raw SQL included), nothing archived can be changed or removed, a live, recent, quarantined or unanchored
task stays where it is, and a rewrite of the archive is found like a rewrite of the hot table."""

from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from audit.anchors import anchor_heads
from audit.models import AuditEvent
from leases.clock import ControllableClock
from leases.services import lease_acquire, lease_release
from reference.objectstore import ObjectStoreConnector
from tasks.core.lifecycle import TaskStatus, TempResourceStatus
from tasks.core.outcomes import Committed
from tasks.engine.archive import ARCHIVE_ACTION, archive_ended
from tasks.engine.events import find_log_problem
from tasks.engine.runner import run_steps, run_task_once
from tasks.engine.verification import find_problems, task_quarantine
from tasks.models import ArchivedEvent, ArchivedEventCount, Event, EventRefused, LoggedEvent, Task, TempResource
from tasks.reads.detail import timeline_page
from tests.conftest import as_a_tamperer, chain_plan
from tests.simulator_fixture import Simulator
from tests.steps import record, send
from tests.test_anchoring import KEY
from tests.test_cleanup_paths import staging, start
from tests.test_metrics import TOKEN, samples

pytestmark = pytest.mark.django_db

AFTER = timedelta(days=30)
COLUMNS = "id, task_id, seq, type, payload, prev_digest, digest, created_at"


def raw(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def rows(table: str, task: Task) -> list[tuple[Any, ...]]:
    return raw(f"SELECT {COLUMNS} FROM {table} WHERE task_id = %s ORDER BY seq", [task.pk])  # noqa: S608


def completed(make_task: Callable[..., Task], agent_lease: Callable[..., Any], *keys: str) -> Task:
    task = make_task(chain_plan(*keys))
    lease = agent_lease(task)
    for key in keys:
        record(send(task, lease, key), Committed(remote_id=f"r-{key}"), lease)
    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.COMPLETED
    return task


def running(make_task: Callable[..., Task], agent_lease: Callable[..., Any]) -> Task:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    return Task.objects.get(pk=task.pk)


def test_an_ended_task_moves_whole_and_reads_as_the_same_log(make_task, agent_lease, clock) -> None:
    task = completed(make_task, agent_lease, "a", "b", "c")
    before = rows("tasks_event", task)
    timeline = timeline_page(task, before=None, size=100)
    assert archive_ended(after=AFTER).tasks == 0  # ended just now: stays
    clock.advance(AFTER + timedelta(seconds=1))

    run = archive_ended(after=AFTER)

    assert (run.tasks, run.events, run.batches, run.anchored) == (1, len(before), 1, False)
    assert "heads not anchored" in run.sentence()
    assert rows("tasks_event", task) == []
    assert rows("tasks_archivedevent", task) == before  # every column, as it was
    assert rows("tasks_event_log", task) == before
    assert [e.seq for e in LoggedEvent.objects.filter(task=task)] == list(range(1, task.version + 1))
    assert find_problems(Task.objects.get(pk=task.pk)) == []
    assert timeline_page(task, before=None, size=100) == timeline
    audit = AuditEvent.objects.get(action=ARCHIVE_ACTION)
    assert audit.actor_id == "archive" and audit.details == {"task_ids": [task.pk], "events": len(before)}
    assert archive_ended(after=AFTER).tasks == 0  # nothing left to move: no second audit row
    assert AuditEvent.objects.filter(action=ARCHIVE_ACTION).count() == 1


def test_live_recent_and_quarantined_tasks_stay_in_the_hot_table(make_task, agent_lease, clock) -> None:
    live = running(make_task, agent_lease)
    quarantined = completed(make_task, agent_lease, "q")
    task_quarantine(task_id=quarantined.pk, expected_version=quarantined.version, reason="an operator saw something")
    clock.advance(AFTER + timedelta(seconds=1))
    recent = completed(make_task, agent_lease, "r")
    kept = {t.pk: rows("tasks_event", t) for t in (live, quarantined, recent)}

    assert archive_ended(after=AFTER).tasks == 0
    assert {pk: rows("tasks_event", Task(pk=pk)) for pk in kept} == kept
    assert not ArchivedEvent.objects.exists()


def test_with_anchoring_only_a_head_a_checkpoint_vouches_for_moves(
    make_task, agent_lease, clock, settings: SettingsWrapper, tmp_path: Path
) -> None:
    settings.RECKON_ANCHOR_KEY = KEY
    settings.RECKON_ANCHOR_PATH = str(tmp_path / "anchors" / "heads.log")
    task = completed(make_task, agent_lease, "a")
    clock.advance(AFTER + timedelta(seconds=1))

    waiting = archive_ended(after=AFTER)
    assert (waiting.tasks, waiting.waiting_for_anchor) == (0, 1)
    assert "wait for a checkpoint" in waiting.sentence()

    anchor_heads()
    moved = archive_ended(after=AFTER)
    assert (moved.tasks, moved.waiting_for_anchor, moved.anchored) == (1, 0, True)
    assert find_problems(Task.objects.get(pk=task.pk)) == []  # its anchored head is found in the archive


def test_the_database_refuses_a_delete_without_an_identical_copy(make_task, agent_lease, clock) -> None:
    """The hot table's delete trigger checks every column of the archived copy: a copy with another payload, or
    none, and the row stays. Raw SQL, the ORM and the base manager alike."""
    task = completed(make_task, agent_lease, "a")
    before = rows("tasks_event", task)
    with pytest.raises(DatabaseError), transaction.atomic():
        raw("DELETE FROM tasks_event WHERE task_id = %s", [task.pk])
    # A copy that differs in one column (its type) does not let the row go.
    raw(
        f"INSERT INTO tasks_archivedevent ({COLUMNS}, archived_at)"  # noqa: S608
        " SELECT id, task_id, seq, 'forged', payload, prev_digest, digest, created_at, created_at"
        " FROM tasks_event WHERE task_id = %s",
        [task.pk],
    )
    with pytest.raises(DatabaseError), transaction.atomic():
        raw("DELETE FROM tasks_event WHERE task_id = %s", [task.pk])
    with pytest.raises((EventRefused, DatabaseError)), transaction.atomic():
        Event._base_manager.filter(task=task).delete()
    assert rows("tasks_event", task) == before


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE tasks_archivedevent SET type = 'x' WHERE task_id = %s",
        "DELETE FROM tasks_archivedevent WHERE task_id = %s",
    ],
    ids=["update", "delete"],
)
def test_an_archived_event_cannot_be_changed_or_removed(make_task, agent_lease, clock, statement) -> None:
    task = completed(make_task, agent_lease, "a")
    clock.advance(AFTER + timedelta(seconds=1))
    archive_ended(after=AFTER)
    archived = rows("tasks_archivedevent", task)
    with pytest.raises(DatabaseError), transaction.atomic():
        raw(statement, [task.pk])
    event = ArchivedEvent.objects.filter(task=task).first()
    assert event is not None
    for attempt in (event.save, event.delete, LoggedEvent.objects.filter(task=task).first().save):  # type: ignore[union-attr]
        with pytest.raises(EventRefused):
            attempt()
    assert rows("tasks_archivedevent", task) == archived


@pytest.mark.postgres
def test_the_archive_cannot_be_truncated(make_task, agent_lease, clock) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("TRUNCATE is PostgreSQL's (SQLite empties a table with DELETE, refused above)")
    task = completed(make_task, agent_lease, "a")
    clock.advance(AFTER + timedelta(seconds=1))
    archive_ended(after=AFTER)
    with pytest.raises(DatabaseError), transaction.atomic():
        raw("TRUNCATE tasks_archivedevent CASCADE")
    assert len(rows("tasks_archivedevent", task)) == task.version


def test_a_rewritten_archived_event_is_found_by_verify_log(make_task, agent_lease, clock) -> None:
    task = completed(make_task, agent_lease, "a", "b")
    clock.advance(AFTER + timedelta(seconds=1))
    archive_ended(after=AFTER)
    as_a_tamperer()
    raw(
        "UPDATE tasks_archivedevent SET payload = %s WHERE task_id = %s AND seq = 2",
        ['{"task": {"status": "running"}}', task.pk],
    )
    assert (
        find_log_problem(Task.objects.get(pk=task.pk))
        == "event seq 2 was altered: its digest does not match its content"
    )
    out = StringIO()
    with pytest.raises(Exception, match="failed verification"):
        call_command("verify_log", "--dry-run", "--task", str(task.pk), stdout=out)
    assert f"task {task.pk}: event seq 2 was altered" in out.getvalue()


def test_a_cut_archive_is_found_by_verify_log(make_task, agent_lease, clock) -> None:
    task = completed(make_task, agent_lease, "a", "b")
    clock.advance(AFTER + timedelta(seconds=1))
    archive_ended(after=AFTER)
    as_a_tamperer()
    raw("DELETE FROM tasks_archivedevent WHERE task_id = %s AND seq = %s", [task.pk, task.version])
    assert find_log_problem(Task.objects.get(pk=task.pk)) == (
        f"log ends at seq {task.version - 1} but the task is at version {task.version}"
    )


def test_metrics_count_archived_steps_too(make_task, agent_lease, clock, settings: SettingsWrapper) -> None:
    """A counter never goes down: the steps settled are counted over the whole log, archive included."""
    settings.RECKON_METRICS_TOKEN = TOKEN
    settings.RECKON_METRICS_CACHE_SECONDS = 0.0

    def steps() -> dict[Any, float]:
        text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
        return {key: n for key, n in samples(text).items() if key[0] == "reckon_steps_total"}

    completed(make_task, agent_lease, "a", "b")
    before = steps()
    assert sum(before.values()) >= 2
    clock.advance(AFTER + timedelta(seconds=1))
    assert archive_ended(after=AFTER).tasks == 1
    assert steps() == before
    # A second task's steps, then its move: counted once each time, before and after.
    completed(make_task, agent_lease, "c")
    grown = steps()
    assert sum(grown.values()) == sum(before.values()) + 1
    clock.advance(AFTER + timedelta(seconds=1))
    assert archive_ended(after=AFTER).tasks == 1
    assert steps() == grown


def test_the_archives_count_by_type_is_its_rows_count_by_type(make_task, agent_lease, clock) -> None:
    for keys in (("a", "b"), ("c",), ("d", "e", "f")):
        completed(make_task, agent_lease, *keys)
        clock.advance(AFTER + timedelta(seconds=1))
        archive_ended(after=AFTER)
    counted = dict(ArchivedEventCount.objects.values_list("type", "events"))
    rows = raw("SELECT type, COUNT(*) FROM tasks_archivedevent GROUP BY type")
    assert counted == {kind: n for kind, n in rows} and sum(counted.values()) == ArchivedEvent.objects.count() > 0


def test_a_cleanup_after_the_archive_reads_the_archived_receipts_and_appends_to_the_hot_table(
    store: Simulator, clock: ControllableClock
) -> None:
    """The task completed leaving staging copies (its cleanup not run yet); its log moves. The cleanup then checks
    each locator against the receipts that named it — now in the archive — deletes them, and appends its events to
    the hot table; the log reads whole, and the next run moves the rest."""
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    lease_release(lease=run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url)).lease)
    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.COMPLETED and len(staging(store)) == 3
    clock.advance(AFTER + timedelta(seconds=1))
    assert archive_ended(after=AFTER).events == task.version

    wake = run_task_once(task_id=task.pk, holder_id="worker", connector=ObjectStoreConnector(store.url))

    assert "cleanup: 3 deleted, 0 left" in wake.summary, wake.summary
    assert staging(store) == []
    assert {t.status for t in TempResource.objects.filter(task=task)} == {TempResourceStatus.DELETED}
    task = Task.objects.get(pk=task.pk)
    hot = Event.objects.filter(task=task).count()
    assert hot > 0 and ArchivedEvent.objects.filter(task=task).count() + hot == task.version
    assert find_problems(task) == []
    clock.advance(AFTER + timedelta(seconds=1))
    assert archive_ended(after=AFTER).events == hot
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def test_the_archive_command_reports_and_refuses_bad_arguments(make_task, agent_lease, clock) -> None:
    task = completed(make_task, agent_lease, "a")
    clock.advance(timedelta(seconds=10))
    out = StringIO()
    call_command("archive_events", "--after-seconds", "5", stdout=out)
    assert f"archive_events: archived {task.version} events of 1 tasks in 1 batches" in out.getvalue()
    for bad in (["--limit", "0"], ["--after-seconds", "-1"]):
        with pytest.raises(Exception, match="must"):
            call_command("archive_events", *bad, stdout=StringIO())


def test_the_beat_runs_the_archive_step_after_the_configured_time(make_task, agent_lease, clock, settings) -> None:
    from django.conf import settings as live

    from tasks.jobs import archive_events

    assert live.CELERY_BEAT_SCHEDULE["archive-events"] == {"task": "tasks.archive_events", "schedule": 3600.0}
    settings.RECKON_ARCHIVE_AFTER_SECONDS = 3 * 24 * 3600
    task = completed(make_task, agent_lease, "a")
    clock.advance(timedelta(days=2))
    assert archive_events().startswith("archived 0 events")
    clock.advance(timedelta(days=1, seconds=1))
    assert archive_events().startswith(f"archived {task.version} events of 1 tasks in 1 batches")
    assert Event.objects.filter(task=task).count() == 0
