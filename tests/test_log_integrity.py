"""Holes an adversarial review found in the record, each shown closed (invariants 7 and 9):

- event rows refuse UPDATE and DELETE through the ORM and plain SQL (and TRUNCATE on PostgreSQL);
- the audit table refuses TRUNCATE on PostgreSQL, its head neither rolls back nor disappears, and a missing head is
  found by verify_audit;
- the stored facts a call is made from (an operation's request and target, the task's input refs, a temp
  resource's locator) are compared with the log by verify_log, and checked against the log before they are used;
- a well-chained forged event past the task's version is reported, the task stopped, and the other tasks checked;
- the task row's head of the chain is compared with the log's end.
"""

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit.models import AuditHead
from audit.principals import Principal
from audit.services import audit_append, verify_audit
from tasks.core.errors import StoredFactAltered
from tasks.core.lifecycle import TaskStatus
from tasks.core.outcomes import Committed, NotFound
from tasks.engine.events import event_digest
from tasks.engine.verification import find_problems, input_refs_verified, task_verify_log, temp_locator_verified
from tasks.models import Event, EventRefused, Node, Operation, Task, TempResource
from tests.conftest import as_a_tamperer, chain_plan, copy_node, snapshot
from tests.steps import record, send


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@contextmanager
def refused_by_the_database() -> Iterator[None]:
    """The statement fails in the database, and the test's transaction goes on (a savepoint takes the failure)."""
    with pytest.raises(DatabaseError), transaction.atomic():
        yield


def a_task(make_task: Callable[..., Task], agent_lease: Callable[..., Any]) -> tuple[Task, Any]:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    return Task.objects.get(pk=task.pk), lease


# --- events are append-only in the database ----------------------------------------------------------------------


def test_an_event_cannot_be_updated_or_deleted_through_the_orm(make_task, agent_lease, clock) -> None:
    task, _lease = a_task(make_task, agent_lease)
    before = snapshot()
    event = Event.objects.get(task=task, seq=2)
    event.type = "rewritten"
    for attempt in (
        event.save,
        event.delete,
        lambda: Event.objects.filter(task=task).update(type="x"),
        lambda: Event.objects.filter(task=task).delete(),
    ):
        with pytest.raises(EventRefused):
            attempt()
    assert snapshot() == before


@pytest.mark.parametrize(
    "statement",
    ["UPDATE tasks_event SET type = 'x' WHERE task_id = %s", "DELETE FROM tasks_event WHERE task_id = %s"],
    ids=["update", "delete"],
)
def test_an_event_cannot_be_updated_or_deleted_by_plain_sql(make_task, agent_lease, clock, statement) -> None:
    task, _lease = a_task(make_task, agent_lease)
    before = snapshot()
    with refused_by_the_database():
        raw(statement, [task.pk])
    assert snapshot() == before


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["tasks_event", "audit_auditevent", "audit_audithead"])
def test_the_logs_cannot_be_truncated(make_task, agent_lease, clock, table) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("TRUNCATE is PostgreSQL's (SQLite empties a table with DELETE, refused above)")
    a_task(make_task, agent_lease)
    with transaction.atomic():
        audit_append(actor=Principal.system("test"), action="probe", at=clock.now())
    before = snapshot()
    with refused_by_the_database():
        raw(f"TRUNCATE {table} CASCADE")
    assert snapshot() == before


# --- the audit chain's end ------------------------------------------------------------------------------------------


def two_audit_rows(clock: Any) -> None:
    for index in range(2):
        with transaction.atomic():
            audit_append(actor=Principal.system("test"), action=f"step_{index}", at=clock.now())


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_audithead SET seq = 1",  # rolled back to hide the last row
        "UPDATE audit_audithead SET seq = 3",  # moved past an event that does not exist
        "UPDATE audit_audithead SET digest = 'forged'",
        "DELETE FROM audit_audithead",
    ],
    ids=["roll-back", "skip-ahead", "forge-digest", "delete"],
)
def test_the_audit_head_only_moves_forward_to_the_event_just_appended(clock, db, statement) -> None:
    two_audit_rows(clock)
    before = snapshot()
    with refused_by_the_database():
        raw(statement)
    assert snapshot() == before
    assert verify_audit().problem is None


def test_a_deleted_audit_head_is_found_by_verify_audit(clock, db) -> None:
    two_audit_rows(clock)
    as_a_tamperer()
    raw("DELETE FROM audit_audithead")
    assert not AuditHead.objects.exists()
    verdict = verify_audit()
    assert verdict.problem is not None and "head is missing" in verdict.problem


# --- stored facts that drive a call are covered by the log ----------------------------------------------------------


def test_an_edited_request_is_found_and_never_sent_again(make_task, agent_lease, clock) -> None:
    task, lease = a_task(make_task, agent_lease)
    op = send(task, lease, "b")
    record(op, NotFound(), lease)  # to be sent again with the same op key
    forged = {"action": "store.copy_batch", "input": {"target": "someone-elses-bucket"}}
    from audit.hygiene import digest_of

    # Request and its digest edited together, behind the log's back.
    raw(
        "UPDATE tasks_operation SET request = %s, request_digest = %s WHERE id = %s",
        [json.dumps(forged), digest_of(forged), op.pk],
    )
    assert any("request_digest" in p or "request" in p for p in find_problems(Task.objects.get(pk=task.pk)))
    before = snapshot()
    with pytest.raises(StoredFactAltered):
        send(task, lease, "b")
    assert snapshot() == before


def test_an_edited_target_is_found(make_task, agent_lease, clock) -> None:
    task, _lease = a_task(make_task, agent_lease)
    op = Operation.objects.get(task=task, node__key="a")
    raw("UPDATE tasks_operation SET target = %s WHERE id = %s", ["elsewhere", op.pk])
    assert any("target" in p for p in find_problems(Task.objects.get(pk=task.pk)))


def test_edited_input_refs_are_found_and_not_read_from(make_task, agent_lease, clock) -> None:
    task = make_task({"nodes": [copy_node()]})
    edited = {name: {**ref, "locator": "projects/other"} for name, ref in task.input_refs.items()}
    assert edited, "the copy node reads a versioned source"
    raw("UPDATE tasks_task SET input_refs = %s WHERE id = %s", [json.dumps(edited), task.pk])
    task = Task.objects.get(pk=task.pk)
    assert any("input_refs" in p for p in find_problems(task))
    with pytest.raises(StoredFactAltered):
        input_refs_verified(task)


def test_an_edited_temp_locator_is_found_and_never_deleted(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a-1"]}), lease)
    temp = TempResource.objects.get(task=task)
    temp_locator_verified(temp)  # as recorded: fine
    raw("UPDATE tasks_tempresource SET locator = %s WHERE id = %s", ["customers/everything", temp.pk])
    temp.refresh_from_db()
    assert any("temp resource" in p for p in find_problems(Task.objects.get(pk=task.pk)))
    with pytest.raises(StoredFactAltered):
        temp_locator_verified(temp)


def test_a_temp_row_moved_to_another_node_is_never_deleted(make_task, agent_lease, clock) -> None:
    """The check reads the receipts of the row's own node: a row whose node was changed by hand names a locator no
    receipt of that node named, and nothing is deleted (as with no node at all)."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a-1"]}), lease)
    record(send(task, lease, "b"), Committed(remote_id="r-b"), lease)
    temp = TempResource.objects.get(task=task)
    other = Node.objects.get(task=task, key="b")
    raw("UPDATE tasks_tempresource SET node_id = %s WHERE id = %s", [other.pk, temp.pk])
    temp.refresh_from_db()
    with pytest.raises(StoredFactAltered):
        temp_locator_verified(temp)
    temp.node_id = None
    with pytest.raises(StoredFactAltered):
        temp_locator_verified(temp)


# --- the log's end ----------------------------------------------------------------------------------------------


def test_a_rolled_back_head_on_the_task_row_is_found(make_task, agent_lease, clock) -> None:
    task, _lease = a_task(make_task, agent_lease)
    previous = Event.objects.get(task=task, seq=task.version - 1).digest
    raw("UPDATE tasks_task SET log_head = %s WHERE id = %s", [previous, task.pk])
    assert any("log head" in p for p in find_problems(Task.objects.get(pk=task.pk)))


def test_a_forged_event_past_the_version_is_reported_and_the_other_tasks_still_checked(
    make_task, agent_lease, clock
) -> None:
    forged_task, _lease = a_task(make_task, agent_lease)
    other = make_task(chain_plan("x"))
    seq, prev = forged_task.version + 1, forged_task.log_head
    payload = {"task": {"status": "completed"}}
    at, adapt = clock.now(), connection.ops.adapt_datetimefield_value
    digest = event_digest(
        task_uid=str(forged_task.uid), seq=seq, type="forged", payload=payload, created_at=at.isoformat(), prev=prev
    )
    raw(
        "INSERT INTO tasks_event (task_id, seq, type, payload, prev_digest, digest, created_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s)",
        [forged_task.pk, seq, "forged", json.dumps(payload), prev, digest, adapt(at)],
    )
    out = StringIO()
    with pytest.raises(CommandError, match="1 task"):
        call_command("verify_log", stdout=out)
    assert f"task {forged_task.pk}:" in out.getvalue() and "2 tasks" in out.getvalue()
    stopped = Task.objects.get(pk=forged_task.pk)
    assert stopped.status == TaskStatus.QUARANTINED
    assert task_verify_log(task_id=other.pk).problem is None
