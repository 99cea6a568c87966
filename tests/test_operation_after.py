"""What an outcome makes of its operation is one mapping, tasks.core.outcomes.operation_after, pinned here as a
literal table — and both places that record an outcome, the step's decision (tasks/decide/decisions.py: settle) and
the cleanup's deletes (tasks/engine/cleanup.py), record exactly what it says, for every kind of outcome."""

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest

from leases.models import Lease
from tasks.core import opkeys
from tasks.core.errors import EvidenceInsufficient
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import (
    NOT_FOUND_NOT_FINAL,
    Accepted,
    Committed,
    Failed,
    Fenced,
    NotFound,
    Outcome,
    Unprovable,
    operation_after,
)
from tasks.decide import decisions
from tasks.decide.change import Snapshot
from tasks.engine.cleanup import cleanup_temp_resources
from tasks.models import Event, Node, Operation, OperationPurpose, Task
from tests.conftest import chain_plan
from tests.kinds import kind_registered
from tests.steps import record, send

# (case, outcome, may it be sent again, the operation's status, the failure class it records)
TABLE: list[tuple[str, Outcome, bool, str, str]] = [
    ("committed", Committed(remote_id="r"), True, "committed", ""),
    ("committed without a remote id", Committed(remote_id=""), True, "unknown", "no_receipt"),
    ("accepted", Accepted(remote_id="job"), True, "accepted", ""),
    ("not found", NotFound(), True, "intent", ""),
    ("not found, nothing may be sent again", NotFound(), False, "rejected", "cancelled"),
    ("fenced", Fenced(), True, "rejected", "fenced"),
    ("fenced, nothing may be sent again", Fenced(), False, "rejected", "cancelled"),
    ("unprovable", Unprovable(), True, "unknown", "unprovable"),
    ("interrupted", Failed(FailureClass.CONNECTION_INTERRUPTED), True, "unknown", "connection_interrupted"),
    ("invalid params", Failed(FailureClass.INVALID_PARAMS), True, "rejected", "invalid_params"),
    ("permission revoked", Failed(FailureClass.PERMISSION_REVOKED), True, "rejected", "permission_revoked"),
    ("unavailable", Failed(FailureClass.DEPENDENCY_UNAVAILABLE), True, "rejected", "dependency_unavailable"),
    ("conflict", Failed(FailureClass.CONFLICT), True, "rejected", "conflict"),
]
# Every outcome once, as a caller that may send again meets it.
OUTCOMES = [(case, outcome) for case, outcome, again, _status, _failure in TABLE if again]
IDS = [case for case, _outcome in OUTCOMES]


def test_the_table_names_every_kind_of_outcome_and_every_failure_class() -> None:
    assert {type(outcome) for _case, outcome in OUTCOMES} == set(get_args(Outcome.__value__))
    assert {o.failure_class for _case, o in OUTCOMES if isinstance(o, Failed)} == set(FailureClass)


@pytest.mark.parametrize(
    ("outcome", "again", "status", "failure_class"), [c[1:] for c in TABLE], ids=[c[0] for c in TABLE]
)
def test_what_an_outcome_makes_of_its_operation(outcome: Outcome, again: bool, status: str, failure_class: str) -> None:
    after = operation_after(outcome, may_send_again=again)
    assert (after.status, after.failure_class) == (status, failure_class)
    assert after.fields() == {"status": status} | ({"failure_class": failure_class} if failure_class else {})


@pytest.mark.parametrize("outcome", [o for _c, o in OUTCOMES if not isinstance(o, NotFound | Fenced)], ids=str)
def test_only_not_found_and_fenced_depend_on_whether_it_may_be_sent_again(outcome: Outcome) -> None:
    assert operation_after(outcome, may_send_again=False) == operation_after(outcome)


def test_a_not_found_that_is_not_final_leaves_a_cancelled_operation_unknown() -> None:
    """Nothing may be sent again (a cancel), but a request in flight may still land: not closed as never sent."""
    after = operation_after(NotFound(), may_send_again=False, not_found_final=False)
    assert (after.status, after.failure_class) == ("unknown", NOT_FOUND_NOT_FINAL)
    # Finality matters only when nothing may be sent again, and only for a not found: a fence is final itself.
    assert operation_after(NotFound(), not_found_final=False) == operation_after(NotFound())
    fenced = operation_after(Fenced(), may_send_again=False, not_found_final=False)
    assert fenced == operation_after(Fenced(), may_send_again=False)


def _recorded(fields: dict[str, Any]) -> tuple[str, str]:
    return fields["status"], fields.get("failure_class", "")


def _expected(outcome: Outcome, *, may_send_again: bool = True) -> tuple[str, str]:
    after = operation_after(outcome, may_send_again=may_send_again)
    return after.status.value, after.failure_class


# --- the step's decision records it (pure: rows never saved) ------------------------------------------------------

NOW = datetime(2030, 1, 1, tzinfo=UTC)
UID = uuid.UUID(int=7)


def _dispatched(*, cancelled: bool, purpose: OperationPurpose) -> tuple[Snapshot, Operation]:
    task = Task(pk=1, uid=UID, status="running", version=5, plan_version=1, attempt_budget=10, attempts_used=1)
    if cancelled:
        task.cancel_requested_at, task.status = NOW, "stopping"
    node = Node(pk=1, task_id=1, plan_version=1, key="a", position=0, action="store.copy_batch", max_attempts=3)
    node.status, node.attempts, node.evidence = "running", 1, {"remote_id": True}
    op = Operation(
        pk=100,
        task_id=1,
        op_key=opkeys.effect(UID, 1, "a", 0),
        action=node.action,
        request={"action": node.action, "input": {}},
        status="dispatched",
        purpose=purpose,
    )
    op.node = node
    snap = Snapshot(task=task, nodes=(node,), unsettled=(op,), now=NOW, lease_expires_at=NOW + timedelta(seconds=30))
    return snap, op


@pytest.mark.parametrize("purpose", [OperationPurpose.EFFECT, OperationPurpose.COMPENSATION])
@pytest.mark.parametrize("cancelled", [False, True], ids=["", "after-cancel"])
@pytest.mark.parametrize("outcome", [o for _c, o in OUTCOMES], ids=IDS)
def test_the_step_records_the_one_mapping(outcome: Outcome, cancelled: bool, purpose: OperationPurpose) -> None:
    snap, op = _dispatched(cancelled=cancelled, purpose=purpose)
    if isinstance(outcome, Committed) and not outcome.remote_id:
        with pytest.raises(EvidenceInsufficient):  # the step refuses it outright: the caller is told
            decisions.settle(snap, op, outcome)
        return
    change = decisions.settle(snap, op, outcome)
    assert change is not None
    [(settled, fields)] = change.operations
    assert settled is op
    assert _recorded(fields) == _expected(outcome, may_send_again=not cancelled)


# --- the cleanup's deletes record it ------------------------------------------------------------------------------

KIND = "operation-after-test"


class Deleter:
    """A remote whose first delete answers ``outcome``; every later call (a lookup, a delete sent again) drops the
    connection, so the cleanup stops soon after recording the answer under test."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome: Outcome | None = outcome

    def delete(self, op_key: str, locator: str) -> Outcome:
        answer, self.outcome = self.outcome, None
        return answer or Failed(FailureClass.CONNECTION_INTERRUPTED)

    def lookup(self, op_key: str) -> Outcome:
        return Failed(FailureClass.CONNECTION_INTERRUPTED)

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        raise AssertionError("cleanup never submits")

    def current_version(self, locator: str) -> str:
        raise AssertionError("not asked")

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        raise AssertionError("not asked")


@pytest.mark.django_db
@pytest.mark.parametrize("outcome", [o for _c, o in OUTCOMES], ids=IDS)
def test_the_cleanup_records_the_one_mapping(
    outcome: Outcome, make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: Any
) -> None:
    deleter = Deleter(outcome)
    with kind_registered(KIND, connector=lambda: deleter):
        task = make_task(chain_plan("a"), kind=KIND)
        lease = agent_lease(task)
        record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a"]}), lease)
        cleanup_temp_resources(task_id=task.pk, lease=lease, connector=deleter)
    kept = ("cleanup_registered", "cleanup_dispatched", "cleanup_needs_person")
    answered = Event.objects.filter(task=task, type__startswith="cleanup_").exclude(type__in=kept).order_by("seq")
    first = answered.first()
    assert first is not None, "the delete's answer is recorded"
    [fields] = first.payload["operations"].values()
    assert _recorded(fields) == _expected(outcome)
