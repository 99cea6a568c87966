"""The event log and the audit chain stay append-only beyond the direct edits tests/test_log_integrity.py tries:
Django's own ways of writing (bulk_update, the base manager cascades use, a task's deletion), the flush between
transactional tests (past the triggers, and only for itself), and the triggers themselves — a missing or disabled
one (dropped by hand, or lost when a later migration makes SQLite rebuild the table) is reported by verify_log and
verify_audit."""

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit.append_only import AUDIT_TRIGGERS, missing_triggers
from audit.models import AuditEvent, AuditHead
from audit.principals import Principal
from audit.services import audit_append, verify_audit
from tasks.engine.verification import EVENT_TRIGGERS
from tasks.models import Event, EventRefused, Task
from tests.conftest import chain_plan


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def refused_by_the_database(sql: str, params: list[Any] | None = None) -> None:
    with pytest.raises(DatabaseError), transaction.atomic():
        raw(sql, params)


def rows(table: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} ORDER BY 1")  # noqa: S608
        return [tuple(row) for row in cursor.fetchall()]


def audited(clock: Any, count: int = 2) -> None:
    for index in range(count):
        with transaction.atomic():
            audit_append(actor=Principal.system("test"), action=f"step_{index}", at=clock.now())


def drop_trigger(table: str, name: str) -> None:
    """What the table's owner can do (and a SQLite table rebuild does). The test's transaction rolls it back."""
    if connection.vendor == "postgresql":
        raw("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE waits for no pending foreign-key check
        raw(f"ALTER TABLE {table} DISABLE TRIGGER {name}")
    else:
        raw(f"DROP TRIGGER {name}")


# --- Django's other ways of writing ---------------------------------------------------------------------------------


def test_bulk_update_and_the_base_manager_cannot_rewrite_events(make_task, clock) -> None:
    """Django uses the base manager for cascades and related objects: the database is the wall there."""
    task = make_task()
    before = rows("tasks_event")
    events = list(Event.objects.filter(task=task))
    for event in events:
        event.type = "rewritten"
    with pytest.raises(EventRefused), transaction.atomic():
        Event.objects.bulk_update(events, ["type"])
    with pytest.raises((EventRefused, DatabaseError)), transaction.atomic():
        Event._base_manager.filter(task=task).update(type="rewritten")
    with pytest.raises((EventRefused, DatabaseError)), transaction.atomic():
        Event._base_manager.filter(task=task).delete()
    assert rows("tasks_event") == before


def test_deleting_a_task_is_refused_with_its_log(make_task, clock) -> None:
    """Nothing in Reckon deletes a task (the admin is read-only, retained objects protect it); a delete would cascade
    to its events, and the database refuses that."""
    task = make_task()
    before = rows("tasks_event")
    with pytest.raises(DatabaseError), transaction.atomic():
        Task.objects.filter(pk=task.pk).delete()
    assert Task.objects.filter(pk=task.pk).exists()
    assert rows("tasks_event") == before


# --- the flush of a transactional test: past the triggers, for itself only ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_leaves_events_and_audit_rows_behind(make_task, clock) -> None:
    make_task(chain_plan("a"))
    audited(clock)
    assert Event.objects.exists()
    assert AuditEvent.objects.exists()
    assert AuditHead.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_flush_after_it_emptied_them_and_left_the_triggers_armed(make_task, clock) -> None:
    assert not Event.objects.exists()
    assert not AuditEvent.objects.exists()
    assert not AuditHead.objects.exists()
    assert missing_triggers(EVENT_TRIGGERS) + missing_triggers(AUDIT_TRIGGERS) == []
    task = make_task(chain_plan("a"))
    audited(clock)
    refused_by_the_database("DELETE FROM tasks_event WHERE task_id = %s", [task.pk])
    refused_by_the_database("DELETE FROM audit_auditevent")
    refused_by_the_database("DELETE FROM audit_audithead")
    call_command("flush", interactive=False, verbosity=0)  # what the test's teardown runs
    assert not Event.objects.exists()
    assert missing_triggers(EVENT_TRIGGERS) + missing_triggers(AUDIT_TRIGGERS) == []
    make_task(chain_plan("a"))
    refused_by_the_database("DELETE FROM tasks_event")


# --- the triggers are there, or the verify commands say so ----------------------------------------------------------


def test_every_append_only_trigger_is_installed_and_enabled(db) -> None:
    assert missing_triggers(EVENT_TRIGGERS) == []
    assert missing_triggers(AUDIT_TRIGGERS) == []


def test_verify_log_reports_a_missing_event_trigger(make_task, clock) -> None:
    make_task()
    call_command("verify_log", stdout=StringIO())
    drop_trigger("tasks_event", "event_no_delete")
    out = StringIO()
    with pytest.raises(CommandError, match="append-only"):
        call_command("verify_log", stdout=out)
    assert "tasks_event.event_no_delete" in out.getvalue()
    assert "1 ok, 0 with problems" in out.getvalue()  # the tasks' records themselves are sound


def test_verify_audit_reports_a_missing_audit_trigger(clock, db) -> None:
    audited(clock)
    assert verify_audit().problem is None
    drop_trigger("audit_audithead", "audit_head_no_delete")
    verdict = verify_audit()
    assert verdict.problem is not None
    assert "audit_audithead.audit_head_no_delete" in verdict.problem
    out = StringIO()
    with pytest.raises(CommandError, match="append-only"):
        call_command("verify_audit", stdout=out)
    assert "audit_head_no_delete" in out.getvalue()
