"""The step protocol (DESIGN §4), failure branches (§6), cancel (§5) and budgets (invariant 10).

Every test tries to break one rule. Refusals are checked against ``snapshot()``: a refused call writes nothing.
"""

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from audit.principals import Principal
from leases.errors import LeaseExpired, LeaseLost
from leases.models import Lease
from leases.services import lease_release
from tasks import protocol
from tasks.errors import (
    BackoffActive,
    BudgetExhausted,
    CancelRequested,
    EvidenceInsufficient,
    InputsRecheckRequired,
    InvalidTransition,
    NodeNotReady,
    OperationsOpen,
    TaskError,
    VersionConflict,
)
from tasks.events import find_log_problem
from tasks.failures import backoff
from tasks.lifecycle import FailureClass, NodeStatus, OperationStatus, PauseReason, TaskStatus
from tasks.models import Event, Node, Operation, Receipt, Task
from tasks.outcomes import Accepted, Committed, Failed, NotFound, Unprovable
from tasks.protocol import (
    advance_node,
    next_directive,
    operation_dispatch,
    record_outcome,
    register_intent,
    task_request_cancel,
)
from tests.conftest import SOURCE_REF, chain_plan, copy_node, effect_node, snapshot
from tests.steps import dispatch, record, register, send, version

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

    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="customer withdrew")
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.op_key) == ("reconcile", op.op_key)


def test_an_intent_never_sent_is_executed_again_with_its_op_key(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = register(task, lease, "a")
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
    task = make_task({"nodes": [{"key": "confirm", "action": "approval"}, effect_node("a", depends_on=["confirm"])]})
    lease = agent_lease(task)
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.node_key, directive.reason) == ("stop", "confirm", "awaiting_approval")
    assert_refused(NodeNotReady, lambda: register(task, lease, "confirm"))


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
    op = register(task, lease, "a")
    ask()  # intent never sent
    op = dispatch(op, lease)
    ask()  # dispatched
    record(op, interrupted(), lease)
    ask()  # unknown
    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="stop")
    ask()  # stopped_pending
    clock.advance(timedelta(hours=1))
    ask()  # expired lease


@pytest.mark.parametrize("budget", ["task", "node"])
def test_next_directive_does_not_direct_work_the_budget_forbids(make_task, agent_lease, clock, budget) -> None:
    """DESIGN §6: when a budget runs out the task pauses. A directive to execute what register/dispatch must refuse
    would have the agent loop forever."""
    if budget == "task":
        task = make_task(parallel_plan("a", "b"), attempt_budget=1)
        lease = agent_lease(task)
        complete(task, lease, "a")  # the one attempt of the task is spent on a success
    else:
        task = make_task(parallel_plan("a", max_attempts=1))
        lease = agent_lease(task)
        op = send(task, lease, "a")
        record(op, interrupted(), lease)
        record(op, NotFound(), lease)  # back to intent, same op key, but the node's one attempt is spent
        assert_refused(BudgetExhausted, lambda: dispatch(op, lease))
    directive = next_directive(task_id=task.pk, lease=lease)
    assert directive.kind == "stop", f"budget used up, yet told to {directive.kind} {directive.node_key}"


# --- 2. register_intent --------------------------------------------------------------------------------------------


def test_register_intent_refuses_a_stale_version(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    stale = version(task)
    complete(task, lease, "a")
    assert_refused(
        VersionConflict, lambda: register_intent(task_id=task.pk, node_key="b", expected_version=stale, lease=lease)
    )


def test_register_intent_refuses_a_superseded_lease_epoch(make_task, agent_lease, clock) -> None:
    task = make_task()
    old = agent_lease(task, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=30) + settings.RECKON_LEASE_GRACE + timedelta(seconds=1))
    new = agent_lease(task, holder="agent-2")
    assert new.epoch == old.epoch + 1
    assert_refused(LeaseLost, lambda: register(task, old, "a"))


def test_register_intent_refuses_a_lease_at_its_expiry(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=30))
    assert_refused(LeaseExpired, lambda: register(task, lease, "a"))


def test_register_intent_refuses_once_a_cancel_is_recorded(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="wrong project")
    assert_refused(CancelRequested, lambda: register(task, lease, "a"))
    assert not Operation.objects.filter(task=task).exists()


def test_register_intent_refuses_when_the_task_budget_is_spent(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", "b"), attempt_budget=1)
    lease = agent_lease(task)
    complete(task, lease, "a")
    paused = Task.objects.get(pk=task.pk)
    assert (paused.status, paused.status_reason) == (TaskStatus.PAUSED, PauseReason.BUDGET_EXHAUSTED)
    error = assert_refused(BudgetExhausted, lambda: register(task, lease, "b"))
    assert isinstance(error, TaskError) and error.details["scope"] == "task"


def test_register_intent_refuses_a_node_whose_attempts_are_spent(make_task, agent_lease, clock) -> None:
    """Defence in depth: however a pending node came to have no attempts left (the protocol itself pauses the task
    first), the intent's CAS refuses it."""
    task = make_task(parallel_plan("a", max_attempts=2))
    lease = agent_lease(task)
    Node.objects.filter(task=task, key="a").update(attempts=2)
    error = assert_refused(BudgetExhausted, lambda: register(task, lease, "a"))
    assert isinstance(error, TaskError) and error.details["scope"] == "node"


def test_register_intent_refuses_before_not_before_and_allows_it_at_not_before(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "rate limited"), lease)
    not_before = fresh_node(task, "a").not_before
    assert not_before is not None
    clock.set(not_before - timedelta(microseconds=1))
    assert_refused(BackoffActive, lambda: register(task, lease, "a"))
    clock.set(not_before)
    assert register(task, lease, "a").status == OperationStatus.INTENT


@pytest.mark.parametrize("open_status", ["dispatched", "accepted", "unknown"])
def test_register_intent_refuses_while_an_operation_is_open(make_task, agent_lease, clock, open_status) -> None:
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    if open_status == "accepted":
        record(op, Accepted(remote_id="job-1"), lease)
    elif open_status == "unknown":
        record(op, interrupted(), lease)
    # Another, otherwise ready node. With an accepted operation the task is observing, which refuses first.
    assert_refused(OperationsOpen, lambda: register(task, lease, "b"))
    assert_refused(OperationsOpen, lambda: register(task, lease, "a"))  # the same node


def test_register_intent_refuses_a_node_whose_dependencies_have_not_succeeded(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b", "c"))
    lease = agent_lease(task)
    assert_refused(NodeNotReady, lambda: register(task, lease, "b"))
    op = send(task, lease, "a")
    record(op, Accepted(remote_id="job-1"), lease)  # accepted is not succeeded
    record(op, Committed(remote_id="job-1"), lease)
    assert_refused(NodeNotReady, lambda: register(task, lease, "c"))  # its dependency b has not even started


def test_registering_the_same_intent_again_returns_it_without_writing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    first = register(task, lease, "a")
    assert first.op_key == protocol.op_key_for(task, fresh_node(task, "a"), 0)
    before, at = snapshot(), version(task)
    again = register_intent(task_id=task.pk, node_key="a", expected_version=at, lease=lease)
    assert (again.pk, again.op_key, again.request_digest) == (first.pk, first.op_key, first.request_digest)
    assert version(task) == at
    assert snapshot() == before


def test_a_retry_after_a_definite_rejection_gets_a_new_op_key(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    first = send(task, lease, "a")
    record(first, Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
    clock.set(fresh_node(task, "a").not_before)
    retry = register(task, lease, "a")
    assert retry.op_key != first.op_key
    assert retry.op_key == protocol.op_key_for(task, fresh_node(task, "a"), 1)
    assert retry.request_digest == first.request_digest
    assert fresh_op(first).status == OperationStatus.REJECTED
    assert register(task, lease, "a").op_key == retry.op_key


def test_from_inputs_are_resolved_from_the_earlier_receipt_not_from_text(make_task, agent_lease, clock) -> None:
    plan = {
        "nodes": [
            effect_node("prepare", action="store.prepare_target"),
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
    op = register(task, lease, "copy")
    assert op.request["input"] == {"target": "bucket-77", "expected": 12, "source": SOURCE_REF, "limit": 100}
    assert op.target == "bucket-77"


# --- 3. operation_dispatch -----------------------------------------------------------------------------------------


def test_dispatch_rechecks_cancel_right_before_the_side_effect(make_task, agent_lease, clock, monkeypatch) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = register(task, lease, "a")
    as_read = Operation.objects.select_related("node").get(pk=op.pk)  # the dispatcher read it before the cancel
    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="stop now")
    monkeypatch.setattr(protocol, "_operation", lambda op_key: as_read)
    assert_refused(
        CancelRequested, lambda: operation_dispatch(op_key=op.op_key, expected_version=version(task), lease=lease)
    )
    assert fresh_op(op).dispatch_count == 0


def test_dispatch_spends_one_attempt_of_the_node_and_the_task_budgets(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = register(task, lease, "a")
    assert (fresh_node(task, "a").attempts, fresh_task(task).attempts_used) == (0, 0)
    clock.advance(timedelta(seconds=5))
    dispatch(op, lease)
    node, stored = fresh_node(task, "a"), fresh_task(task)
    assert (node.attempts, node.last_attempt_at, stored.attempts_used) == (1, clock.now(), 1)
    assert fresh_op(op).dispatch_count == 1


def test_dispatch_refuses_a_resend_when_the_node_budget_is_spent(make_task, agent_lease, clock) -> None:
    task = make_task(parallel_plan("a", max_attempts=1))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    record(op, interrupted(), lease)
    record(op, NotFound(), lease)
    assert fresh_op(op).status == OperationStatus.INTENT
    assert_refused(BudgetExhausted, lambda: dispatch(op, lease))


def test_a_second_intent_is_refused_while_another_is_registered(make_task, agent_lease, clock) -> None:
    """DESIGN §4.1: one side effect of a task in flight at a time — an intent registered but not yet sent counts."""
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    first = register(task, lease, "a")
    assert_refused(OperationsOpen, lambda: register(task, lease, "b"))
    dispatch(first, lease)
    assert_refused(OperationsOpen, lambda: register(task, lease, "b"))


def test_dispatch_refuses_while_another_operation_is_open(make_task, agent_lease, clock) -> None:
    """Defence in depth: however a second intent came to exist, it is not sent while another operation is open."""
    task = make_task(parallel_plan("a", "b"))
    lease = agent_lease(task)
    first = register(task, lease, "a")
    node_b = Node.objects.get(task=task, key="b")
    second = Operation.objects.create(
        task=task,
        node=node_b,
        op_key=first.op_key + "-forged",
        action=node_b.action,
        request={},
        request_digest="sha256:0",
        registered_at=clock.now(),
    )
    dispatch(first, lease)
    assert_refused(OperationsOpen, lambda: dispatch(second, lease))


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
        lambda: record_outcome(op_key=op.op_key, outcome=satisfying_receipt(), expected_version=stale, lease=lease),
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


def test_advance_node_refuses_a_receipt_that_does_not_satisfy_the_evidence(make_task, agent_lease, clock) -> None:
    task = make_task(evidence_plan())
    lease = agent_lease(task)
    op = send(task, lease, "copy")
    assert_refused(
        EvidenceInsufficient,
        lambda: advance_node(op_key=op.op_key, expected_version=version(task), lease=lease),
    )  # no receipt at all: "dispatched" is not evidence
    record(op, satisfying_receipt(count=99), lease)
    error = assert_refused(
        EvidenceInsufficient,
        lambda: advance_node(op_key=op.op_key, expected_version=version(task), lease=lease),
    )
    assert isinstance(error, TaskError) and error.details["problems"]
    assert fresh_node(task, "copy").status == NodeStatus.FAILED


@pytest.mark.parametrize("state", ["intent", "committed", "rejected"])
def test_record_outcome_refuses_an_operation_with_nothing_outstanding(make_task, agent_lease, clock, state) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = register(task, lease, "a")
    if state == "committed":
        op = record(dispatch(op, lease), Committed(remote_id="r-a"), lease)
    elif state == "rejected":
        op = record(dispatch(op, lease), Failed(FailureClass.INVALID_PARAMS, "400"), lease)
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
    assert_refused(TaskError, lambda: register(task, lease, "a"))


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
    assert_refused(InvalidTransition, lambda: dispatch(op, lease))  # never re-sent blindly
    assert_refused(
        EvidenceInsufficient, lambda: advance_node(op_key=op.op_key, expected_version=version(task), lease=lease)
    )


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
    again = register(task, lease, "a")
    assert (again.pk, again.op_key) == (op.pk, op.op_key)
    resent = dispatch(again, lease)
    assert (resent.op_key, resent.dispatch_count) == (op.op_key, 2)


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
    assert_refused(InputsRecheckRequired, lambda: register(task, lease, "b"))


# --- 5. cancel -----------------------------------------------------------------------------------------------------


def test_cancel_withdraws_intents_that_were_never_sent(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = register(task, lease, "a")
    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="wrong target")
    withdrawn = fresh_op(op)
    assert (withdrawn.status, withdrawn.failure_class) == (OperationStatus.REJECTED, "cancelled")
    assert fresh_node(task, "a").status == NodeStatus.PENDING
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert_refused(TaskError, lambda: dispatch(op, lease))
    assert fresh_node(task, "a").attempts == 0
    assert next_directive(task_id=task.pk, lease=lease).kind == "stop"


def test_a_commit_arriving_after_the_cancel_is_recorded_as_a_real_completion(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = send(task, lease, "a")
    stopping = task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="stop")
    assert stopping.status == TaskStatus.STOPPING
    assert stopping.cancel_requested_at is not None
    record(op, Committed(remote_id="r-a"), lease)
    assert fresh_node(task, "a").status == NodeStatus.SUCCEEDED
    assert Receipt.objects.get(operation=op).committed_after_cancel_request is True
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert fresh_node(task, "b").status == NodeStatus.PENDING
    assert_refused(TaskError, lambda: register(task, lease, "b"))


def test_a_cancel_with_only_an_unknown_left_is_stopped_pending_until_reconciled(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    cancelled = task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="x")
    assert cancelled.status == TaskStatus.STOPPED_PENDING
    record(op, interrupted(), lease)  # the query itself timed out: still pending
    assert fresh_task(task).status == TaskStatus.STOPPED_PENDING
    record(op, NotFound(), lease)  # never took effect: withdrawn, not sent again
    settled = fresh_op(op)
    assert (settled.status, settled.failure_class) == (OperationStatus.REJECTED, "cancelled")
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert fresh_node(task, "a").status == NodeStatus.PENDING


def test_an_unknown_found_still_running_after_a_cancel_shows_stopping(make_task, agent_lease, clock) -> None:
    """DESIGN §5: "stopped with pending reconciliation" must not be shown while work is still running remotely."""
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="x")
    record(op, Accepted(remote_id="job-1"), lease)
    assert fresh_task(task).status == TaskStatus.STOPPING
    record(op, Committed(remote_id="job-1"), lease)
    assert fresh_task(task).status == TaskStatus.STOPPED
    assert Receipt.objects.get(operation=op).committed_after_cancel_request is True


def test_asking_to_cancel_twice_changes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    send(task, lease, "a")
    task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="first")
    before = snapshot()
    clock.advance(timedelta(minutes=1))
    again = task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:bob"), reason="second")
    assert snapshot() == before
    assert (again.cancel_requested_by, again.cancel_reason) == ("agent:operator:ann", "first")


def test_cancel_on_a_completed_task_changes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    complete(task, lease, "a")
    complete(task, lease, "b")
    before = snapshot()
    done = task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:ann"), reason="too late")
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
    assert_refused(BackoffActive, lambda: register(task, second_worker, "a"))
    clock.set(node.not_before)
    dispatch(register(task, second_worker, "a"), second_worker)
    assert Node.objects.get(pk=node.pk).attempts == 2
    assert Task.objects.get(pk=task.pk).attempts_used == 2
