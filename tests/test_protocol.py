"""The step protocol (DESIGN §4), failure branches (§6), cancel (§5) and budgets (invariant 10).

Every test tries to break one rule. Refusals are checked against ``snapshot()``: a refused call writes nothing.
"""

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from audit.hygiene import digest_of
from audit.principals import Principal
from leases.errors import LeaseExpired, LeaseLost, LeaseRefused
from leases.models import Lease
from leases.services import lease_release
from tasks.access.permissions import PermissionDenied
from tasks.core import opkeys
from tasks.core.errors import (
    BackoffActive,
    BudgetExhausted,
    CancelRequested,
    EvidenceInsufficient,
    InputsRecheckRequired,
    InvalidTransition,
    NodeNotReady,
    OperationsOpen,
    TaskError,
    TaskNotRunnable,
    VersionConflict,
)
from tasks.core.failures import backoff
from tasks.core.lifecycle import ChangeKind, FailureClass, NodeStatus, OperationStatus, PauseReason, TaskStatus
from tasks.core.outcomes import Accepted, Committed, Failed, Fenced, NotFound, Unprovable
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.engine.events import find_log_problem
from tasks.engine.plans import plan_accept, plan_propose
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.engine.snapshot import task_snapshot
from tasks.engine.verification import task_quarantine
from tasks.models import Event, Node, Operation, Receipt, Task
from tasks.people.cancel import task_request_cancel
from tests.conftest import SOURCE_REF, chain_plan, copy_node, effect_node, snapshot
from tests.steps import past_deadline, record, send, version

CREATOR = Principal.agent("tester")  # make_task's tasks are created by agent:tester: it may cancel them

# --- helpers: each step reads the task version afresh, as a well-behaved agent does ---------------------------------


def fresh_task(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def fresh_node(task: Task, key: str) -> Node:
    return Node.objects.get(task=task, plan_version=fresh_task(task).plan_version, key=key)


def fresh_op(op: Operation) -> Operation:
    return Operation.objects.get(pk=op.pk)


def complete(task: Task, lease: Lease, key: str) -> Operation:
    return record(send(task, lease, key), Committed(remote_id=f"remote-{key}"), lease)


def interrupted() -> Failed:
    return Failed(FailureClass.CONNECTION_INTERRUPTED, "read timeout after sending")


def parallel_plan(*keys: str, **extra: Any) -> dict[str, Any]:
    """Independent nodes: every one is ready from the start."""
    return {"nodes": [effect_node(key, **extra) for key in keys]}


def evidence_plan() -> dict[str, Any]:
    """One copy node whose receipt must show a remote id, 100 objects, the source digest and the source version."""
    return {"nodes": [copy_node()]}


def satisfying_receipt(**changes: Any) -> Committed:
    fields: dict[str, Any] = {
        "remote_id": "batch-1",
        "remote_version": SOURCE_REF["version"],
        "count": 100,
        "digest": SOURCE_REF["digest"],
    }
    fields.update(changes)
    return Committed(**fields)


def assert_refused(error: type[Exception] | tuple[type[Exception], ...], call: Any) -> Exception:
    before = snapshot()
    with pytest.raises(error) as caught:
        call()
    assert snapshot() == before, "a refused call must write nothing"
    return caught.value


# --- 1. next_directive ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("open_status", ["dispatched", "accepted", "unknown"])
def test_open_operations_are_reconciled_before_any_ready_node_even_after_a_cancel(
    make_task, agent_lease, clock, open_status
) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    if open_status == "accepted":
        record(op, Accepted(remote_id="job-1"), lease)
    elif open_status == "unknown":
        record(op, interrupted(), lease)
    assert fresh_op(op).status == open_status

    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.op_key, directive.node_key) == ("reconcile", op.op_key, "a")

    task_request_cancel(task_id=task.pk, actor=CREATOR, reason="customer withdrew")
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.op_key) == ("reconcile", op.op_key)


def test_an_intent_never_sent_is_executed_again_with_its_op_key(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    record(op, NotFound(), lease)  # the worker died before the call
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.node_key, directive.op_key) == ("execute", "a", op.op_key)


def test_a_node_in_backoff_makes_the_directive_wait_until_not_before(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
    not_before = fresh_node(task, "a").not_before
    assert not_before is not None and not_before > clock.now()

    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.node_key, directive.until) == ("wait", "a", not_before)

    clock.set(not_before)
    assert next_directive(task_id=task.pk, lease=lease).kind == "execute"


def test_a_paused_task_stops_with_its_pause_reason(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.PERMISSION_REVOKED, "403"), lease)
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", PauseReason.PERMISSION_REVOKED)


def test_an_approval_node_stops_awaiting_approval(make_task, agent_lease, clock) -> None:
    task = make_task(
        {
            "nodes": [
                {"key": "confirm", "action": "approval", "evidence": {"remote_id": True}},
                effect_node("a", depends_on=["confirm"]),
            ]
        }
    )
    lease = agent_lease(task)
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.node_key, directive.reason) == ("stop", "confirm", "awaiting_approval")
    assert_refused(NodeNotReady, lambda: send(task, lease, "confirm"))


def test_a_completed_task_is_done(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    complete(task, lease, "a")
    assert next_directive(task_id=task.pk, lease=lease).kind == "execute"
    complete(task, lease, "b")
    assert fresh_task(task).status == TaskStatus.COMPLETED
    assert next_directive(task_id=task.pk, lease=lease).kind == "done"


@pytest.mark.parametrize("how", ["lost", "expired"])
def test_a_lost_or_expired_lease_is_told_to_stop(make_task, agent_lease, clock, how) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task, ttl=timedelta(seconds=30))
    send(task, lease, "a")  # even with an operation to reconcile, a lapsed holder must not touch it
    if how == "expired":
        clock.advance(timedelta(seconds=30))  # exactly at expiry: no longer valid
        expected = "lease_expired"
    else:
        clock.advance(timedelta(seconds=30) + settings.RECKON_LEASE_GRACE + timedelta(seconds=1))
        agent_lease(task, holder="agent-2")
        expected = "lease_lost"
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", expected)


def test_next_directive_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)

    def ask() -> None:
        before = snapshot()
        next_directive(task_id=task.pk, lease=lease)
        assert snapshot() == before

    ask()  # ready node
    op = send(task, lease, "a")
    ask()  # dispatched
    record(op, interrupted(), lease)
    ask()  # unknown
    record(op, NotFound(), lease)
    ask()  # an intent to send again
    op = send(task, lease, "a")
    record(op, interrupted(), lease)
    task_request_cancel(task_id=task.pk, actor=CREATOR, reason="stop")
    ask()  # stopped_pending
    clock.advance(timedelta(hours=1))
    ask()  # expired lease


@pytest.mark.parametrize("budget", ["task", "node"])
def test_next_directive_does_not_direct_work_the_budget_forbids(make_task, agent_lease, clock, budget) -> None:
    """DESIGN §6: when a budget runs out the task pauses. A directive to execute what operation_start must refuse
    would have the agent loop forever."""
    if budget == "task":
        task = make_task(parallel_plan("a", "b"), attempt_budget=1)
        lease = agent_lease(task)
        complete(task, lease, "a")  # the one attempt of the task is spent on a success
    else:
        task = make_task(parallel_plan("a", max_attempts=1))
        lease = agent_lease(task)
        record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
        assert fresh_task(task).status == TaskStatus.PAUSED  # its one attempt failed remotely
    directive = next_directive(task_id=task.pk, lease=lease)
    assert directive.kind == "stop", f"budget used up, yet told to {directive.kind} {directive.node_key}"


# --- 2. operation_start: the operation registered and marked sent in one commit ---------------------------------


def test_start_is_one_commit_registering_the_operation_as_sent_before_the_call(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    at = version(task)
    clock.advance(timedelta(seconds=5))
    op = send(task, lease, "a")
    assert version(task) == at + 1
    stored = fresh_op(op)
    assert (stored.status, stored.dispatch_count, stored.registered_at) == ("dispatched", 1, clock.now())
    assert stored.op_key == opkeys.effect(task.uid, 1, "a", 0)
    # the request stored (its JSON written once, by the decision) is the one sent, under the digest registered
    assert stored.request == op.request and stored.request["action"] == "test.write"
    assert stored.request_digest == digest_of(stored.request) == op.request_digest
    event = Event.objects.get(task=task, seq=at + 1)
    assert (event.type, event.payload["data"]["op_key"]) == ("operation_dispatched", op.op_key)
    node, row = fresh_node(task, "a"), fresh_task(task)
    assert (node.status, node.attempts, node.last_attempt_at) == (NodeStatus.RUNNING, 1, clock.now())
    assert (row.status, row.attempts_used) == (TaskStatus.RUNNING, 1)
    assert find_log_problem(row) is None


def test_start_refuses_a_stale_version(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    stale = version(task)
    complete(task, lease, "a")
    assert_refused(
        VersionConflict,
        lambda: (
            operation_start(
                snapshot_at(task_id=task.pk, lease=lease, expected_version=stale), "b", lease=lease
            ).operation
        ),
    )


def test_start_refuses_a_superseded_lease_epoch(make_task, agent_lease, clock) -> None:
    task = make_task()
    old = agent_lease(task, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=30) + settings.RECKON_LEASE_GRACE + timedelta(seconds=1))
    new = agent_lease(task, holder="agent-2")
    assert new.epoch == old.epoch + 1
    assert_refused(LeaseLost, lambda: send(task, old, "a"))


def test_start_refuses_a_lease_at_its_expiry(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=30))
    assert_refused(LeaseExpired, lambda: send(task, lease, "a"))


def test_a_write_extends_the_lease_by_its_ttl(make_task, agent_lease, clock) -> None:
    """A write is a heartbeat: the lease holder that keeps writing keeps its lease without renewing."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=20))
    complete(task, lease, "a")
    assert Lease.objects.get(pk=lease.pk).expires_at == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=20))  # 40 s after the grant: alive thanks to the writes
    complete(task, lease, "b")
    assert fresh_task(task).status == TaskStatus.COMPLETED


def test_start_refuses_once_a_cancel_is_recorded(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    task_request_cancel(task_id=task.pk, actor=CREATOR, reason="wrong project")
    assert_refused(CancelRequested, lambda: send(task, lease, "a"))
    assert not Operation.objects.filter(task=task).exists()


def test_start_refuses_when_the_task_budget_is_spent(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"), attempt_budget=1)
    lease = agent_lease(task)
    complete(task, lease, "a")
    paused = Task.objects.get(pk=task.pk)
    assert (paused.status, paused.status_reason) == (TaskStatus.PAUSED, PauseReason.BUDGET_EXHAUSTED)
    assert_refused(TaskNotRunnable, lambda: send(task, lease, "b"))


def test_the_start_guard_refuses_a_spent_task_budget_inside_the_compare_and_set(make_task, agent_lease, clock) -> None:
    """Defence in depth: a start computed on a snapshot that still showed budget is refused by the UPDATE."""
    task = make_task(parallel_plan("a", "b"), attempt_budget=2)
    lease = agent_lease(task)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    Task.objects.filter(pk=task.pk).update(attempts_used=2)  # behind the snapshot's back, same version
    error = assert_refused(BudgetExhausted, lambda: operation_start(snap, "a", lease=lease))
    assert isinstance(error, TaskError) and error.details["scope"] == "task"


def test_start_refuses_a_node_whose_attempts_are_spent(make_task, agent_lease, clock) -> None:
    """Defence in depth: however a pending node came to have no attempts left (the protocol itself pauses the task
    first), the start refuses it — on the snapshot, and in the node's conditional UPDATE."""
    task = make_task(parallel_plan("a", max_attempts=2))
    lease = agent_lease(task)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    Node.objects.filter(task=task, key="a").update(attempts=2)
    error = assert_refused(BudgetExhausted, lambda: send(task, lease, "a"))
    assert isinstance(error, TaskError) and error.details["scope"] == "node"
    error = assert_refused(BudgetExhausted, lambda: operation_start(snap, "a", lease=lease))
    assert isinstance(error, TaskError) and error.details["scope"] == "node"


@pytest.mark.django_db(transaction=True)
def test_a_row_that_no_longer_matches_aborts_a_commit_made_outside_any_transaction(make_task, agent_lease) -> None:
    """As a worker writes (autocommit, the database's own clock): on PostgreSQL a step's commit is one statement with
    no transaction around it, so when a row gated on the task row matches nothing — here a node whose attempts were
    spent behind the snapshot's back — the statement aborts itself (reckon_refuse): the task row's new version, the
    operation, the event and the lease's extension it had written go with it. On SQLite the same refusal rolls the
    transaction back."""
    from django.db import connection

    task = make_task(parallel_plan("a", "b", max_attempts=2))
    lease = agent_lease(task)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    Node.objects.filter(task=task, key="a").update(attempts=2)
    assert connection.get_autocommit()  # no transaction around the step: the one-statement commit is what runs
    error = assert_refused(BudgetExhausted, lambda: operation_start(snap, "a", lease=lease))
    assert isinstance(error, TaskError) and error.details["scope"] == "node"
    # and the same snapshot's other node still goes through, whole: the refusal left nothing half-written
    op = operation_start(snap, "b", lease=lease).operation
    assert Task.objects.get(pk=task.pk).version == snap.version + 1
    assert Operation.objects.filter(task=task).count() == 1 and op.op_key
    assert list(Event.objects.filter(task=task).values_list("seq", flat=True)) == list(range(1, snap.version + 2))


def test_start_refuses_before_not_before_and_allows_it_at_not_before(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "rate limited"), lease)
    not_before = fresh_node(task, "a").not_before
    assert not_before is not None
    clock.set(not_before - timedelta(microseconds=1))
    assert_refused(BackoffActive, lambda: send(task, lease, "a"))
    clock.set(not_before)
    assert send(task, lease, "a").status == OperationStatus.DISPATCHED


@pytest.mark.parametrize("open_status", ["dispatched", "accepted", "unknown", "intent"])
def test_start_refuses_while_another_operation_is_unsettled(make_task, agent_lease, clock, open_status) -> None:
    """DESIGN §4.1: one side effect of a task in flight at a time — an intent waiting to be sent again counts."""
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    if open_status == "accepted":
        record(op, Accepted(remote_id="job-1"), lease)
    elif open_status in ("unknown", "intent"):
        record(op, interrupted(), lease)
    if open_status == "intent":
        record(op, NotFound(), lease)
    assert fresh_op(op).status == open_status
    # Another, otherwise ready node. With an accepted operation the task is observing, which refuses first.
    assert_refused((OperationsOpen, TaskNotRunnable), lambda: send(task, lease, "b"))
    if open_status != "intent":
        assert_refused(OperationsOpen, lambda: send(task, lease, "a"))  # the same node


def test_start_refuses_a_node_whose_dependencies_have_not_succeeded(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b", "c"))
    lease = agent_lease(task)
    assert_refused(NodeNotReady, lambda: send(task, lease, "b"))
    op = send(task, lease, "a")
    record(op, Accepted(remote_id="job-1"), lease)  # accepted is not succeeded
    record(op, Committed(remote_id="job-1"), lease)
    assert_refused(NodeNotReady, lambda: send(task, lease, "c"))  # its dependency b has not even started


def test_a_retry_after_a_definite_rejection_gets_a_new_op_key(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    first = send(task, lease, "a")
    record(first, Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
    clock.set(fresh_node(task, "a").not_before)
    retry = send(task, lease, "a")
    assert retry.op_key != first.op_key
    assert retry.op_key == opkeys.effect(task.uid, 1, "a", 1)
    assert retry.request_digest == first.request_digest
    assert fresh_op(first).status == OperationStatus.REJECTED
    assert (fresh_node(task, "a").attempts, fresh_task(task).attempts_used) == (2, 2)  # the remote failed once


def test_from_inputs_are_resolved_from_the_earlier_receipt_not_from_text(make_task, agent_lease, clock) -> None:
    plan = {
        "nodes": [
            effect_node("prepare", action="store.prepare_target", input={"project": "acme"}),
            effect_node(
                "copy",
                depends_on=["prepare"],
                input={
                    "target": {"from": "prepare", "field": "remote_id"},
                    "expected": {"from": "prepare", "field": "count"},
                    "source": {"ref": SOURCE_REF},
                    "limit": 100,
                },
            ),
        ]
    }
    task = make_task(plan)
    lease = agent_lease(task)
    record(
        send(task, lease, "prepare"),
        Committed(
            remote_id="bucket-77",
            count=12,
            data={"remote_id": "bucket-from-text", "note": "the agent said the target is bucket-from-text"},
        ),
        lease,
    )
    op = send(task, lease, "copy")
    assert op.request["input"] == {"target": "bucket-77", "expected": 12, "source": SOURCE_REF, "limit": 100}
    assert op.target == "bucket-77"


# --- 3. sending the same op key again is not a new attempt ----------------------------------------------------------


def test_not_found_sends_the_same_op_key_again_without_spending_an_attempt(make_task, agent_lease, clock) -> None:
    """A crash between the start's commit and the call, then a lookup that finds nothing, re-sends the same op key:
    that is the same attempt. Three such crashes on a node of two attempts never exhaust its budget."""
    task = make_task(parallel_plan("a", max_attempts=2), attempt_budget=2)
    lease = agent_lease(task)
    op = send(task, lease, "a")
    for round_ in range(3):
        record(op, NotFound(), lease)  # the worker died before the call: the remote has no trace
        assert fresh_op(op).status == OperationStatus.INTENT
        directive = next_directive(task_id=task.pk, lease=lease)
        assert (directive.kind, directive.op_key) == ("execute", op.op_key)
        again = send(task, lease, "a")
        assert (again.op_key, fresh_op(op).dispatch_count) == (op.op_key, round_ + 2)
        assert (fresh_node(task, "a").attempts, fresh_task(task).attempts_used) == (1, 1)
    record(op, Committed(remote_id="r-a"), lease)
    assert fresh_task(task).status == TaskStatus.COMPLETED


def test_a_stored_request_edited_behind_the_log_is_not_sent_again(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    record(op, NotFound(), lease)
    Operation.objects.filter(pk=op.pk).update(request={"action": "store.copy_batch", "input": {"evil": True}})
    assert_refused(EvidenceInsufficient, lambda: send(task, lease, "a"))


# --- 3b. the table: which principal may make which change in which status, inside the compare-and-set -----------


def _intent_to_resend(make_task, agent_lease) -> tuple[Task, Lease, Operation]:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    record(op, NotFound(), lease)
    assert fresh_op(op).status == OperationStatus.INTENT
    return task, lease, op


def test_an_intent_is_not_sent_again_once_the_task_is_quarantined(make_task, agent_lease, clock) -> None:
    task, lease, _op = _intent_to_resend(make_task, agent_lease)
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="log and rows disagree")
    assert_refused(TaskNotRunnable, lambda: send(task, lease, "a"))


def test_an_intent_is_not_sent_again_while_paused_input_changed(make_task, agent_lease, clock) -> None:
    task, lease, _op = _intent_to_resend(make_task, agent_lease)
    pause = Change(
        event="paused", task={"status": "paused", "status_reason": "input_changed", "status_detail": "source moved"}
    )
    compare_and_set(task.pk, version(task), pause, lease=lease)
    assert_refused(TaskNotRunnable, lambda: send(task, lease, "a"))


def test_no_start_is_made_with_a_stale_snapshot_after_the_task_moved(make_task, agent_lease, clock) -> None:
    """The decision is made on a snapshot; the compare-and-set refuses it if anything moved since."""
    task, lease, _op = _intent_to_resend(make_task, agent_lease)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="log and rows disagree")
    assert_refused(VersionConflict, lambda: operation_start(snap, "a", lease=lease))


@pytest.mark.parametrize("status", ["quarantined", "human", "paused", "stopping", "completed"])
def test_the_compare_and_set_refuses_a_start_the_table_does_not_permit(make_task, agent_lease, clock, status) -> None:
    """Whatever a caller computed, an agent's START lands only in a runnable status: the UPDATE's own condition."""
    task = make_task(parallel_plan("a"))
    lease = agent_lease(task)
    Task.objects.filter(pk=task.pk).update(
        status=status,
        status_reason="needs_replan" if status == "paused" else "",
        status_detail="x",
        cancel_requested_at=clock.now() if status == "stopping" else None,
    )
    forged = Change(event="operation_dispatched", kind=ChangeKind.START, task={"attempts_used": 1})
    assert_refused(TaskNotRunnable, lambda: compare_and_set(task.pk, version(task), forged, lease=lease))


def test_an_intent_is_not_sent_again_before_the_inputs_are_rechecked(make_task, agent_lease, clock) -> None:
    task = make_task({"nodes": [copy_node()]})
    lease = agent_lease(task)
    op = send(task, lease, "copy")
    record(op, NotFound(), lease)
    Task.objects.filter(pk=task.pk).update(inputs_recheck_required=True)  # as a hand-back leaves it
    assert_refused(InputsRecheckRequired, lambda: send(task, lease, "copy"))
    snap = task_snapshot(task_id=task.pk, lease=lease)
    forged = Change(event="operation_dispatched", kind=ChangeKind.START, requires={"inputs_recheck_required": False})
    assert_refused(InputsRecheckRequired, lambda: compare_and_set(task.pk, snap.version, forged, lease=lease))


def test_a_late_outcome_never_advances_a_node_of_a_quarantined_task(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="log and rows disagree")
    assert_refused(TaskNotRunnable, lambda: record(op, Committed(remote_id="r-a"), lease))
    assert fresh_node(task, "a").status == NodeStatus.RUNNING


def test_no_agent_lease_is_granted_on_a_task_people_hold(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a"))
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.HUMAN.value)  # an operator released without deciding
    assert_refused(LeaseRefused, lambda: agent_lease(task))


def test_an_agent_or_system_cancels_only_what_it_created_or_holds(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a"))  # created by agent:tester
    lease = agent_lease(task, holder="worker-1")
    for stranger in (Principal.agent("someone-else"), Principal.system("cron")):
        assert_refused(PermissionDenied, lambda s=stranger: task_request_cancel(actor=s, task_id=task.pk, reason="x"))
    holder = Principal.agent("worker-1")
    assert_refused(PermissionDenied, lambda: task_request_cancel(actor=holder, task_id=task.pk, reason="x"))
    done = task_request_cancel(actor=holder, task_id=task.pk, reason="the holder stops", lease=lease)
    assert done.cancel_requested_at is not None


def test_a_plan_is_not_accepted_without_a_lease_while_someone_holds_the_task(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a"))
    lease = agent_lease(task)
    revision = plan_propose(
        task_id=task.pk,
        plan=parallel_plan("a", "b"),
        proposed_by="agent:tester",
        expected_version=version(task),
        lease=lease,
    )
    assert_refused(
        TaskNotRunnable, lambda: plan_accept(revision_id=revision.pk, expected_version=version(task), lease=None)
    )
    assert plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease).plan_version == 2


def test_no_plan_is_proposed_on_a_quarantined_task(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a"))
    lease = agent_lease(task)
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="log and rows disagree")
    assert_refused(
        TaskNotRunnable,
        lambda: plan_propose(
            task_id=task.pk,
            plan=parallel_plan("a", "b"),
            proposed_by="agent:tester",
            expected_version=version(task),
            lease=lease,
        ),
    )


# --- 4. record_outcome ---------------------------------------------------------------------------------------------


def test_a_satisfying_receipt_is_persisted_and_advances_the_node_in_one_transaction(
    make_task, agent_lease, clock
) -> None:
    task = make_task(evidence_plan())
    lease = agent_lease(task)
    op = send(task, lease, "copy")
    stale = version(task) - 1
    assert_refused(
        VersionConflict,
        lambda: (
            record_outcome(
                snapshot_at(task_id=op.task_id, lease=lease, expected_version=stale),
                op.op_key,
                satisfying_receipt(),
                lease=lease,
            ).operation
        ),
    )
    assert not Receipt.objects.filter(operation=op).exists()

    record(op, satisfying_receipt(), lease)
    receipt = Receipt.objects.get(operation=op)
    assert (receipt.remote_id, receipt.remote_version, receipt.count, receipt.digest) == (
        "batch-1",
        "7",
        100,
        SOURCE_REF["digest"],
    )
    assert receipt.committed_after_cancel_request is False
    node = fresh_node(task, "copy")
    assert node.status == NodeStatus.SUCCEEDED
    assert node.output == {"remote_id": "batch-1", "remote_version": "7", "count": 100, "digest": SOURCE_REF["digest"]}
    assert fresh_op(op).status == OperationStatus.COMMITTED
    assert fresh_task(task).status == TaskStatus.COMPLETED
    assert Event.objects.get(task=task, seq=version(task)).type == "node_succeeded"


@pytest.mark.parametrize(
    ("shortfall", "reason"),
    [
        ({"count": 99}, PauseReason.NEEDS_REPLAN),
        ({"digest": "sha256:" + "cd" * 32}, PauseReason.NEEDS_REPLAN),
        ({"count": None}, PauseReason.NEEDS_REPLAN),
        ({"remote_version": "8"}, PauseReason.VERSION_CONFLICT),
        ({"remote_version": ""}, PauseReason.VERSION_CONFLICT),
    ],
)
def test_a_receipt_short_of_the_evidence_is_kept_but_never_advances_the_node(
    make_task, agent_lease, clock, shortfall, reason
) -> None:
    task = make_task(evidence_plan())
    lease = agent_lease(task)
    op = record(send(task, lease, "copy"), satisfying_receipt(**shortfall), lease)
    assert op.status == OperationStatus.COMMITTED  # the remote did commit: that fact is recorded, not faked away
    receipt = Receipt.objects.get(operation=op)
    field, value = next(iter(shortfall.items()))
    assert getattr(receipt, field) == value
    node = fresh_node(task, "copy")
    assert (node.status, node.last_error_class) == (NodeStatus.FAILED, "evidence_insufficient")
    stored = fresh_task(task)
    assert (stored.status, stored.status_reason) == (TaskStatus.PAUSED, reason)
    assert field in stored.status_detail


def test_a_receipt_without_a_remote_id_never_advances_the_node(make_task, agent_lease, clock) -> None:
    task = make_task(evidence_plan())
    lease = agent_lease(task)
    op = send(task, lease, "copy")
    try:
        record(op, satisfying_receipt(remote_id=""), lease)
    except TaskError:
        assert fresh_op(op).status == OperationStatus.DISPATCHED  # refused by name, nothing written
    else:
        assert fresh_task(task).status == TaskStatus.PAUSED
    assert fresh_node(task, "copy").status != NodeStatus.SUCCEEDED


def test_dispatched_is_never_evidence_and_a_short_receipt_fails_the_node(make_task, agent_lease, clock) -> None:
    task = make_task(evidence_plan())
    lease = agent_lease(task)
    op = send(task, lease, "copy")
    assert fresh_node(task, "copy").status == NodeStatus.RUNNING  # "may have been sent" proves nothing
    record(op, satisfying_receipt(count=99), lease)
    assert fresh_node(task, "copy").status == NodeStatus.FAILED
    assert Receipt.objects.filter(operation=op).count() == 1  # kept as what the remote said


@pytest.mark.parametrize("state", ["intent", "committed", "rejected"])
def test_record_outcome_refuses_an_operation_with_nothing_outstanding(make_task, agent_lease, clock, state) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = send(task, lease, "a")
    if state == "committed":
        op = record(op, Committed(remote_id="r-a"), lease)
    elif state == "rejected":
        op = record(op, Failed(FailureClass.INVALID_PARAMS, "400"), lease)
    else:
        op = record(op, NotFound(), lease)
    assert op.status == state
    assert_refused(InvalidTransition, lambda: record(op, Committed(remote_id="r-other"), lease))
    assert Receipt.objects.filter(operation=op).count() == (1 if state == "committed" else 0)


def test_accepted_puts_the_node_and_the_task_in_observing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Accepted(remote_id="job-9"), lease)
    assert (op.status, op.remote_id) == (OperationStatus.ACCEPTED, "job-9")
    assert fresh_node(task, "a").status == NodeStatus.OBSERVING
    assert fresh_task(task).status == TaskStatus.OBSERVING
    assert not Receipt.objects.filter(operation=op).exists()
    record(op, Committed(remote_id="job-9"), lease)
    assert fresh_node(task, "a").status == NodeStatus.SUCCEEDED
    assert fresh_task(task).status == TaskStatus.RUNNING


@pytest.mark.parametrize(
    ("on_failure", "task_status", "reason"),
    [({}, TaskStatus.PAUSED, PauseReason.NEEDS_REPLAN), ({"invalid_params": "fail_task"}, TaskStatus.FAILED, "")],
)
def test_invalid_params_fails_the_node(make_task, agent_lease, clock, on_failure, task_status, reason) -> None:
    task = make_task(chain_plan("a", "b", on_failure=on_failure))
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Failed(FailureClass.INVALID_PARAMS, "400 schema error"), lease)
    assert (op.status, op.failure_class) == (OperationStatus.REJECTED, FailureClass.INVALID_PARAMS)
    node = fresh_node(task, "a")
    assert (node.status, node.last_error_class, node.next_allowed_action) == (
        NodeStatus.FAILED,
        "invalid_params",
        "replan",
    )
    stored = fresh_task(task)
    assert (stored.status, stored.status_reason) == (task_status, reason)
    assert next_directive(task_id=task.pk, lease=lease).kind == "stop"


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (FailureClass.PERMISSION_REVOKED, PauseReason.PERMISSION_REVOKED),
        (FailureClass.CONFLICT, PauseReason.VERSION_CONFLICT),
    ],
)
def test_permission_revoked_and_conflict_pause_the_task(make_task, agent_lease, clock, failure, reason) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Failed(failure, "403"), lease)
    assert op.status == OperationStatus.REJECTED
    stored = fresh_task(task)
    assert (stored.status, stored.status_reason) == (TaskStatus.PAUSED, reason)
    node = fresh_node(task, "a")
    assert (node.status, node.last_error_class) == (NodeStatus.PENDING, failure)
    assert_refused(TaskError, lambda: send(task, lease, "a"))


def test_dependency_unavailable_backs_off_with_seeded_jitter_on_the_database_clock(
    make_task, agent_lease, clock
) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = send(task, lease, "a")
    clock.advance(timedelta(seconds=3))
    failed_at = clock.now()
    record(op, Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
    expected = backoff(now=failed_at, attempt=1, seed=f"{task.uid}:a")
    node = fresh_node(task, "a")
    assert node.not_before == expected.not_before
    assert (node.status, node.last_error_class, node.next_allowed_action) == (
        NodeStatus.PENDING,
        "dependency_unavailable",
        "retry",
    )
    assert fresh_task(task).status == TaskStatus.BACKING_OFF
    assert fresh_op(op).status == OperationStatus.REJECTED


@pytest.mark.parametrize(
    ("budget", "max_attempts", "attempt_budget", "failures"), [("node", 2, 20, 2), ("task", 3, 1, 1)]
)
def test_dependency_unavailable_pauses_budget_exhausted_when_attempts_run_out(
    make_task, agent_lease, clock, budget, max_attempts, attempt_budget, failures
) -> None:
    task = make_task(parallel_plan("a", max_attempts=max_attempts), attempt_budget=attempt_budget)
    lease = agent_lease(task)
    for attempt in range(1, failures + 1):
        record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
        stored = fresh_task(task)
        if attempt < failures:
            assert stored.status == TaskStatus.BACKING_OFF
            clock.set(fresh_node(task, "a").not_before)
    assert (stored.status, stored.status_reason) == (TaskStatus.PAUSED, PauseReason.BUDGET_EXHAUSTED)
    node = fresh_node(task, "a")
    assert (node.attempts, node.next_allowed_action, node.status) == (failures, "takeover", NodeStatus.PENDING)
    assert next_directive(task_id=task.pk, lease=lease).kind == "stop"


def test_backoff_is_deterministic_per_seed_and_differs_across_seeds(clock) -> None:
    now = clock.now()
    first = backoff(now=now, attempt=3, seed="task-1:a")
    assert backoff(now=now, attempt=3, seed="task-1:a") == first
    delays = {backoff(now=now, attempt=3, seed=f"task-{n}:a").delay for n in range(20)}
    assert len(delays) > 10


def test_backoff_stays_within_a_quarter_of_the_capped_exponential(clock) -> None:
    base, cap = settings.RECKON_BACKOFF_BASE, settings.RECKON_BACKOFF_CAP
    now = clock.now()
    for attempt in range(1, 101):
        raw = timedelta(seconds=min(cap.total_seconds(), base.total_seconds() * 2 ** (attempt - 1)))
        for n in range(10):
            wait = backoff(now=now, attempt=attempt, seed=f"task-{n}:copy")
            assert raw * 0.75 <= wait.delay <= raw * 1.25, (attempt, n, wait.delay)
            assert wait.not_before == now + wait.delay
    assert backoff(now=now, attempt=100, seed="x").delay <= cap * 1.25


def test_connection_interrupted_leaves_the_operation_unknown(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    assert (op.status, op.failure_class) == (OperationStatus.UNKNOWN, FailureClass.CONNECTION_INTERRUPTED)
    assert fresh_node(task, "a").status == NodeStatus.RUNNING  # neither failed nor done: nobody knows yet
    assert fresh_task(task).status == TaskStatus.RUNNING
    assert not Receipt.objects.filter(operation=op).exists()
    assert_refused(OperationsOpen, lambda: send(task, lease, "a"))  # never re-sent blindly
    assert next_directive(task_id=task.pk, lease=lease).kind == "reconcile"


def test_a_second_interrupted_report_on_an_unknown_operation_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    before = snapshot()
    again = record(op, interrupted(), lease)
    assert again.status == OperationStatus.UNKNOWN
    assert snapshot() == before


@pytest.mark.parametrize(
    ("outcome", "op_status", "node_status"),
    [
        (Committed(remote_id="r-1"), OperationStatus.COMMITTED, NodeStatus.SUCCEEDED),
        (Accepted(remote_id="job-1"), OperationStatus.ACCEPTED, NodeStatus.OBSERVING),
        (NotFound(), OperationStatus.INTENT, NodeStatus.RUNNING),
        (Failed(FailureClass.INVALID_PARAMS, "400"), OperationStatus.REJECTED, NodeStatus.FAILED),
        (Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), OperationStatus.REJECTED, NodeStatus.PENDING),
    ],
)
def test_an_unknown_operation_is_settled_by_a_query_result(
    make_task, agent_lease, clock, outcome, op_status, node_status
) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    settled = record(op, outcome, lease)
    assert settled.status == op_status
    assert fresh_node(task, "a").status == node_status
    assert find_log_problem(fresh_task(task)) is None


def test_not_found_puts_the_operation_back_to_intent_with_the_same_op_key(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    record(op, NotFound(), lease)
    assert Operation.objects.filter(task=task).count() == 1
    assert fresh_op(op).status == OperationStatus.INTENT
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.op_key) == ("execute", op.op_key)
    resent = send(task, lease, "a")
    assert (resent.pk, resent.op_key, resent.dispatch_count) == (op.pk, op.op_key, 2)


def test_unprovable_pauses_the_task_unprovable(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Unprovable("no idempotency key, no lookup"), lease)
    assert (op.status, op.failure_class) == (OperationStatus.UNKNOWN, "unprovable")
    stored = fresh_task(task)
    assert (stored.status, stored.status_reason) == (TaskStatus.PAUSED, PauseReason.UNPROVABLE)
    before = snapshot()
    record(op, Unprovable("still"), lease)
    assert snapshot() == before
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.op_key) == ("reconcile", op.op_key)


def test_an_unprovable_operation_is_still_settled_when_its_outcome_is_learned(make_task, agent_lease, clock) -> None:
    """Invariant 4: unknowns are always eventually settled — also the last node's, while the task is paused."""
    task = make_task(parallel_plan("a"))
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Unprovable("no lookup"), lease)
    record(op, Committed(remote_id="r-a"), lease)
    assert fresh_op(op).status == OperationStatus.COMMITTED
    assert fresh_node(task, "a").status == NodeStatus.SUCCEEDED


def test_a_task_leaving_an_unprovable_pause_rereads_its_inputs_before_any_node_runs(
    make_task, agent_lease, clock
) -> None:
    """DESIGN §4: before a node runs after a pause, its input refs are checked again with the real source."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Unprovable("no lookup"), lease)
    assert fresh_task(task).status == TaskStatus.PAUSED
    record(op, Committed(remote_id="r-a"), lease)  # the remote became queryable and proved it
    resumed = fresh_task(task)
    assert (resumed.status, resumed.inputs_recheck_required) == (TaskStatus.RUNNING, True)
    assert next_directive(task_id=task.pk, lease=lease).reason == "recheck_inputs"
    assert_refused(InputsRecheckRequired, lambda: send(task, lease, "b"))


# --- 5. cancel -----------------------------------------------------------------------------------------------------


def test_cancel_leaves_an_intent_already_sent_to_be_made_final(make_task, agent_lease, clock) -> None:
    """The model's finding (P7): an intent left by a "not found" was sent once — a copy may still land. A cancel
    does not close it as never sent: it stays unknown until the remote fences its op key (or its deadline
    passes), and only then is it cancelled."""
    task = make_task()
    lease = agent_lease(task)
    op = send(task, lease, "a")
    record(op, NotFound(), lease)  # not found yet: an intent to send again, under the same key
    task_request_cancel(task_id=task.pk, actor=CREATOR, reason="wrong target")
    left = fresh_op(op)
    assert (left.status, left.failure_class) == (OperationStatus.UNKNOWN, "awaiting_final")
    assert fresh_task(task).status == TaskStatus.STOPPED_PENDING
    assert_refused(TaskError, lambda: send(task, lease, "a"))  # nothing is sent again after the cancel
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.op_key, d.fence) == ("reconcile", op.op_key, True)
    record(op, Fenced(), lease)
    withdrawn = fresh_op(op)
    assert (withdrawn.status, withdrawn.failure_class, withdrawn.dispatch_count) == (
        OperationStatus.REJECTED,
        "cancelled",
        1,
    )
    assert fresh_node(task, "a").status == NodeStatus.PENDING
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert next_directive(task_id=task.pk, lease=lease).kind == "stop"


def test_a_commit_arriving_after_the_cancel_is_recorded_as_a_real_completion(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = send(task, lease, "a")
    stopping = task_request_cancel(task_id=task.pk, actor=CREATOR, reason="stop")
    assert stopping.status == TaskStatus.STOPPING
    assert stopping.cancel_requested_at is not None
    record(op, Committed(remote_id="r-a"), lease)
    assert fresh_node(task, "a").status == NodeStatus.SUCCEEDED
    assert Receipt.objects.get(operation=op).committed_after_cancel_request is True
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert fresh_node(task, "b").status == NodeStatus.PENDING
    assert_refused(TaskError, lambda: send(task, lease, "b"))


def test_a_cancel_with_only_an_unknown_left_is_stopped_pending_until_reconciled(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=timedelta(minutes=2))  # outlives the request's deadline
    op = record(send(task, lease, "a"), interrupted(), lease)
    cancelled = task_request_cancel(task_id=task.pk, actor=CREATOR, reason="x")
    assert cancelled.status == TaskStatus.STOPPED_PENDING
    record(op, interrupted(), lease)  # the query itself timed out: still pending
    assert fresh_task(task).status == TaskStatus.STOPPED_PENDING
    record(op, NotFound(), lease)  # not found, but a late request could still land: not final yet
    waiting = fresh_op(op)
    assert (waiting.status, waiting.failure_class) == (OperationStatus.UNKNOWN, "not_found_not_final")
    assert fresh_task(task).status == TaskStatus.STOPPED_PENDING
    past_deadline(clock, op)
    record(op, NotFound(), lease)  # never took effect, and now nothing can: withdrawn, not sent again
    settled = fresh_op(op)
    assert (settled.status, settled.failure_class) == (OperationStatus.REJECTED, "cancelled")
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert fresh_node(task, "a").status == NodeStatus.PENDING


def test_an_unknown_found_still_running_after_a_cancel_shows_stopping(make_task, agent_lease, clock) -> None:
    """DESIGN §5: "stopped with pending reconciliation" must not be shown while work is still running remotely."""
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    task_request_cancel(task_id=task.pk, actor=CREATOR, reason="x")
    record(op, Accepted(remote_id="job-1"), lease)
    assert fresh_task(task).status == TaskStatus.STOPPING
    record(op, Committed(remote_id="job-1"), lease)
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert Receipt.objects.get(operation=op).committed_after_cancel_request is True


def test_asking_to_cancel_twice_changes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    send(task, lease, "a")
    task_request_cancel(task_id=task.pk, actor=CREATOR, reason="first")
    before = snapshot()
    clock.advance(timedelta(minutes=1))
    again = task_request_cancel(task_id=task.pk, actor=CREATOR, reason="second")
    assert snapshot() == before
    assert (again.cancel_requested_by, again.cancel_reason) == ("agent:tester", "first")


def test_cancel_on_a_completed_task_changes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    complete(task, lease, "a")
    complete(task, lease, "b")
    before = snapshot()
    done = task_request_cancel(task_id=task.pk, actor=CREATOR, reason="too late")
    assert snapshot() == before
    assert (done.status, done.cancel_requested_at) == (TaskStatus.COMPLETED, None)


# --- 6. budgets survive restarts -----------------------------------------------------------------------------------


def test_budgets_and_backoff_survive_a_restart(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", max_attempts=3), attempt_budget=5)
    first_worker = agent_lease(task)
    op = send(task, first_worker, "a")
    attempted_at = clock.now()
    record(op, Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), first_worker)

    # The worker process goes away; a new one starts from the database alone.
    lease_release(lease=first_worker)
    clock.advance(timedelta(milliseconds=1))
    node = Node.objects.get(task_id=task.pk, key="a")
    stored = Task.objects.get(pk=task.pk)
    assert (node.attempts, node.last_error_class, node.last_attempt_at, node.next_allowed_action) == (
        1,
        "dependency_unavailable",
        attempted_at,
        "retry",
    )
    assert node.not_before == backoff(now=attempted_at, attempt=1, seed=f"{task.uid}:a").not_before
    assert (stored.attempts_used, stored.status) == (1, TaskStatus.BACKING_OFF)

    second_worker = agent_lease(task, holder="agent-2")
    directive = next_directive(task_id=task.pk, lease=second_worker)
    assert (directive.kind, directive.until) == ("wait", node.not_before)
    assert_refused(BackoffActive, lambda: send(task, second_worker, "a"))
    clock.set(node.not_before)
    send(task, second_worker, "a")
    assert Node.objects.get(pk=node.pk).attempts == 2
    assert Task.objects.get(pk=task.pk).attempts_used == 2
