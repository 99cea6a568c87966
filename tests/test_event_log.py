"""Invariant 7: the log is the truth. Contiguous, hash-chained, and folding it rebuilds the projection;
any gap or mismatch quarantines the task."""

import json
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.principals import Principal
from leases.models import Lease
from tasks.core.errors import StoredFactAltered
from tasks.core.lifecycle import FailureClass, NodeStatus, TaskStatus
from tasks.core.outcomes import Accepted, Committed, Failed, NotFound, Unprovable
from tasks.engine.events import GENESIS_DIGEST, event_digest, find_log_problem, fold, task_plans
from tasks.engine.verification import operation_request_verified, task_verify_log
from tasks.models import Event, Node, Operation, OperationPurpose, Receipt, Task, TempResource
from tasks.people.cancel import task_request_cancel
from tests.conftest import as_a_tamperer, chain_plan, effect_node, snapshot
from tests.steps import record, send


def quote(name: str) -> str:
    return connection.ops.quote_name(name)


# --- scenarios: each leaves a task with a real log ------------------------------------------------------------------


def run_to_completion(task: Task, lease: Lease, clock: Any) -> None:
    for key in ("a", "b"):
        record(send(task, lease, key), Committed(remote_id=f"r-{key}"), lease)


def back_off_then_succeed(task: Task, lease: Lease, clock: Any) -> None:
    record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
    clock.set(Node.objects.get(task=task, key="a").not_before)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)


def lose_the_answer_then_resend(task: Task, lease: Lease, clock: Any) -> None:
    op = record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED, "timeout"), lease)
    record(op, NotFound(), lease)
    op = send(task, lease, "a")
    record(op, Accepted(remote_id="job-1"), lease)
    record(op, Committed(remote_id="job-1"), lease)


def fall_short_of_the_evidence(task: Task, lease: Lease, clock: Any) -> None:
    record(send(task, lease, "a"), Committed(remote_id="r-a", count=3), lease)


def cancel_while_in_flight(task: Task, lease: Lease, clock: Any) -> None:
    op = send(task, lease, "a")
    task_request_cancel(task_id=task.pk, actor=Principal.agent("tester"), reason="stop")
    record(op, Committed(remote_id="r-a"), lease)


def cancel_an_intent_never_sent(task: Task, lease: Lease, clock: Any) -> None:
    record(send(task, lease, "a"), NotFound(), lease)
    task_request_cancel(task_id=task.pk, actor=Principal.agent("tester"), reason="stop")


def cancel_with_an_unknown(task: Task, lease: Lease, clock: Any) -> None:
    op = record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED, "reset"), lease)
    task_request_cancel(task_id=task.pk, actor=Principal.agent("tester"), reason="stop")
    record(op, Committed(remote_id="r-a"), lease)


def fail_the_task(task: Task, lease: Lease, clock: Any) -> None:
    record(send(task, lease, "a"), Failed(FailureClass.INVALID_PARAMS, "400"), lease)


def pause_unprovable(task: Task, lease: Lease, clock: Any) -> None:
    record(send(task, lease, "a"), Unprovable("no lookup"), lease)


SCENARIOS: dict[str, tuple[dict[str, Any], Callable[[Task, Lease, Any], None]]] = {
    "completion": (chain_plan("a", "b"), run_to_completion),
    "backoff": (chain_plan("a", "b"), back_off_then_succeed),
    "resend": (chain_plan("a", "b"), lose_the_answer_then_resend),
    "evidence": ({"nodes": [effect_node("a", evidence={"remote_id": True, "count": 5})]}, fall_short_of_the_evidence),
    "cancel_in_flight": (chain_plan("a", "b"), cancel_while_in_flight),
    "cancel_intent": (chain_plan("a", "b"), cancel_an_intent_never_sent),
    "cancel_unknown": (chain_plan("a", "b"), cancel_with_an_unknown),
    "fail_task": (chain_plan("a", "b", on_failure={"invalid_params": "fail_task"}), fail_the_task),
    "unprovable": (chain_plan("a", "b"), pause_unprovable),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_protocol_path_leaves_a_contiguous_chained_log_that_rebuilds_the_projection(
    make_task, agent_lease, clock, scenario
) -> None:
    plan, run = SCENARIOS[scenario]
    task = make_task(plan)
    run(task, agent_lease(task), clock)
    task.refresh_from_db()
    events = list(Event.objects.filter(task=task).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, task.version + 1))
    assert [e.prev_digest for e in events] == [GENESIS_DIGEST] + [e.digest for e in events[:-1]]
    assert find_log_problem(task) is None
    before = snapshot()
    verdict = task_verify_log(task_id=task.pk)
    assert (verdict.problem, verdict.quarantined_now) == (None, False)
    assert snapshot() == before


# --- tampering ------------------------------------------------------------------------------------------------------


def in_flight_task(make_task: Any, agent_lease: Any) -> Task:
    """A task with a committed node a and node b's operation dispatched: nine events."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    send(task, lease, "b")
    return Task.objects.get(pk=task.pk)


def alter_a_payload(task: Task) -> None:
    event = Event.objects.get(task=task, seq=4)
    payload = dict(event.payload)
    payload["data"] = {**payload.get("data", {}), "receipt": {"remote_id": "r-forged"}}
    as_a_tamperer()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(Event._meta.db_table)} SET payload = %s WHERE id = %s",  # noqa: S608
            [json.dumps(payload), event.pk],
        )


def delete_a_middle_event(task: Task) -> None:
    as_a_tamperer()
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {quote(Event._meta.db_table)} WHERE task_id = %s AND seq = %s", [task.pk, 3])  # noqa: S608


def delete_the_last_event(task: Task) -> None:
    as_a_tamperer()
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {quote(Event._meta.db_table)} WHERE task_id = %s AND seq = %s",  # noqa: S608
            [task.pk, task.version],
        )


def roll_back_the_last_event(task: Task) -> None:
    """Delete the newest event and put the projection back to what the remaining log says, version included: the
    log and the rows agree again; only the task row's head still names the deleted event."""
    events = list(Event.objects.filter(task=task).order_by("seq"))
    last, rebuilt = events[-1], fold(events[:-1], task_plans(task))
    delete_the_last_event(task)
    fields = {name: rebuilt.task.get(name) for name in last.payload.get("task", {})}
    assert Task.objects.filter(pk=task.pk).update(version=last.seq - 1, **fields) == 1
    for ref, changed in last.payload.get("nodes", {}).items():
        plan, key = ref[1:].split("/", 1)
        before = {name: rebuilt.nodes[ref][name] for name in changed}
        assert Node.objects.filter(task=task, plan_version=int(plan), key=key).update(**before) == 1
    for op_key, changed in last.payload.get("operations", {}).items():
        if op_key not in rebuilt.operations:  # the event inserted it
            assert Operation.objects.filter(op_key=op_key).delete()[0] == 1
            continue
        before = {name: rebuilt.operations[op_key][name] for name in changed}
        assert Operation.objects.filter(op_key=op_key).update(**before) == 1


def mark_a_node_succeeded_without_an_event(task: Task) -> None:
    assert Node.objects.filter(task=task, key="b").update(status=NodeStatus.SUCCEEDED) == 1


def set_the_task_status_directly(task: Task) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(Task._meta.db_table)} SET status = %s WHERE id = %s",  # noqa: S608
            [TaskStatus.COMPLETED.value, task.pk],
        )


TAMPERS: dict[str, Callable[[Task], None]] = {
    "payload": alter_a_payload,
    "middle_event": delete_a_middle_event,
    "last_event": delete_the_last_event,
    "rolled_back_tail": roll_back_the_last_event,
    "node_status": mark_a_node_succeeded_without_an_event,
    "task_status": set_the_task_status_directly,
}


def assert_quarantined_for_tampering(task: Task) -> None:
    verdict = task_verify_log(task_id=task.pk)
    assert verdict.problem is not None
    assert verdict.quarantined_now is True
    stored = Task.objects.get(pk=task.pk)
    assert stored.status == TaskStatus.QUARANTINED
    assert stored.status_detail == verdict.problem[:500]
    last = Event.objects.filter(task=task).order_by("-seq").first()
    assert last is not None
    assert (last.seq, last.type) == (stored.version, "quarantined")
    assert last.payload["data"]["reason"] == verdict.problem[:500]


@pytest.mark.parametrize("tamper", TAMPERS)
def test_tampering_with_the_log_or_the_projection_quarantines_the_task(make_task, agent_lease, clock, tamper) -> None:
    task = in_flight_task(make_task, agent_lease)
    assert find_log_problem(task) is None
    TAMPERS[tamper](task)
    assert find_log_problem(Task.objects.get(pk=task.pk)) is not None
    assert_quarantined_for_tampering(task)
    # Verifying again does not quarantine twice, and the quarantine sticks.
    assert task_verify_log(task_id=task.pk).quarantined_now is False
    assert Event.objects.filter(task=task, type="quarantined").count() == 1
    assert Task.objects.get(pk=task.pk).status == TaskStatus.QUARANTINED


def weaken_the_evidence_spec(task: Task) -> None:
    assert Node.objects.filter(task=task, key="b").update(evidence={}) == 1


def raise_the_attempt_budget(task: Task) -> None:
    assert Task.objects.filter(pk=task.pk).update(attempt_budget=1000) == 1


def forge_a_receipt(task: Task) -> None:
    assert Receipt.objects.filter(operation__task=task).update(remote_id="r-forged") == 1


def turn_an_effect_into_a_compensation(task: Task) -> None:
    """The purpose picks the call: connector.compensate instead of connector.submit, same op key and request."""
    op = Operation.objects.get(task=task, node__key="b")
    assert Operation.objects.filter(pk=op.pk).update(purpose=OperationPurpose.COMPENSATION, compensates=op) == 1


DEFINITION_TAMPERS: dict[str, Callable[[Task], None]] = {
    "node_evidence": weaken_the_evidence_spec,
    "task_budget": raise_the_attempt_budget,
    "receipt": forge_a_receipt,
    "operation_purpose": turn_an_effect_into_a_compensation,
}


@pytest.mark.parametrize("tamper", DEFINITION_TAMPERS)
def test_tampering_with_what_decides_advancement_quarantines_the_task(make_task, agent_lease, clock, tamper) -> None:
    """The rows that decide whether a node may advance (its evidence spec, the budgets, the receipt it advanced on)
    are part of the task's record too: changed without an event, they must not pass verification."""
    task = in_flight_task(make_task, agent_lease)
    DEFINITION_TAMPERS[tamper](task)
    assert_quarantined_for_tampering(task)


# --- manage.py verify_log -------------------------------------------------------------------------------------------


def summary_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("verify_log:")]
    assert len(lines) == 1, output
    return lines[0]


def test_verify_log_prints_a_summary_and_passes_when_every_log_is_sound(make_task, agent_lease, clock) -> None:
    first = in_flight_task(make_task, agent_lease)
    second = make_task()
    events = Event.objects.filter(task__in=[first, second]).count()
    out = StringIO()
    call_command("verify_log", stdout=out)
    assert summary_line(out.getvalue()) == (
        f"verify_log: 2 tasks, {events} events checked; 2 ok, 0 with problems, 0 quarantined now"
    )
    assert not Task.objects.filter(status=TaskStatus.QUARANTINED).exists()


def test_verify_log_quarantines_tampered_tasks_and_fails(make_task, agent_lease, clock) -> None:
    sound = in_flight_task(make_task, agent_lease)
    tampered = in_flight_task(make_task, agent_lease)
    delete_a_middle_event(tampered)
    events = Event.objects.count()
    out = StringIO()
    with pytest.raises(CommandError, match="1 task"):
        call_command("verify_log", stdout=out)
    output = out.getvalue()
    assert f"task {tampered.pk}: gap in the log" in output
    assert summary_line(output) == (
        f"verify_log: 2 tasks, {events} events checked; 1 ok, 1 with problems, 1 quarantined now"
    )
    assert Task.objects.get(pk=tampered.pk).status == TaskStatus.QUARANTINED
    assert Task.objects.get(pk=sound.pk).status != TaskStatus.QUARANTINED


def test_verify_log_dry_run_quarantines_nothing(make_task, agent_lease, clock) -> None:
    in_flight_task(make_task, agent_lease)
    tampered = in_flight_task(make_task, agent_lease)
    mark_a_node_succeeded_without_an_event(tampered)
    before = snapshot()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("verify_log", "--dry-run", stdout=out)
    assert snapshot() == before
    assert f"task {tampered.pk}: node p1/b.status" in out.getvalue()
    assert summary_line(out.getvalue()).endswith("1 ok, 1 with problems, 0 quarantined now")


# --- what a call is made from, beyond the request: its purpose; every temp resource the log recorded ----------------


def test_an_edited_purpose_or_target_is_refused_before_an_operation_is_sent(make_task, agent_lease, clock) -> None:
    task = in_flight_task(make_task, agent_lease)
    op = Operation.objects.get(task=task, node__key="b")
    operation_request_verified(op)  # as registered: fine
    turn_an_effect_into_a_compensation(task)
    with pytest.raises(StoredFactAltered, match=op.op_key):
        operation_request_verified(Operation.objects.get(pk=op.pk))
    assert Operation.objects.filter(pk=op.pk).update(purpose=OperationPurpose.EFFECT, compensates=None) == 1
    assert Operation.objects.filter(pk=op.pk).update(target="projects/someone-else") == 1
    with pytest.raises(StoredFactAltered, match=op.op_key):
        operation_request_verified(Operation.objects.get(pk=op.pk))


def task_with_temp_copies(make_task: Any, agent_lease: Any) -> Task:
    """A completed one-node task whose receipt named two staging copies."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a-1"]}), lease)
    record(send(task, lease, "b"), Committed(remote_id="r-b", data={"temp": ["staging/b-1"]}), lease)
    assert sorted(TempResource.objects.filter(task=task).values_list("locator", flat=True)) == [
        "staging/a-1",
        "staging/b-1",
    ]
    return Task.objects.get(pk=task.pk)


def drop_a_temp_resource(task: Task) -> None:
    """Cleanup would never delete it: the staging copy stays behind, unseen."""
    assert TempResource.objects.filter(task=task, locator="staging/b-1").delete()[0] == 1


def move_a_temp_resource_to_another_node(task: Task) -> None:
    node = Node.objects.get(task=task, key="a")
    assert TempResource.objects.filter(task=task, locator="staging/b-1").update(node=node) == 1


TEMP_TAMPERS: dict[str, Callable[[Task], None]] = {
    "resource_dropped": drop_a_temp_resource,
    "node_moved": move_a_temp_resource_to_another_node,
}


@pytest.mark.parametrize("tamper", TEMP_TAMPERS)
def test_every_temp_resource_the_log_recorded_is_stored_as_recorded(make_task, agent_lease, clock, tamper) -> None:
    task = task_with_temp_copies(make_task, agent_lease)
    assert task_verify_log(task_id=task.pk, quarantine=False).problem is None
    TEMP_TAMPERS[tamper](task)
    verdict = task_verify_log(task_id=task.pk, quarantine=False)
    assert verdict.problem is not None
    assert "staging/b-1" in verdict.problem
    assert_quarantined_for_tampering(task)


# --- a well-chained event that cannot even be read: reported, and the other tasks are still checked ----------------


def forge_an_unreadable_event_past_the_version(task: Task) -> None:
    """An INSERT (the triggers allow appends) of a well-chained event at seq = version + 1 whose payload is not the
    shape folding expects."""
    task = Task.objects.get(pk=task.pk)
    payload: dict[str, Any] = {"nodes": ["not", "a", "mapping"], "operations": 7}
    seq, at = task.version + 1, clock_of(task)
    digest = event_digest(
        task_uid=str(task.uid), seq=seq, type="forged", payload=payload, created_at=at.isoformat(), prev=task.log_head
    )
    Event.objects.create(
        task=task, seq=seq, type="forged", payload=payload, prev_digest=task.log_head, digest=digest, created_at=at
    )


def clock_of(task: Task) -> Any:
    return Event.objects.get(task=task, seq=task.version).created_at


def test_verify_log_reports_an_unreadable_forged_event_and_checks_the_others(make_task, agent_lease, clock) -> None:
    sound = in_flight_task(make_task, agent_lease)
    forged = in_flight_task(make_task, agent_lease)
    tampered = in_flight_task(make_task, agent_lease)
    forge_an_unreadable_event_past_the_version(forged)
    mark_a_node_succeeded_without_an_event(tampered)
    out = StringIO()
    with pytest.raises(CommandError, match="2 task"):
        call_command("verify_log", stdout=out)
    output = out.getvalue()
    assert f"task {forged.pk}: " in output
    assert f"task {tampered.pk}: node p1/b.status" in output
    assert f"task {sound.pk}:" not in output
    assert summary_line(output).startswith("verify_log: 3 tasks")
    assert Task.objects.get(pk=tampered.pk).status == TaskStatus.QUARANTINED
    assert Task.objects.get(pk=forged.pk).status == TaskStatus.QUARANTINED
    assert Task.objects.get(pk=sound.pk).status != TaskStatus.QUARANTINED


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"task": {"status": "running"}, "data": {"op_key": "rk-1", "n": 3, "none": None, "flag": True}},
        {"data": {"note": 'Grüße — ünïcödé \u2028 "quoted" \\ back', "list": [1, 2.5, {"z": 1, "a": [None]}]}},
    ],
    ids=["empty", "fields", "unicode-and-escapes"],
)
def test_the_digest_made_from_the_payloads_text_is_the_canonical_digest(payload: dict[str, Any]) -> None:
    """The compare-and-set serialises a payload once and splices its text into the digest; verification recomputes
    the digest from the stored payload. Both must be the same function of the event."""
    import hashlib

    from audit.hygiene import canonical_json

    whole = canonical_json(
        {"task": "uid-1", "seq": 7, "type": "node_succeeded", "payload": payload, "at": "2030-01-01"}
    )
    expected = hashlib.sha256(("p" * 64 + whole).encode()).hexdigest()
    got = event_digest(
        task_uid="uid-1", seq=7, type="node_succeeded", payload=payload, created_at="2030-01-01", prev="p" * 64
    )
    assert got == expected
