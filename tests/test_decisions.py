"""The decision rules (tasks/decide/decisions.py) as tables of cases, without a database: a snapshot is built from rows
that were never saved, and every case says what follows an outcome or which directive comes next.

A test here touching the database would fail: none of them asks for the ``db`` fixture.
"""

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings

from tasks.core import opkeys
from tasks.core.errors import (
    BackoffActive,
    BudgetExhausted,
    CancelRequested,
    InputsRecheckRequired,
    NodeNotReady,
    NotFoundNotFinal,
    OperationsOpen,
    TakeoverRequested,
    TaskNotRunnable,
)
from tasks.core.lifecycle import FailureClass, OperationStatus, TaskStatus
from tasks.core.outcomes import NOT_FOUND_NOT_FINAL, Accepted, Committed, Failed, Fenced, NotFound, Outcome, Unprovable
from tasks.decide import decisions
from tasks.decide.change import AtCommit, Snapshot
from tasks.models import Node, Operation, OperationPurpose, Task

NOW = datetime(2030, 1, 1, tzinfo=UTC)
UID = uuid.UUID(int=7)


def task(**fields: Any) -> Task:
    base: dict[str, Any] = {
        "pk": 1,
        "uid": UID,
        "status": "running",
        "version": 5,
        "plan_version": 1,
        "attempt_budget": 10,
        "attempts_used": 1,
        "input_refs": {},
    }
    return Task(**(base | fields))


def node(key: str, pk: int, **fields: Any) -> Node:
    base: dict[str, Any] = {
        "task_id": 1,
        "plan_version": 1,
        "key": key,
        "position": pk,
        "action": "store.copy_batch",
        "evidence": {"remote_id": True},
        "max_attempts": 3,
        "status": "pending",
    }
    return Node(pk=pk, **(base | fields))


def operation(of: Node, status: str, pk: int = 100, **fields: Any) -> Operation:
    base: dict[str, Any] = {
        "task_id": 1,
        "op_key": opkeys.effect(UID, 1, of.key, 0),
        "action": of.action,
        "request": {"action": of.action, "input": {}},
        "status": status,
        "purpose": OperationPurpose.EFFECT,
    }
    op = Operation(pk=pk, **(base | fields))
    op.node = of
    return op


def snap(t: Task, nodes: list[Node], ops: list[Operation] = (), **extra: Any) -> Snapshot:  # type: ignore[assignment]
    return Snapshot(
        task=t, nodes=tuple(nodes), unsettled=tuple(ops), now=NOW, lease_expires_at=NOW + timedelta(seconds=30), **extra
    )


# --- what follows an outcome ----------------------------------------------------------------------------------------

CASES: list[tuple[str, dict[str, Any], Outcome, str, dict[str, Any]]] = [
    # (case, task fields, outcome, event, expected task fields of the change)
    ("commit, last node", {}, Committed(remote_id="r"), "node_succeeded", {"status": "completed"}),
    (
        "commit, budget spent",
        {"attempts_used": 10},
        Committed(remote_id="r"),
        "node_succeeded",
        {"status": "completed"},
    ),
    ("accepted", {}, Accepted(remote_id="job"), "operation_accepted", {"status": "observing"}),
    ("interrupted", {}, Failed(FailureClass.CONNECTION_INTERRUPTED), "operation_unknown", {}),
    ("not found", {}, NotFound(), "operation_not_found", {}),
    ("unprovable", {}, Unprovable(), "operation_unprovable", {"status": "paused", "status_reason": "unprovable"}),
    ("400", {}, Failed(FailureClass.INVALID_PARAMS), "operation_rejected", {"status_reason": "needs_replan"}),
    ("403", {}, Failed(FailureClass.PERMISSION_REVOKED), "operation_rejected", {"status_reason": "permission_revoked"}),
    ("409", {}, Failed(FailureClass.CONFLICT), "operation_rejected", {"status_reason": "version_conflict"}),
    ("503", {}, Failed(FailureClass.DEPENDENCY_UNAVAILABLE), "operation_rejected", {"status": "backing_off"}),
    # A recorded cancel wins over everything: the last open operation settled means stopped.
    (
        "commit after cancel",
        {"cancel_requested_at": NOW, "status": "stopping"},
        Committed(remote_id="r"),
        "node_succeeded",
        {"status": "stopped"},
    ),
    (
        "not found after cancel",
        {"cancel_requested_at": NOW, "status": "stopping"},
        NotFound(),
        "operation_cancelled",
        {"status": "stopped"},
    ),
    (
        "unknown after cancel",
        {"cancel_requested_at": NOW, "status": "stopping"},
        Failed(FailureClass.CONNECTION_INTERRUPTED),
        "operation_unknown",
        {"status": "stopped_pending"},
    ),
    (
        "503 after cancel",
        {"cancel_requested_at": NOW, "status": "stopping"},
        Failed(FailureClass.DEPENDENCY_UNAVAILABLE),
        "operation_rejected",
        {"status": "stopped"},
    ),
    # People hold the task: they decide its status.
    ("commit with people", {"status": "human"}, Committed(remote_id="r"), "node_succeeded", {}),
]


@pytest.mark.parametrize(("fields", "outcome", "event", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_what_follows_an_outcome(
    fields: dict[str, Any], outcome: Outcome, event: str, expected: dict[str, Any]
) -> None:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "dispatched")
    change = decisions.settle(snap(task(**fields), [a], [op]), op, outcome)
    assert change is not None
    assert change.event == event
    assert {k: change.task.get(k) for k in expected} == expected


# --- a final "not found" ----------------------------------------------------------------------------------------

CANCELLED = {"cancel_requested_at": NOW, "status": "stopping"}
SENT = NOW - timedelta(seconds=1)  # the deadline of a request sent a moment ago: not passed at NOW


def _cancelled_with(op_fields: dict[str, Any]) -> tuple[Snapshot, Operation]:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "dispatched", registered_at=NOW - timedelta(minutes=5), **op_fields)
    return snap(task(**CANCELLED), [a], [op]), op


def test_after_a_cancel_a_not_found_before_the_deadline_leaves_the_operation_unknown_and_the_task_stopped_pending() -> (
    None
):
    s, op = _cancelled_with({"not_after": SENT})
    change = decisions.settle(s, op, NotFound())
    assert change is not None and change.event == "operation_not_found_yet"
    assert change.operations == [(op, {"status": "unknown", "failure_class": NOT_FOUND_NOT_FINAL})]
    assert change.task == {"status": "stopped_pending"} and change.nodes == []
    final_at = SENT + settings.RECKON_REMOTE_CLOCK_SKEW
    assert change.data["final_at"] == final_at.isoformat()
    # Until final, the directive waits instead of asking the remote again; at final_at + a moment, it asks.
    unknown = operation(op.node, "unknown", registered_at=op.registered_at, not_after=SENT)
    unknown.failure_class = NOT_FOUND_NOT_FINAL
    waiting = snap(task(**(CANCELLED | {"status": "stopped_pending"})), [op.node], [unknown])
    d = decisions.directive(waiting)
    assert (d.kind, d.op_key, d.until, d.reason) == ("wait", op.op_key, final_at, NOT_FOUND_NOT_FINAL)
    later = replace(waiting, now=final_at + timedelta(milliseconds=1))
    d = decisions.directive(later)
    assert (d.kind, d.op_key, d.fence) == ("reconcile", op.op_key, True)
    # Asked again before it is final, the same not found records nothing new.
    assert decisions.settle(waiting, unknown, NotFound()) is None


def test_after_a_cancel_a_not_found_past_the_deadline_and_skew_closes_the_operation_as_cancelled() -> None:
    past = NOW - settings.RECKON_REMOTE_CLOCK_SKEW - timedelta(milliseconds=1)
    s, op = _cancelled_with({"not_after": past})
    change = decisions.settle(s, op, NotFound())
    assert change is not None and change.event == "operation_cancelled"
    assert change.operations == [(op, {"status": "rejected", "failure_class": "cancelled"})]
    assert change.task == {"status": "stopped"}
    # Exactly at the boundary it is not final yet: the skew allowance is passed only strictly after it.
    s, op = _cancelled_with({"not_after": NOW - settings.RECKON_REMOTE_CLOCK_SKEW})
    change = decisions.settle(s, op, NotFound())
    assert change is not None and change.event == "operation_not_found_yet"


def test_after_a_cancel_a_fence_closes_the_operation_at_once() -> None:
    s, op = _cancelled_with({"not_after": SENT})
    change = decisions.settle(s, op, Fenced())
    assert change is not None and change.event == "operation_cancelled"
    assert change.operations == [(op, {"status": "rejected", "failure_class": "cancelled"})]
    assert change.task == {"status": "stopped"}


def test_a_fenced_op_key_without_a_cancel_is_rejected_and_its_node_runs_again_under_a_new_key() -> None:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "dispatched", not_after=SENT)
    change = decisions.settle(snap(task(), [a], [op]), op, Fenced())
    assert change is not None and change.event == "operation_fenced"
    assert change.operations == [(op, {"status": "rejected", "failure_class": "fenced"})]
    assert change.nodes == [(a, {"status": "pending"})]


def test_an_operation_sent_before_deadlines_existed_takes_its_registration_plus_the_deadline() -> None:
    s, op = _cancelled_with({})
    assert op.not_after is None
    assert decisions.not_found_final_at(op) == op.registered_at + settings.RECKON_REQUEST_DEADLINE + (
        settings.RECKON_REMOTE_CLOCK_SKEW
    )
    change = decisions.settle(s, op, NotFound())  # five minutes ago: final
    assert change is not None and change.event == "operation_cancelled"


def test_a_not_found_is_judged_by_when_the_remote_was_asked_not_when_the_answer_is_written() -> None:
    """The lookup ran before the deadline, the late request landed, the deadline passed, then the answer was
    written: judged at the write it would look final, and the record would deny the landed request."""
    past = NOW - settings.RECKON_REMOTE_CLOCK_SKEW - timedelta(seconds=1)  # final at NOW
    s, op = _cancelled_with({"not_after": past})
    asked_before = past + settings.RECKON_REMOTE_CLOCK_SKEW  # exactly at the boundary: not after it
    change = decisions.settle(s, op, NotFound(), asked_at=asked_before)
    assert change is not None and change.event == "operation_not_found_yet"
    change = decisions.settle(s, op, NotFound(), asked_at=NOW)
    assert change is not None and change.event == "operation_cancelled"


def test_a_cancel_withdraws_only_intents_never_sent_and_leaves_a_sent_one_to_be_made_final() -> None:
    """An intent sent before (its lookup found nothing, to be sent again): a copy may still land, so the cancel
    leaves it unknown — fenced, or looked up past its deadline — instead of closing it as never sent."""
    a, b = node("a", 1, status="running", attempts=1), node("b", 2, status="running", attempts=1)
    never = operation(a, "intent", pk=100, dispatch_count=0)
    sent = operation(b, "intent", pk=101, dispatch_count=1, op_key=opkeys.effect(UID, 1, "b", 0))
    change = decisions.cancel(snap(task(), [a, b], [never, sent]), by="user:ann", reason="withdrawn")
    assert change.operations == [
        (never, {"status": "rejected", "failure_class": "cancelled"}),
        (sent, {"status": "unknown", "failure_class": "awaiting_final"}),
    ]
    assert change.task["status"] == "stopped_pending" and change.nodes == [(a, {"status": "pending"})]
    assert (change.data["withdrawn_intents"], change.data["awaiting_final"]) == ([never.op_key], [sent.op_key])
    left = operation(b, "unknown", pk=101, dispatch_count=1, failure_class="awaiting_final")
    d = decisions.directive(snap(task(**CANCELLED), [a, b], [left]))
    assert (d.kind, d.op_key, d.fence) == ("reconcile", left.op_key, True)


def test_a_refused_re_send_is_held_until_no_earlier_copy_can_land() -> None:
    """The model's finding (P7, REFUSAL_FINAL): not found, sent again under the same key, that copy refused
    (503), then the first copy lands. Rejecting at the refusal would retry the node under a new key: two effects,
    one of them denied by the log. The refusal is held — the operation unknown — until a fence or the deadline."""
    a = node("a", 1, status="running", attempts=1)
    again = operation(a, "dispatched", dispatch_count=2, not_after=SENT, registered_at=NOW - timedelta(minutes=1))
    change = decisions.settle(snap(task(), [a], [again]), again, Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"))
    assert change is not None and change.event == "operation_refused_again"
    assert change.operations == [
        (
            again,
            {"status": "unknown", "failure_class": "awaiting_final", "failure_detail": "dependency_unavailable: 503"},
        )
    ]
    assert change.nodes == [] and change.task == {}
    held = operation(
        a,
        "unknown",
        dispatch_count=2,
        not_after=SENT,
        registered_at=again.registered_at,
        failure_class="awaiting_final",
        failure_detail="dependency_unavailable: 503",
    )
    d = decisions.directive(snap(task(), [a], [held]))
    assert (d.kind, d.fence) == ("reconcile", True)  # asked to fence at once, not looked up
    fenced = decisions.settle(snap(task(), [a], [held]), held, Fenced())
    assert fenced is not None and fenced.event == "operation_fenced"  # final: the node runs again, a new key
    early = decisions.settle(snap(task(), [a], [held]), held, NotFound())  # a remote that cannot fence
    assert early is not None and early.event == "operation_not_found_yet" and early.nodes == []
    past = replace(snap(task(), [a], [held]), now=SENT + settings.RECKON_REMOTE_CLOCK_SKEW + timedelta(seconds=1))
    final = decisions.settle(past, held, NotFound())
    assert final is not None and final.event == "operation_rejected"  # now the held refusal counts, as a 503 does
    assert final.operations[0][1]["failure_class"] == "dependency_unavailable"
    assert isinstance(final.nodes[0][1]["not_before"], AtCommit)  # and backs off as one
    # A first send's refusal is final at once: nothing was sent before it.
    first = operation(a, "dispatched", dispatch_count=1, not_after=SENT)
    change = decisions.settle(snap(task(), [a], [first]), first, Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"))
    assert change is not None and change.event == "operation_rejected"


def test_a_person_may_settle_not_done_only_on_a_final_not_found() -> None:
    s, op = _cancelled_with({"not_after": SENT})
    with pytest.raises(NotFoundNotFinal) as refused:
        decisions.settle_not_done(s, op, by="user:ann")
    assert refused.value.details["final_at"] == (SENT + settings.RECKON_REMOTE_CLOCK_SKEW).isoformat()
    fenced = decisions.settle_not_done(s, op, by="user:ann", fenced=True)
    assert fenced.operations[0][1]["failure_class"] == "not_done" and fenced.data["fenced"] is True
    past = replace(s, now=SENT + settings.RECKON_REMOTE_CLOCK_SKEW + timedelta(milliseconds=1))
    assert decisions.settle_not_done(past, op, by="user:ann").data["fenced"] is False


def test_a_commit_that_is_not_the_last_node_leaves_the_task_running() -> None:
    a, b = node("a", 1, status="running", attempts=1), node("b", 2, depends_on=["a"])
    op = operation(a, "dispatched")
    change = decisions.settle(snap(task(), [a, b], [op]), op, Committed(remote_id="r"))
    assert change is not None and change.task == {} and change.receipts[0].remote_id == "r"
    assert change.nodes[0][1]["status"] == "succeeded"


def test_a_commit_with_the_task_budget_spent_and_work_left_pauses_budget_exhausted() -> None:
    a, b = node("a", 1, status="running", attempts=1), node("b", 2, depends_on=["a"])
    op = operation(a, "dispatched")
    change = decisions.settle(snap(task(attempts_used=10), [a, b], [op]), op, Committed(remote_id="r"))
    assert change is not None
    assert (change.task["status"], change.task["status_reason"]) == ("paused", "budget_exhausted")


def test_a_503_with_the_node_budget_spent_pauses_instead_of_backing_off() -> None:
    a = node("a", 1, status="running", attempts=3)
    op = operation(a, "dispatched")
    change = decisions.settle(snap(task(), [a], [op]), op, Failed(FailureClass.DEPENDENCY_UNAVAILABLE))
    assert change is not None and change.task["status_reason"] == "budget_exhausted"


def test_a_503_backs_off_from_the_commit_time_with_seeded_jitter() -> None:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "dispatched")
    change = decisions.settle(snap(task(), [a], [op]), op, Failed(FailureClass.DEPENDENCY_UNAVAILABLE))
    assert change is not None
    not_before = change.nodes[0][1]["not_before"]
    assert isinstance(not_before, AtCommit) and not_before.offset > timedelta(0)
    again = decisions.settle(snap(task(), [a], [op]), op, Failed(FailureClass.DEPENDENCY_UNAVAILABLE))
    assert again is not None and again.nodes[0][1]["not_before"] == not_before  # deterministic per seed


def test_a_query_that_times_out_on_an_unknown_operation_records_nothing() -> None:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "unknown")
    assert decisions.settle(snap(task(), [a], [op]), op, Failed(FailureClass.CONNECTION_INTERRUPTED)) is None


def test_a_receipt_short_of_the_evidence_fails_the_node_and_keeps_the_receipt() -> None:
    a = node("a", 1, status="running", attempts=1, evidence={"remote_id": True, "count": 100})
    op = operation(a, "dispatched")
    change = decisions.settle(snap(task(), [a], [op]), op, Committed(remote_id="r", count=99))
    assert change is not None and change.event == "evidence_insufficient"
    assert change.nodes[0][1]["status"] == "failed" and len(change.receipts) == 1
    assert change.task["status_reason"] == "needs_replan"


def test_an_unprovable_pause_is_left_with_an_input_recheck_when_a_fact_settles_it() -> None:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "unknown", failure_class="unprovable")
    paused = task(status="paused", status_reason="unprovable", status_detail="x")
    b = node("b", 2, depends_on=["a"])
    change = decisions.settle(snap(paused, [a, b], [op]), op, Committed(remote_id="r"))
    assert change is not None
    assert (change.task["status"], change.task["inputs_recheck_required"]) == ("running", True)


def test_a_committed_compensation_pauses_for_a_replan() -> None:
    a = node("a", 1, status="succeeded", attempts=1, compensation="store.restore_reference")
    op = operation(a, "dispatched", purpose=OperationPurpose.COMPENSATION)
    change = decisions.settle(snap(task(), [a], [op]), op, Committed(remote_id="undo"))
    assert change is not None and change.event == "compensation_committed"
    assert change.task["status_reason"] == "needs_replan"


# --- starting a node ------------------------------------------------------------------------------------------------

REFUSALS: list[tuple[str, dict[str, Any], dict[str, Any], type[Exception]]] = [
    ("cancel recorded", {"cancel_requested_at": NOW, "status": "stopping"}, {}, CancelRequested),
    ("paused", {"status": "paused", "status_reason": "input_changed"}, {}, TaskNotRunnable),
    ("quarantined", {"status": "quarantined"}, {}, TaskNotRunnable),
    ("with people", {"status": "human"}, {}, TaskNotRunnable),
    ("recheck first", {"inputs_recheck_required": True}, {}, InputsRecheckRequired),
    ("task budget", {"attempts_used": 10}, {}, BudgetExhausted),
    ("node budget", {}, {"attempts": 3}, BudgetExhausted),
    ("backoff", {}, {"not_before": NOW + timedelta(seconds=1)}, BackoffActive),
]


@pytest.mark.parametrize(
    ("task_fields", "node_fields", "error"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_start_refuses(task_fields: dict[str, Any], node_fields: dict[str, Any], error: type[Exception]) -> None:
    a = node("a", 1, **node_fields)
    with pytest.raises(error):
        decisions.start(snap(task(**task_fields), [a]), "a")


def test_start_refuses_while_a_takeover_is_reserved_or_an_operation_is_open() -> None:
    a, b = node("a", 1, status="running", attempts=1), node("b", 2)
    with pytest.raises(TakeoverRequested):
        decisions.start(snap(task(), [b], reserved_for="ann"), "b")
    with pytest.raises(OperationsOpen):
        decisions.start(snap(task(), [a, b], [operation(a, "unknown")]), "b")
    with pytest.raises(NodeNotReady):
        decisions.start(snap(task(), [a, node("c", 3, depends_on=["a"])]), "c")


def test_start_spends_an_attempt_on_a_new_op_key_and_none_on_sending_the_same_key_again() -> None:
    a = node("a", 1)
    a.retries = 0  # type: ignore[attr-defined]  # annotated by the snapshot's read: rejected operations so far
    change, op = decisions.start(snap(task(attempts_used=0), [a]), "a")
    assert op.op_key == opkeys.effect(UID, 1, "a", 0)
    assert change.task["attempts_used"] == 1 and change.nodes[0][1]["attempts"] == 1
    # Every send carries its deadline, from the database clock of the commit that marks it sent.
    deadline = {"not_after": AtCommit(settings.RECKON_REQUEST_DEADLINE)}
    assert change.operations[0][1] == {"status": "dispatched", "dispatch_count": 1} | deadline
    sent = replace_op(op, status="intent", dispatch_count=1, request_digest=op.request_digest)
    running = node("a", 1, status="running", attempts=1)
    sent.node = running
    again, same = decisions.start(snap(task(attempts_used=1), [running], [sent]), "a")
    assert same.op_key == op.op_key and "attempts_used" not in again.task and again.nodes == []
    assert again.operations[0][1] == {"status": "dispatched", "dispatch_count": 2} | deadline


def replace_op(op: Operation, **fields: Any) -> Operation:
    new = Operation(**{f.attname: getattr(op, f.attname) for f in Operation._meta.concrete_fields})
    new.pk = 100
    for name, value in fields.items():
        setattr(new, name, value)
    return new


# --- the directive --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_fields", "ops", "expected"),
    [
        ({"status": "completed"}, [], ("done", "")),
        ({"status": "quarantined"}, [], ("stop", "quarantined")),
        ({"status": "human"}, [], ("stop", "human_takeover")),
        ({}, ["unknown"], ("reconcile", "unknown")),
        ({"cancel_requested_at": NOW, "status": "stopping"}, ["dispatched"], ("reconcile", "dispatched")),
        ({"cancel_requested_at": NOW, "status": "stopped_pending"}, [], ("stop", "cancel_requested")),
        ({"status": "paused", "status_reason": "input_changed"}, [], ("stop", "input_changed")),
        ({"inputs_recheck_required": True}, [], ("reconcile", "recheck_inputs")),
        ({}, ["intent"], ("execute", "intent_registered")),
        ({}, [], ("execute", "")),
    ],
)
def test_the_directive(task_fields: dict[str, Any], ops: list[str], expected: tuple[str, str]) -> None:
    a = node("a", 1, status="running" if ops else "pending", attempts=1 if ops else 0)
    d = decisions.directive(snap(task(**task_fields), [a], [operation(a, s) for s in ops]))
    assert (d.kind, d.reason) == expected


def test_the_directive_stops_on_a_lost_or_expired_lease_and_a_reservation() -> None:
    a = node("a", 1)
    assert decisions.directive(replace(snap(task(), [a]), lease_expires_at=None)).reason == "lease_lost"
    assert decisions.directive(replace(snap(task(), [a]), lease_expires_at=NOW)).reason == "lease_expired"
    assert decisions.directive(snap(task(), [a], reserved_for="ann")).reason == "takeover_requested"


def test_the_directive_waits_for_backoff_and_stops_at_an_approval_or_a_spent_budget() -> None:
    later = NOW + timedelta(seconds=5)
    d = decisions.directive(snap(task(), [node("a", 1, not_before=later)]))
    assert (d.kind, d.until) == ("wait", later)
    assert decisions.directive(snap(task(), [node("a", 1, action="approval")])).reason == "awaiting_approval"
    assert decisions.directive(snap(task(), [node("a", 1, attempts=3)])).reason == "budget_exhausted"


def test_an_intent_left_by_not_found_is_executed_again_with_its_op_key_even_on_a_spent_budget() -> None:
    a = node("a", 1, status="running", attempts=3)
    op = operation(a, OperationStatus.INTENT.value, dispatch_count=1)
    d = decisions.directive(snap(task(attempts_used=10), [a], [op]))
    assert (d.kind, d.op_key) == ("execute", op.op_key)


def test_cancel_withdraws_intents_and_waits_for_what_is_in_flight() -> None:
    a, b = node("a", 1, status="running", attempts=1), node("b", 2, status="running", attempts=1)
    change = decisions.cancel(
        snap(task(), [a, b], [operation(a, "intent"), operation(b, "dispatched", pk=101)]), by="user:ann", reason="stop"
    )
    assert change.task["status"] == TaskStatus.STOPPING
    assert [fields["status"] for _op, fields in change.operations] == ["rejected"]


def test_an_unknown_operation_found_unprovable_is_recorded_as_unprovable() -> None:
    a = node("a", 1, status="running", attempts=1)
    op = operation(a, "unknown", failure_class="connection_interrupted")
    change = decisions.settle(snap(task(), [a], [op]), op, Unprovable())
    assert change is not None and change.operations[0][1] == {"failure_class": "unprovable"}
    assert change.task["status_reason"] == "unprovable"


def test_the_next_start_in_a_shared_commit_raises_when_start_disagrees_with_the_directive() -> None:
    # The directive looks at dependencies only; b's input reads a node it does not depend on (a plan would be
    # refused for it): the directive says execute b, start refuses — and next_start says so, never "nothing".
    b, a = node("b", 1, input={"target": {"from": "a", "field": "remote_id"}}), node("a", 2)
    disagreeing = snap(task(), [b, a])
    d = decisions.directive(disagreeing)
    assert (d.kind, d.node_key, d.op_key) == ("execute", "b", "")
    with pytest.raises(NodeNotReady, match="reads a"):
        decisions.next_start(disagreeing)
