"""Human takeover (DESIGN §3, §4, §5, §7): claim, renew, release, decide, settle by hand, force, review.

Each test tries to break one rule of ``tasks/people/takeover.py``'s lease/takeover state diagram. Refusals are checked
against ``snapshot()`` (every Reckon table, audit included): a refused call writes nothing, not even an audit row.
Lease times come from the controllable database clock, except in the skew tests, which run on the real one.
"""

import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta, tzinfo
from functools import partial
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.utils import timezone
from pytest_django.fixtures import Settings

from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import verify_audit
from leases.clock import DatabaseClock
from leases.errors import (
    LeaseExpired,
    LeaseHeld,
    LeaseLost,
    LeaseRefused,
    LeaseReserved,
    RenewalOutOfOrder,
)
from leases.models import ForcedRelease, Lease, ReleaseReason
from leases.services import lease_open, lease_release, lease_renew, lease_reservation
from tasks.access.permissions import PermissionDenied, permission_grant, permission_revoke
from tasks.core.errors import (
    EvidenceInsufficient,
    InputsRecheckRequired,
    InvalidTransition,
    NotFoundNotFinal,
    OperationsOpen,
    TakeoverHeld,
    TakeoverRequested,
    TaskError,
    TaskNotFound,
    TaskNotRunnable,
    VersionConflict,
)
from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, PauseReason, TaskStatus
from tasks.core.outcomes import Committed, Failed, NotFound
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.engine.protocol import (
    inputs_confirm,
    next_directive,
    snapshot_at,
)
from tasks.engine.verification import find_problems, task_quarantine
from tasks.models import Event, Node, Operation, Receipt, Task
from tasks.people import settlement
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import MIN_FORCE_TEXT, TakeoverRefused, forced_release_review, lease_force_release
from tasks.people.settlement import MIN_NOTE, TakeoverRequired, operation_settle_by_hand
from tasks.people.takeover import (
    NodeResult,
    takeover_claim,
    takeover_release,
    takeover_renew,
    takeover_submit,
    takeover_withdraw,
)
from tasks.reads.takeover import takeover_package
from tests.conftest import SOURCE_REF, chain_plan, copy_node, effect_node, person, snapshot
from tests.steps import past_deadline, record, send, version

TICK = timedelta(microseconds=1)  # the finest step both databases store
JUSTIFICATION = "agent worker-7 has been wedged for an hour"
IMPACT = "its in-flight switch is reconciled by op key by the next holder"
REVIEW_NOTE = "checked the worker logs: it was stuck, release was right"


# --- plans ------------------------------------------------------------------------------------------------------


def evidence_plan() -> dict[str, Any]:
    return {"nodes": [copy_node(), effect_node("verify", depends_on=["copy"])]}


def irreversible_plan() -> dict[str, Any]:
    """An irreversible switch (with its compensation) and an independent node that could start at any time."""
    switch = effect_node("switch", irreversible=True, compensation="store.restore_reference")
    return {"nodes": [switch, effect_node("other")]}


def good_copy_result(**changes: Any) -> NodeResult:
    result = NodeResult(
        node_key="copy",
        remote_id="batch-1",
        remote_version=SOURCE_REF["version"],
        count=100,
        digest=SOURCE_REF["digest"],
        evidence=[{"kind": "console_url", "value": "https://store.example/batches/batch-1"}],
    )
    return replace(result, **changes)


# --- personas and helpers ---------------------------------------------------------------------------------------


@pytest.fixture
def root(db: None) -> Principal:
    """The admin who grants permissions and forces releases."""
    return person("root", "admin")


def operator_for(root: Principal, task: Task, name: str) -> Principal:
    """An operator granted this one task."""
    operator = person(name, "operator")
    permission_grant(actor=root, user=operator.user, task=task)
    return operator


def fresh(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def node(task: Task, key: str) -> Node:
    return Node.objects.get(task=task, plan_version=fresh(task).plan_version, key=key)


def interrupted() -> Failed:
    return Failed(FailureClass.CONNECTION_INTERRUPTED, "read timeout after sending")


def grace() -> timedelta:
    value: timedelta = django_settings.RECKON_LEASE_GRACE
    return value


def operator_ttl() -> timedelta:
    value: timedelta = django_settings.RECKON_OPERATOR_LEASE_TTL
    return value


def granted(claim_of: Principal, task: Task) -> Lease:
    claim = takeover_claim(actor=claim_of, task_id=task.pk)
    assert claim.granted and claim.lease is not None, claim
    return claim.lease


def handed_over(
    task: Task, agent_lease: Callable[..., Lease], operator: Principal, key: str, *, unknown: bool
) -> tuple[Operation, Lease]:
    """An agent sent ``key`` (its outcome unknown, if asked) and gave its lease back; the operator took over."""
    lease = agent_lease(task)
    op = send(task, lease, key)
    if unknown:
        op = record(op, interrupted(), lease)
    lease_release(lease=lease)
    return op, granted(operator, task)


def left_as_intent(task: Task, lease: Lease, key: str) -> Operation:
    """``key`` was sent, and a query by op key found no trace of it (the worker died before the call): its
    operation is an intent again, to be sent again under the same op key. The one way an intent exists now."""
    op = record(send(task, lease, key), NotFound(), lease)
    assert (op.status, op.dispatch_count) == (OperationStatus.INTENT, 1)
    return op


def audit_actions(task: Task) -> list[str]:
    return list(AuditEvent.objects.filter(task_id=task.pk).order_by("seq").values_list("action", flat=True))


def last_audit() -> AuditEvent:
    event = AuditEvent.objects.order_by("-seq").first()
    assert event is not None
    return event


def assert_refused(error: type[BaseException] | tuple[type[BaseException], ...], call: Callable[[], Any]) -> Any:
    before = snapshot()
    with pytest.raises(error) as caught:
        call()
    assert snapshot() == before, "a refused call must write nothing, audit included"
    return caught.value


def force(actor: Principal, task: Task) -> ForcedRelease:
    return lease_force_release(actor=actor, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)


# --- 1. claim ---------------------------------------------------------------------------------------------------


def test_a_claim_on_a_free_task_is_granted_at_once(make_task, clock, root) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    before = version(task)

    claim = takeover_claim(actor=ann, task_id=task.pk)

    assert claim.granted and claim.lease is not None and claim.waiting_for == ""
    lease = claim.lease
    assert (lease.holder_kind, lease.holder_id, lease.epoch) == ("operator", "ann", 1)
    assert lease.expires_at == clock.now() + operator_ttl()
    assert lease_open(task.pk) == lease
    t = fresh(task)
    assert (t.status, t.version) == (TaskStatus.HUMAN, before + 1)
    assert Event.objects.get(task=task, seq=t.version).type == "takeover_granted"
    granted_row = last_audit()
    assert (granted_row.action, granted_row.actor_kind, granted_row.actor_id) == ("takeover_granted", "user", "ann")
    assert (granted_row.task_id, granted_row.lease_epoch) == (task.pk, 1)
    assert (granted_row.version_before, granted_row.version_after) == (before, before + 1)


@pytest.mark.parametrize("who", ["outsider", "auditor", "operator-of-another-task", "agent"])
def test_only_a_person_allowed_to_operate_the_task_may_claim_it(make_task, clock, root, who) -> None:
    task, other_task = make_task(), make_task()
    actor = {
        "outsider": lambda: person("eve"),
        "auditor": lambda: person("aud", "auditor"),
        "operator-of-another-task": lambda: operator_for(root, other_task, "olga"),
        "agent": lambda: Principal.agent("agent-1"),
    }[who]()

    assert_refused(PermissionDenied, lambda: takeover_claim(actor=actor, task_id=task.pk))


def test_a_claim_while_an_agent_holds_reserves_the_task_and_stops_new_intents(
    make_task, agent_lease, clock, root
) -> None:
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)

    claim = takeover_claim(actor=ann, task_id=task.pk)

    assert (claim.granted, claim.lease, claim.waiting_for) == (False, None, "agent:agent-1")
    reservation = lease_reservation(task.pk)
    assert reservation is not None and reservation.holder_id == "ann"
    assert lease_open(task.pk) == lease, "the agent keeps its lease until it ends"
    assert fresh(task).status == TaskStatus.PENDING
    assert last_audit().action == "takeover_requested"
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", "takeover_requested")
    assert_refused(TakeoverRequested, lambda: send(task, lease, "a"))


def test_an_intent_left_before_the_claim_is_never_sent_again(make_task, agent_lease, clock, root) -> None:
    """An intent (a send the remote has no trace of) is not sent again once a person asked for the task: not by
    the agent that holds the lease while the claim waits, and by no agent once the person holds it."""
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    op = left_as_intent(task, lease, "a")
    assert next_directive(task_id=task.pk, lease=lease).op_key == op.op_key  # before the claim: send it again

    assert not takeover_claim(actor=ann, task_id=task.pk).granted

    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", "takeover_requested")
    assert_refused(TakeoverRequested, lambda: send(task, lease, "a"))
    lease_release(lease=lease)
    operator_lease = granted(ann, task)
    assert_refused(LeaseHeld, lambda: agent_lease(task, "agent-2"))
    takeover_release(actor=ann, lease=operator_lease, reason="back later")
    assert fresh(task).status == TaskStatus.HUMAN, "released without a decision: it stays with people"
    assert_refused(LeaseRefused, lambda: agent_lease(task, "agent-2"))
    stored = Operation.objects.get(pk=op.pk)
    assert (stored.status, stored.dispatch_count) == (OperationStatus.INTENT, 1)


def test_in_flight_work_is_still_reconciled_and_recorded_after_a_claim(make_task, agent_lease, clock, root) -> None:
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    op = send(task, lease, "a")

    assert not takeover_claim(actor=ann, task_id=task.pk).granted

    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.op_key) == ("reconcile", op.op_key)
    settled = record(op, Committed(remote_id="r-a"), lease)
    assert settled.status == OperationStatus.COMMITTED
    assert node(task, "a").status == NodeStatus.SUCCEEDED
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", "takeover_requested")
    assert_refused(TakeoverRequested, lambda: send(task, lease, "b"))


@pytest.mark.parametrize("first", ["waits-for-the-agent", "waits-with-the-lease-free", "holds"])
def test_a_second_operator_cannot_claim_while_one_waits_or_holds(make_task, agent_lease, clock, root, first) -> None:
    task = make_task()
    ann, bob = operator_for(root, task, "ann"), operator_for(root, task, "bob")
    if first == "holds":
        granted(ann, task)
    else:
        lease = agent_lease(task)
        assert not takeover_claim(actor=ann, task_id=task.pk).granted
        if first == "waits-with-the-lease-free":
            lease_release(lease=lease)

    assert_refused(TakeoverHeld, lambda: takeover_claim(actor=bob, task_id=task.pk))


@pytest.mark.parametrize("how", ["released", "lapsed"])
def test_once_reserved_no_agent_can_acquire_the_lease(make_task, agent_lease, clock, root, how) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    assert not takeover_claim(actor=ann, task_id=task.pk).granted
    assert_refused(LeaseHeld, lambda: agent_lease(task, "agent-2"))

    if how == "released":
        lease_release(lease=lease)
    else:
        clock.set(lease.expires_at + grace())

    for holder in ("agent-1", "agent-2"):
        assert_refused(LeaseReserved, partial(agent_lease, task, holder))


@pytest.mark.parametrize("how", ["released", "lapsed"])
def test_claiming_again_once_the_agent_lease_ended_grants_it(make_task, agent_lease, clock, root, how) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    assert not takeover_claim(actor=ann, task_id=task.pk).granted

    if how == "released":
        lease_release(lease=lease)
    else:
        clock.set(lease.expires_at + grace() - TICK)
        before = snapshot()
        assert not takeover_claim(actor=ann, task_id=task.pk).granted, "inside the grace the agent may still renew"
        assert snapshot() == before
        clock.set(lease.expires_at + grace())

    operator_lease = granted(ann, task)

    assert (operator_lease.epoch, operator_lease.holder_kind) == (lease.epoch + 1, "operator")
    assert fresh(task).status == TaskStatus.HUMAN
    assert lease_reservation(task.pk) is None
    lease.refresh_from_db()
    expected_reason = ReleaseReason.RELEASED if how == "released" else ReleaseReason.EXPIRED
    assert lease.release_reason == expected_reason
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", "lease_lost")
    assert_refused(LeaseLost, lambda: compare_and_set(task.pk, version(task), Change(event="x"), lease=lease))


def test_claiming_twice_while_waiting_returns_the_same_answer_and_writes_nothing(
    make_task, agent_lease, clock, root
) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    agent_lease(task)
    first = takeover_claim(actor=ann, task_id=task.pk)
    before = snapshot()

    second = takeover_claim(actor=ann, task_id=task.pk)

    assert snapshot() == before
    assert (second.granted, second.waiting_for) == (first.granted, first.waiting_for) == (False, "agent:agent-1")


def test_claiming_again_while_holding_renews_the_same_lease(make_task, clock, root) -> None:
    """A browser that reconnects claims again: it gets its own lease back, renewed (even inside the grace),
    with the same epoch — the task itself does not move."""
    task = make_task()
    ann = operator_for(root, task, "ann")
    first = takeover_claim(actor=ann, task_id=task.pk)
    assert first.lease is not None
    clock.advance(django_settings.RECKON_OPERATOR_LEASE_TTL + timedelta(seconds=1))  # expired, inside the grace
    version_before = version(task)
    audited_before = AuditEvent.objects.count()

    second = takeover_claim(actor=ann, task_id=task.pk)

    assert second.granted and second.lease is not None
    assert (second.lease.pk, second.lease.epoch) == (first.lease.pk, first.lease.epoch)
    assert second.lease.renewal_seq == first.lease.renewal_seq + 1
    assert second.lease.expires_at == clock.now() + django_settings.RECKON_OPERATOR_LEASE_TTL
    assert version(task) == version_before
    # A renewal is a heartbeat, not an audited decision: the claim that granted the lease is the audit row.
    assert AuditEvent.objects.count() == audited_before
    assert audit_actions(task) == ["permission_granted", "takeover_granted"]


def _complete(task: Task, lease: Lease) -> None:
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)


def _fail(task: Task, lease: Lease) -> None:
    record(send(task, lease, "a"), Failed(FailureClass.INVALID_PARAMS, "bad bucket name"), lease)


def _stop(task: Task, lease: Lease) -> None:
    task_request_cancel(actor=Principal.agent("agent-1"), task_id=task.pk, reason="no longer needed", lease=lease)


def _quarantine(task: Task, lease: Lease) -> None:
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="the log and the rows disagree")


@pytest.mark.parametrize(
    ("end", "status"),
    [
        (_complete, TaskStatus.COMPLETED),
        (_fail, TaskStatus.FAILED),
        (_stop, TaskStatus.STOPPED),
        (_quarantine, TaskStatus.QUARANTINED),
    ],
    ids=["completed", "failed", "stopped", "quarantined"],
)
def test_a_task_that_has_ended_cannot_be_claimed(make_task, agent_lease, clock, root, end, status) -> None:
    task = make_task({"nodes": [effect_node("a", on_failure={"invalid_params": "fail_task"})]})
    lease = agent_lease(task)
    end(task, lease)
    lease_release(lease=lease)
    assert fresh(task).status == status

    assert_refused(TaskNotRunnable, lambda: takeover_claim(actor=root, task_id=task.pk))


def test_withdrawing_a_takeover_request_lets_agents_go_on(make_task, agent_lease, clock, root) -> None:
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    assert not takeover_claim(actor=ann, task_id=task.pk).granted

    takeover_withdraw(actor=ann, task_id=task.pk)

    assert lease_reservation(task.pk) is None
    withdrawn = last_audit()
    assert (withdrawn.action, withdrawn.actor_id, withdrawn.task_id) == ("takeover_withdrawn", "ann", task.pk)
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.node_key) == ("execute", "a")
    op = send(task, lease, "a")
    assert op.status == OperationStatus.DISPATCHED
    record(op, Committed(remote_id="r-a"), lease)
    lease_release(lease=lease)
    assert agent_lease(task, "agent-2").epoch == lease.epoch + 1


@pytest.mark.parametrize("who", ["another-operator", "outsider"])
def test_nobody_else_can_withdraw_an_operators_takeover_request(make_task, agent_lease, clock, root, who) -> None:
    """Withdrawing someone else's request must change nothing, and must not leave an audit row saying it did."""
    task = make_task()
    ann = operator_for(root, task, "ann")
    other = operator_for(root, task, "bob") if who == "another-operator" else person("eve")
    agent_lease(task)
    assert not takeover_claim(actor=ann, task_id=task.pk).granted
    before = snapshot()

    with contextlib.suppress(TaskError):
        takeover_withdraw(actor=other, task_id=task.pk)

    assert snapshot() == before
    reservation = lease_reservation(task.pk)
    assert reservation is not None and reservation.holder_id == "ann"


# --- 2. operator lease timing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("graces", "ticks", "renews"),
    [(0, 0, True), (0, 1, True), (0.5, 0, True), (1, -1, True), (1, 0, False), (1, 1, False)],
    ids=["at-expiry", "one-tick-after", "mid-grace", "last-tick-of-grace", "at-end-of-grace", "after-grace"],
)
def test_the_operator_renews_until_the_grace_ends(make_task, clock, root, graces, ticks, renews) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)
    assert lease.expires_at == clock.now() + operator_ttl()
    clock.set(lease.expires_at + grace() * graces + TICK * ticks)

    # At expiry and after it no write lands, not even inside the grace: only a renewal does.
    assert_refused(LeaseExpired, lambda: compare_and_set(task.pk, version(task), Change(event="x"), lease=lease))
    if not renews:
        assert_refused(LeaseExpired, lambda: takeover_renew(actor=ann, lease=lease, expected_renewal_seq=0))
        return
    audited_before = AuditEvent.objects.count()
    renewed = takeover_renew(actor=ann, lease=lease, expected_renewal_seq=0)

    assert (renewed.epoch, renewed.renewal_seq) == (lease.epoch, 1)
    assert renewed.expires_at == clock.now() + operator_ttl()
    assert AuditEvent.objects.count() == audited_before, "a renewal is a heartbeat: not audited row by row"
    assert last_audit().action == "takeover_granted"
    applied = compare_and_set(task.pk, version(task), Change(event="touched"), lease=renewed)
    assert applied.version == version(task)


def test_after_the_grace_another_operator_claims_and_the_lapse_is_audited(make_task, clock, root) -> None:
    task = make_task()
    ann, bob = operator_for(root, task, "ann"), operator_for(root, task, "bob")
    first = granted(ann, task)
    clock.set(first.expires_at + grace() - TICK)
    assert_refused(TakeoverHeld, lambda: takeover_claim(actor=bob, task_id=task.pk))
    clock.set(first.expires_at + grace())

    second = granted(bob, task)

    assert (second.holder_id, second.epoch) == ("bob", first.epoch + 1)
    first.refresh_from_db()
    assert first.release_reason == ReleaseReason.EXPIRED
    expired = AuditEvent.objects.get(action="takeover_expired")
    assert (expired.actor_kind, expired.task_id, expired.lease_epoch) == ("system", task.pk, first.epoch)
    assert expired.details["holder"] == "ann"
    assert audit_actions(task)[-3:] == ["takeover_granted", "takeover_expired", "takeover_granted"]
    assert fresh(task).status == TaskStatus.HUMAN
    assert_refused(LeaseLost, lambda: takeover_renew(actor=ann, lease=first, expected_renewal_seq=0))


def test_a_renewal_with_the_wrong_renewal_seq_is_refused(make_task, clock, root) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    renewed = takeover_renew(actor=ann, lease=granted(ann, task), expected_renewal_seq=0)

    for stale in (0, 2):
        assert_refused(
            RenewalOutOfOrder,
            partial(takeover_renew, actor=ann, lease=renewed, expected_renewal_seq=stale),
        )


@pytest.mark.parametrize("who", ["another-operator", "an-admin"])
@pytest.mark.parametrize("action", ["renew", "release"])
def test_nobody_but_the_holder_renews_or_releases_a_takeover_lease(make_task, clock, root, who, action) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    other = operator_for(root, task, "bob") if who == "another-operator" else person("boss", "admin")
    lease = granted(ann, task)

    def act() -> Lease:
        if action == "renew":
            return takeover_renew(actor=other, lease=lease, expected_renewal_seq=0)
        return takeover_release(actor=other, lease=lease, reason="not mine")

    assert_refused(PermissionDenied, act)


def test_an_operator_whose_permission_was_revoked_cannot_keep_renewing(make_task, clock, root) -> None:
    task = make_task()
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)
    permission_revoke(actor=root, user=ann.user, task=task)
    ann = Principal.of_user(User.objects.get(username="ann"))  # as a new request would load it

    assert_refused(PermissionDenied, lambda: takeover_renew(actor=ann, lease=lease, expected_renewal_seq=0))


# --- 3. safe handover ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_flight", ["dispatched", "unknown"])
@pytest.mark.parametrize("ending", ["released", "expired", "forced"])
def test_the_next_holder_first_reconciles_an_irreversible_operation_left_in_flight(
    make_task, agent_lease, clock, root, ending, in_flight
) -> None:
    task = make_task(irreversible_plan())
    lease = agent_lease(task)
    op = send(task, lease, "switch")
    if in_flight == "unknown":
        op = record(op, interrupted(), lease)
    assert op.status == in_flight
    if ending == "released":
        lease_release(lease=lease)
    elif ending == "expired":
        clock.set(lease.expires_at + grace())
    else:
        force(root, task)

    successor = agent_lease(task, "agent-2")

    assert successor.epoch == lease.epoch + 1
    directive = next_directive(task_id=task.pk, lease=successor)
    assert (directive.kind, directive.node_key, directive.op_key) == ("reconcile", "switch", op.op_key)
    for key in ("switch", "other"):
        assert_refused(OperationsOpen, partial(send, task, successor, key))
    record(op, Committed(remote_id="r-switch"), successor)
    directive = next_directive(task_id=task.pk, lease=successor)
    assert (directive.kind, directive.node_key) == ("execute", "other")
    assert send(task, successor, "other").status == OperationStatus.DISPATCHED


def test_an_operation_a_person_left_open_is_reconciled_first_by_the_resumed_agent(
    make_task, agent_lease, clock, root
) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, operator_lease = handed_over(task, agent_lease, ann, "switch", unknown=True)
    assert [o["op_key"] for o in takeover_package(task.pk)["operations_to_settle"]] == [op.op_key]

    takeover_submit(actor=ann, lease=operator_lease, based_on_version=version(task), decision="resume_agent")

    successor = agent_lease(task, "agent-2")
    directive = next_directive(task_id=task.pk, lease=successor)
    assert (directive.kind, directive.op_key) == ("reconcile", op.op_key)
    assert_refused(OperationsOpen, lambda: send(task, successor, "other"))


# --- 4. takeover_submit ----------------------------------------------------------------------------------------


def test_a_stale_form_is_refused_with_the_changes_since(make_task, agent_lease, clock, root) -> None:
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    op = send(task, lease, "a")
    lease_release(lease=lease)
    form_version = version(task)  # the operator opened the form here
    operator_lease = granted(ann, task)
    operation_settle_by_hand(
        actor=ann,
        task_id=task.pk,
        op_key=op.op_key,
        expected_version=version(task),
        resolution="done",
        receipt=Committed(remote_id="r-a"),
        note=CHECKED,
    )

    conflict = assert_refused(
        VersionConflict,
        lambda: takeover_submit(
            actor=ann,
            lease=operator_lease,
            based_on_version=form_version,
            decision="end_task",
            end_status="completed",
            results=[NodeResult(node_key="b", remote_id="r-b")],
        ),
    )

    assert conflict.details["expected"] == form_version
    assert conflict.details["actual"] == version(task)
    assert conflict.details["changes"] == [
        {"seq": form_version + 1, "type": "takeover_granted"},
        {"seq": form_version + 2, "type": "node_succeeded"},
    ]


@pytest.mark.parametrize(
    "wrong",
    [
        {"count": 99},
        {"count": None},
        {"digest": "sha256:" + "cd" * 32},
        {"digest": ""},
        {"remote_version": "8"},
        {"remote_id": ""},
    ],
    ids=["wrong-count", "no-count", "wrong-digest", "no-digest", "wrong-remote-version", "no-remote-id"],
)
def test_a_result_short_of_the_nodes_evidence_is_refused_and_nothing_is_written(make_task, clock, root, wrong) -> None:
    task = make_task({"nodes": [copy_node(), effect_node("side")]})
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)

    assert_refused(
        EvidenceInsufficient,
        lambda: takeover_submit(
            actor=ann,
            lease=lease,
            based_on_version=version(task),
            decision="resume_agent",
            results=[NodeResult(node_key="side", remote_id="r-side"), good_copy_result(**wrong)],
        ),
    )


@pytest.mark.parametrize(
    "results",
    [
        [NodeResult(node_key="nope", remote_id="r")],
        [NodeResult(node_key="side", remote_id="r-1"), NodeResult(node_key="side", remote_id="r-2")],
    ],
    ids=["unknown-node", "node-given-twice"],
)
def test_a_result_for_an_unknown_node_or_twice_for_one_is_refused(make_task, clock, root, results) -> None:
    task = make_task({"nodes": [effect_node("side")]})
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)

    assert_refused(
        InvalidTransition,
        lambda: takeover_submit(
            actor=ann, lease=lease, based_on_version=version(task), decision="resume_agent", results=results
        ),
    )


def test_end_task_completed_needs_a_satisfying_receipt_for_every_node(make_task, clock, root) -> None:
    task = make_task(evidence_plan())
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)

    def submit(results: list[NodeResult]) -> Task:
        return takeover_submit(
            actor=ann,
            lease=lease,
            based_on_version=version(task),
            decision="end_task",
            end_status="completed",
            results=results,
        )

    assert_refused(EvidenceInsufficient, lambda: submit([good_copy_result()]))
    assert_refused(EvidenceInsufficient, lambda: submit([]))

    ended = submit([good_copy_result(), NodeResult(node_key="verify", remote_id="r-verify")])

    assert ended.status == TaskStatus.COMPLETED
    assert {n.status for n in Node.objects.filter(task=task)} == {NodeStatus.SUCCEEDED}


@pytest.mark.parametrize("end_status", ["completed", "failed"])
def test_end_task_is_refused_while_an_operation_is_open(make_task, agent_lease, clock, root, end_status) -> None:
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    _op, lease = handed_over(task, agent_lease, ann, "a", unknown=True)

    assert_refused(
        OperationsOpen,
        lambda: takeover_submit(
            actor=ann,
            lease=lease,
            based_on_version=version(task),
            decision="end_task",
            end_status=end_status,
            results=[NodeResult(node_key="b", remote_id="r-b")],
        ),
    )


@pytest.mark.parametrize("changed", [False, True], ids=["inputs-unchanged", "an-input-changed"])
def test_resume_agent_hands_back_and_the_agent_rechecks_its_inputs_before_anything_new(
    make_task, agent_lease, clock, root, changed
) -> None:
    task = make_task(evidence_plan())
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)
    before = version(task)

    resumed = takeover_submit(
        actor=ann, lease=lease, based_on_version=before, decision="resume_agent", note="checked the bucket"
    )

    assert (resumed.status, resumed.status_reason, resumed.version) == (TaskStatus.PENDING, "", before + 1)
    assert resumed.inputs_recheck_required
    lease.refresh_from_db()
    assert lease.release_reason == ReleaseReason.RELEASED and lease_open(task.pk) is None
    submitted = last_audit()
    assert (submitted.action, submitted.actor_id, submitted.reason) == (
        "takeover_result_submitted",
        "ann",
        "checked the bucket",
    )
    assert submitted.details["decision"] == "resume_agent"
    assert (submitted.version_before, submitted.version_after) == (before, before + 1)

    agent = agent_lease(task, "agent-2")
    directive = next_directive(task_id=task.pk, lease=agent)
    assert (directive.kind, directive.reason) == ("reconcile", "recheck_inputs")
    assert_refused(InputsRecheckRequired, lambda: send(task, agent, "copy"))
    assert_refused(
        InputsRecheckRequired,
        lambda: (
            inputs_confirm(
                snapshot_at(task_id=task.pk, lease=agent, expected_version=version(task)), {}, lease=agent
            ).task
        ),
    )

    now_at = "8" if changed else SOURCE_REF["version"]
    confirmed = inputs_confirm(
        snapshot_at(task_id=task.pk, lease=agent, expected_version=version(task)), {"copy.source": now_at}, lease=agent
    ).task

    assert not confirmed.inputs_recheck_required
    directive = next_directive(task_id=task.pk, lease=agent)
    if changed:
        assert (confirmed.status, confirmed.status_reason) == (TaskStatus.PAUSED, PauseReason.INPUT_CHANGED)
        assert (directive.kind, directive.reason) == ("stop", PauseReason.INPUT_CHANGED)
        assert_refused(TaskNotRunnable, lambda: send(task, agent, "copy"))
    else:
        assert confirmed.status == TaskStatus.PENDING
        assert (directive.kind, directive.node_key) == ("execute", "copy")
        assert send(task, agent, "copy").status == OperationStatus.DISPATCHED


def test_resume_agent_without_input_refs_needs_no_input_recheck(make_task, agent_lease, clock, root) -> None:
    task = make_task(chain_plan("a"))
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)

    resumed = takeover_submit(actor=ann, lease=lease, based_on_version=version(task), decision="resume_agent")

    assert resumed.status == TaskStatus.PENDING and not resumed.inputs_recheck_required
    directive = next_directive(task_id=task.pk, lease=agent_lease(task))
    assert (directive.kind, directive.node_key) == ("execute", "a")


def test_replan_pauses_the_task_needs_replan_with_the_reason(make_task, clock, root) -> None:
    task = make_task(chain_plan("a"))
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)
    reason = "the target bucket moved to another region"

    paused = takeover_submit(
        actor=ann, lease=lease, based_on_version=version(task), decision="replan", replan_reason=reason
    )

    assert (paused.status, paused.status_reason, paused.status_detail) == (
        TaskStatus.PAUSED,
        PauseReason.NEEDS_REPLAN,
        reason,
    )
    assert lease_open(task.pk) is None
    submitted = last_audit()
    assert (submitted.action, submitted.reason, submitted.details["decision"]) == (
        "takeover_result_submitted",
        reason,
        "replan",
    )


@pytest.mark.parametrize(
    "decision",
    [
        {"decision": "carry_on"},
        {"decision": "replan"},
        {"decision": "replan", "replan_reason": "   too short   "},
        {"decision": "end_task"},
        {"decision": "end_task", "end_status": "stopped"},
    ],
    ids=["unknown-decision", "replan-without-reason", "replan-with-a-blank-reason", "end-without-status", "bad-status"],
)
def test_a_submission_without_a_valid_decision_is_refused(make_task, clock, root, decision) -> None:
    task = make_task(chain_plan("a"))
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)

    assert_refused(
        InvalidTransition,
        lambda: takeover_submit(actor=ann, lease=lease, based_on_version=version(task), **decision),
    )


def test_a_persons_results_are_committed_operations_settled_by_them_and_the_log_verifies(
    make_task, agent_lease, clock, root
) -> None:
    task = make_task(evidence_plan())
    ann = operator_for(root, task, "ann")
    agent = agent_lease(task)
    intent = left_as_intent(task, agent, "copy")  # the remote had no trace: the person did the work instead
    lease_release(lease=agent)
    lease = granted(ann, task)

    ended = takeover_submit(
        actor=ann,
        lease=lease,
        based_on_version=version(task),
        decision="end_task",
        end_status="completed",
        results=[good_copy_result(), NodeResult(node_key="verify", remote_id="r-verify", evidence=[])],
        note="copied and verified by hand",
    )

    assert ended.status == TaskStatus.COMPLETED
    withdrawn = Operation.objects.get(pk=intent.pk)
    assert (withdrawn.status, withdrawn.failure_class) == (OperationStatus.REJECTED, "withdrawn")
    by_person = Operation.objects.filter(task=task).exclude(pk=intent.pk).select_related("node")
    assert {op.node.key for op in by_person} == {"copy", "verify"}
    for op in by_person:
        assert (op.status, op.settled_by) == (OperationStatus.COMMITTED, "user:ann")
        assert op.settled_at is not None and "-person-" in op.op_key
        assert op.request["performed_by"] == "person"
    copy_receipt = Receipt.objects.get(operation__task=task, operation__node__key="copy")
    assert (copy_receipt.remote_id, copy_receipt.count, copy_receipt.digest, copy_receipt.remote_version) == (
        "batch-1",
        100,
        SOURCE_REF["digest"],
        "7",
    )
    assert copy_receipt.operation.remote_id == "batch-1"
    assert node(task, "copy").output == {
        "remote_id": "batch-1",
        "remote_version": "7",
        "count": 100,
        "digest": SOURCE_REF["digest"],
    }
    assert find_problems(fresh(task)) == []
    assert verify_audit().problem is None


def test_a_person_still_records_work_done_by_hand_once_a_cancel_stopped_the_task(make_task, clock, root) -> None:
    """Invariant 6: what was committed is recorded, never faked as rolled back — also what a person did by hand
    while holding the takeover (tasks.people.takeover._decision_fields: "a recorded cancel keeps its stopping/stopped
    status; the operator's receipts still count"). A cancel with nothing in flight stops the task at once; the
    operator who holds the takeover must still be able to submit the result. (Worked before the reshape; the
    permit table now allows an operator's DECIDE only in human/stopping/stopped_pending.)"""
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    lease = granted(ann, task)
    stopped = task_request_cancel(actor=ann, task_id=task.pk, reason="the customer withdrew the order")
    assert stopped.status == TaskStatus.STOPPED

    ended = takeover_submit(
        actor=ann,
        lease=lease,
        based_on_version=version(task),
        decision="end_task",
        end_status="failed",
        results=[NodeResult(node_key="a", remote_id="r-a")],
    )

    assert ended.status == TaskStatus.STOPPED
    assert node(task, "a").status == NodeStatus.SUCCEEDED
    assert lease_open(task.pk) is None


# --- 5. settling an operation by hand ---------------------------------------------------------------------------


CHECKED = "checked the remote's console by op key"


def resolve(actor: Principal, op: Operation, resolution: Any, *, note: str = CHECKED, **kwargs: Any) -> Operation:
    return operation_settle_by_hand(
        actor=actor,
        task_id=op.task_id,
        op_key=op.op_key,
        expected_version=version(op.task),
        resolution=resolution,
        note=note,
        **kwargs,
    )


def test_a_person_settles_an_unknown_operation_as_done_with_a_receipt(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)
    before = version(task)

    settled = resolve(ann, op, "done", receipt=Committed(remote_id="r-switch"), note="seen in the console")

    assert (settled.status, settled.settled_by, settled.remote_id) == (
        OperationStatus.COMMITTED,
        "user:ann",
        "r-switch",
    )
    assert Receipt.objects.get(operation=op).remote_id == "r-switch"
    assert node(task, "switch").status == NodeStatus.SUCCEEDED
    row = last_audit()
    assert (row.action, row.actor_id, row.reason) == ("operation_resolved_by_person", "ann", "seen in the console")
    assert (row.details["op_key"], row.details["resolution"]) == (op.op_key, "done")
    assert (row.version_before, row.version_after) == (before, version(task))
    assert find_problems(fresh(task)) == []


def test_settling_the_last_operation_by_hand_leaves_the_decision_to_the_person(
    make_task, agent_lease, clock, root
) -> None:
    """While an operator holds the lease the task shows ``human`` (tasks.people.takeover's docstring); the person ends
    the takeover with a decision, the settlement does not end it for them."""
    task = make_task(chain_plan("a"))
    ann = operator_for(root, task, "ann")
    op, lease = handed_over(task, agent_lease, ann, "a", unknown=True)

    resolve(ann, op, "done", receipt=Committed(remote_id="r-a"))

    assert node(task, "a").status == NodeStatus.SUCCEEDED
    assert fresh(task).status == TaskStatus.HUMAN
    ended = takeover_submit(
        actor=ann, lease=lease, based_on_version=version(task), decision="end_task", end_status="completed"
    )
    assert ended.status == TaskStatus.COMPLETED


@pytest.mark.parametrize("resolution", ["done", "compensate"])
def test_settling_as_done_without_a_receipt_is_refused(make_task, agent_lease, clock, root, resolution) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)

    assert_refused(EvidenceInsufficient, lambda: resolve(ann, op, resolution))


def test_settling_as_done_with_a_receipt_without_a_remote_id_is_refused(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)

    assert_refused(EvidenceInsufficient, lambda: resolve(ann, op, "done", receipt=Committed(remote_id="")))


def test_a_receipt_short_of_the_evidence_never_makes_the_node_succeed(make_task, agent_lease, clock, root) -> None:
    task = make_task({"nodes": [copy_node()]})
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "copy", unknown=True)

    with contextlib.suppress(EvidenceInsufficient):
        resolve(ann, op, "done", receipt=Committed(remote_id="batch-1", count=99))

    assert node(task, "copy").status != NodeStatus.SUCCEEDED


def test_settling_as_not_done_lets_the_node_run_again_under_a_new_op_key(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, lease = handed_over(task, agent_lease, ann, "switch", unknown=True)
    past_deadline(clock, op)  # no request under its op key can land any more: "not done" is final

    settled = resolve(ann, op, "not_done", note="nothing in the remote's history")

    assert (settled.status, settled.failure_class, settled.settled_by) == (
        OperationStatus.REJECTED,
        "not_done",
        "user:ann",
    )
    assert node(task, "switch").status == NodeStatus.PENDING
    assert not Receipt.objects.filter(operation=op).exists()
    row = last_audit()
    assert (row.action, row.details["resolution"], row.details["receipt"]) == (
        "operation_resolved_by_person",
        "not_done",
        None,
    )
    takeover_submit(actor=ann, lease=lease, based_on_version=version(task), decision="resume_agent")
    agent = agent_lease(task, "agent-2")
    directive = next_directive(task_id=task.pk, lease=agent)
    assert (directive.kind, directive.node_key) == ("execute", "switch")
    again = send(task, agent, "switch")
    assert again.op_key != op.op_key and again.status == OperationStatus.DISPATCHED
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.REJECTED


def test_settling_as_not_done_never_records_a_commit(make_task, agent_lease, clock, root) -> None:
    """A receipt sent along with "not done" contradicts it: it must not turn into a committed operation."""
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)

    with contextlib.suppress(TaskError):
        resolve(ann, op, "not_done", receipt=Committed(remote_id="r-switch"))

    assert Operation.objects.get(pk=op.pk).status != OperationStatus.COMMITTED
    assert not Receipt.objects.filter(operation=op).exists()
    assert node(task, "switch").status != NodeStatus.SUCCEEDED


def test_settling_the_last_open_operation_of_a_cancelled_task_as_not_done_stops_it(
    make_task, agent_lease, clock, root
) -> None:
    """DESIGN §5: "stopped with operations still to reconcile" is shown only while some are. Once a person settles
    the last one as not done, nothing is left to reconcile: the task is stopped, as when a query by op key says
    not found (the "done" path, through the protocol's settle, gets this right; _record_not_done writes no task
    status, and nothing moves the task afterwards — it stays stopped_pending for good)."""
    task = make_task(chain_plan("a", "b"))
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "a", unknown=True)
    cancelled = task_request_cancel(actor=ann, task_id=task.pk, reason="the customer withdrew the order")
    assert cancelled.status == TaskStatus.STOPPED_PENDING
    past_deadline(clock, op)

    resolve(ann, op, "not_done", note="nothing in the remote's history")

    assert Operation.objects.get(pk=op.pk).status == OperationStatus.REJECTED
    assert fresh(task).status == TaskStatus.STOPPED


def test_compensating_commits_the_original_and_registers_a_new_operation(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)
    before = version(task)

    settled = resolve(ann, op, "compensate", receipt=Committed(remote_id="r-switch"), note="undo the switch")

    assert (settled.status, settled.settled_by) == (OperationStatus.COMMITTED, "user:ann")
    compensation = Operation.objects.get(compensates=op)
    assert compensation.op_key == f"{op.op_key}-compensation" != op.op_key
    assert (compensation.status, compensation.action) == (OperationStatus.INTENT, "store.restore_reference")
    assert compensation.node_id == op.node_id
    assert version(task) == before + 2
    row = last_audit()
    assert (row.action, row.details["resolution"]) == ("operation_resolved_by_person", "compensate")
    assert (row.version_before, row.version_after) == (before, before + 2)
    assert audit_actions(task).count("operation_resolved_by_person") == 1
    assert find_problems(fresh(task)) == []


def test_compensating_a_node_without_a_compensation_is_refused(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "other", unknown=True)

    assert_refused(InvalidTransition, lambda: resolve(ann, op, "compensate", receipt=Committed(remote_id="r")))


def test_a_settled_operation_cannot_be_settled_again(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)
    resolve(ann, op, "done", receipt=Committed(remote_id="r-switch"))

    assert_refused(InvalidTransition, lambda: resolve(ann, op, "not_done"))


@pytest.mark.parametrize("who", ["another-operator", "an-admin", "the-agent"])
def test_only_the_takeover_lease_holder_settles_by_hand(make_task, agent_lease, clock, root, who) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    if who == "the-agent":
        agent = agent_lease(task)
        op = record(send(task, agent, "switch"), interrupted(), agent)
        actor = ann  # permitted on the task, but the agent holds it
    else:
        op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)
        actor = operator_for(root, task, "bob") if who == "another-operator" else person("boss", "admin")

    assert_refused(TakeoverRequired, lambda: resolve(actor, op, "done", receipt=Committed(remote_id="r-switch")))


def test_a_takeover_of_one_task_cannot_settle_another_tasks_operation(make_task, agent_lease, clock, root) -> None:
    held, other = make_task(chain_plan("a")), make_task(irreversible_plan())
    granted(root, held)
    agent = agent_lease(other)
    op = record(send(other, agent, "switch"), interrupted(), agent)
    lease_release(lease=agent)

    def settle(task_id: int) -> Operation:
        return operation_settle_by_hand(
            actor=root,
            task_id=task_id,
            op_key=op.op_key,
            expected_version=version(Task.objects.get(pk=task_id)),
            resolution="done",
            receipt=Committed(remote_id="r-switch"),
            note=CHECKED,
        )

    assert_refused(TaskNotFound, lambda: settle(held.pk))  # the op key is looked up on the held task only
    assert_refused(TakeoverRequired, lambda: settle(other.pk))


def test_a_settlement_needs_a_note_of_what_was_checked(make_task, agent_lease, clock, root) -> None:
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)

    short = "x" * (MIN_NOTE - 1)
    for note in ("", "   ", short, f"  {short}  "):
        assert_refused(EvidenceInsufficient, functools.partial(resolve, ann, op, "not_done", note=note))
    past_deadline(clock, op)
    assert resolve(ann, op, "not_done", note="x" * MIN_NOTE).status == OperationStatus.REJECTED


def test_not_done_is_refused_while_a_request_under_the_op_key_may_still_land(make_task, agent_lease, clock, root):
    """P7 (docs/verification.md): a request in flight when its caller timed out may land after a lookup found
    nothing. Until its deadline plus the clock skew has passed (and no connector here can fence it), a person's
    "not done" is refused and nothing is written; a moment after, it is final and accepted."""
    task = make_task(irreversible_plan())
    ann = operator_for(root, task, "ann")
    op, _ = handed_over(task, agent_lease, ann, "switch", unknown=True)
    sent = Operation.objects.get(pk=op.pk).not_after
    assert sent is not None
    final_at = sent + django_settings.RECKON_REMOTE_CLOCK_SKEW
    clock.set(final_at)  # at the boundary: not yet past it

    refused = assert_refused(NotFoundNotFinal, lambda: resolve(ann, op, "not_done"))
    assert refused.details["final_at"] == final_at.isoformat()
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.UNKNOWN

    clock.advance(timedelta(milliseconds=1))
    settled = resolve(ann, op, "not_done")
    assert (settled.status, settled.failure_class) == (OperationStatus.REJECTED, "not_done")
    assert last_audit().details["fenced"] is False


# --- 6. forced release -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("justification", "impact"),
    [
        ("", IMPACT),
        (JUSTIFICATION, ""),
        ("x" * (MIN_FORCE_TEXT - 1), IMPACT),
        (JUSTIFICATION, "y" * (MIN_FORCE_TEXT - 1)),
        (" " * 40 + "stuck" + " " * 40, IMPACT),
        (JUSTIFICATION, "\n" * 40),
    ],
    ids=["no-justification", "no-impact", "short-justification", "short-impact", "padded", "blank-impact"],
)
def test_a_forced_release_without_enough_justification_or_impact_is_refused(
    make_task, agent_lease, clock, root, justification, impact
) -> None:
    task = make_task()
    agent_lease(task)

    assert_refused(
        TakeoverRefused,
        lambda: lease_force_release(actor=root, task_id=task.pk, justification=justification, impact=impact),
    )


def test_a_forced_release_at_the_minimum_length_is_accepted(make_task, agent_lease, clock, root) -> None:
    task = make_task()
    agent_lease(task)

    forced = lease_force_release(
        actor=root, task_id=task.pk, justification="j" * MIN_FORCE_TEXT, impact="i" * MIN_FORCE_TEXT
    )

    assert forced.removed_holder == "agent:agent-1"


@pytest.mark.parametrize("who", ["operator", "auditor", "agent"])
def test_only_an_admin_may_force_a_release(make_task, agent_lease, clock, root, who) -> None:
    task = make_task()
    agent_lease(task)
    actor = {
        "operator": lambda: operator_for(root, task, "ann"),
        "auditor": lambda: person("aud", "auditor"),
        "agent": lambda: Principal.agent("agent-2"),
    }[who]()

    assert_refused(PermissionDenied, lambda: force(actor, task))


def test_a_forced_release_records_the_holder_epoch_version_and_open_operations(
    make_task, agent_lease, clock, root
) -> None:
    task = make_task(irreversible_plan())
    lease = agent_lease(task)
    op = send(task, lease, "switch")
    before = version(task)

    forced = force(root, task)

    assert (forced.removed_holder, forced.epoch, forced.task_version) == ("agent:agent-1", lease.epoch, before)
    assert forced.open_operations == [{"op_key": op.op_key, "status": "dispatched"}]
    assert (forced.forced_by, forced.justification, forced.impact, forced.status) == (
        "user:root",
        JUSTIFICATION,
        IMPACT,
        "pending",
    )
    assert forced.lease_id == lease.pk
    lease.refresh_from_db()
    assert lease.release_reason == ReleaseReason.FORCED and lease_open(task.pk) is None
    assert version(task) == before + 1
    assert Event.objects.get(task=task, seq=before + 1).type == "lease_forced_release"
    row = last_audit()
    assert (row.action, row.actor_id, row.lease_epoch) == ("lease_forced_release", "root", lease.epoch)
    assert (row.reason, row.impact) == (JUSTIFICATION, IMPACT)
    assert (row.version_before, row.version_after) == (before, before + 1)
    assert row.details["removed_holder"] == "agent:agent-1"
    assert row.details["open_operations"] == [{"op_key": op.op_key, "status": "dispatched"}]
    assert row.details["review"] == forced.pk


def test_a_forced_release_of_a_free_task_is_refused(make_task, clock, root) -> None:
    task = make_task()

    assert_refused(TakeoverRefused, lambda: force(root, task))


def test_a_removed_agent_can_write_nothing_and_the_next_holder_gets_the_next_epoch(
    make_task, agent_lease, clock, root
) -> None:
    task = make_task(irreversible_plan())
    lease = agent_lease(task)
    op = send(task, lease, "switch")
    stale = version(task)
    force(root, task)

    assert_refused(LeaseLost, lambda: compare_and_set(task.pk, version(task), Change(event="x"), lease=lease))
    assert_refused(VersionConflict, lambda: compare_and_set(task.pk, stale, Change(event="x"), lease=lease))
    assert_refused(LeaseLost, lambda: record(op, Committed(remote_id="r-switch"), lease))
    assert_refused(LeaseLost, lambda: lease_renew(lease=lease, expected_renewal_seq=0))
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", "lease_lost")

    successor = agent_lease(task, "agent-2")
    assert successor.epoch == lease.epoch + 1
    # Once the next holder has reconciled the switch, "other" may start — but never under the removed epoch.
    record(op, Committed(remote_id="r-switch"), successor)
    assert next_directive(task_id=task.pk, lease=successor).node_key == "other"
    assert_refused(LeaseLost, lambda: send(task, lease, "other"))
    assert send(task, successor, "other").status == OperationStatus.DISPATCHED


def test_a_removed_operator_can_write_nothing_and_the_next_holder_gets_the_next_epoch(
    make_task, agent_lease, clock, root, monkeypatch
) -> None:
    task = make_task(irreversible_plan())
    ann, bob = operator_for(root, task, "ann"), operator_for(root, task, "bob")
    op, lease = handed_over(task, agent_lease, ann, "switch", unknown=True)
    forced = force(root, task)
    assert (forced.removed_holder, forced.epoch) == ("operator:ann", lease.epoch)
    assert forced.open_operations == [{"op_key": op.op_key, "status": "unknown"}]

    assert_refused(LeaseLost, lambda: takeover_renew(actor=ann, lease=lease, expected_renewal_seq=0))
    assert_refused(TakeoverRequired, lambda: resolve(ann, op, "done", receipt=Committed(remote_id="r-switch")))
    with monkeypatch.context() as race:  # the lease was looked up just before the forced release
        race.setattr(settlement, "held_takeover", lambda actor, task_id: lease)
        assert_refused(LeaseLost, lambda: resolve(ann, op, "done", receipt=Committed(remote_id="r-switch")))
    assert_refused(
        LeaseLost,
        lambda: takeover_submit(actor=ann, lease=lease, based_on_version=version(task), decision="resume_agent"),
    )
    assert_refused(LeaseLost, lambda: takeover_release(actor=ann, lease=lease))

    successor = granted(bob, task)
    assert successor.epoch == lease.epoch + 1


@pytest.mark.parametrize("verdict", ["accepted", "disputed"])
def test_another_admin_reviews_a_forced_release_once(make_task, agent_lease, clock, root, verdict) -> None:
    task = make_task()
    agent_lease(task)
    forced = force(root, task)
    other, third = person("other", "admin"), person("third", "admin")

    reviewed = forced_release_review(actor=other, forced_release_id=forced.pk, verdict=verdict, note=REVIEW_NOTE)

    assert (reviewed.status, reviewed.reviewed_by, reviewed.review_note) == (verdict, "user:other", REVIEW_NOTE)
    assert reviewed.reviewed_at == clock.now()
    row = last_audit()
    assert (row.action, row.actor_id, row.reason) == (f"forced_release_{verdict}", "other", REVIEW_NOTE)
    assert (row.task_id, row.lease_epoch, row.details["forced_release"]) == (task.pk, forced.epoch, forced.pk)
    for reviewer in (other, third):
        assert_refused(
            InvalidTransition,
            partial(
                forced_release_review,
                actor=reviewer,
                forced_release_id=forced.pk,
                verdict="accepted",
                note=REVIEW_NOTE,
            ),
        )


@pytest.mark.parametrize(
    ("reviewer", "verdict", "note", "error"),
    [
        ("author", "accepted", REVIEW_NOTE, PermissionDenied),
        ("operator", "accepted", REVIEW_NOTE, PermissionDenied),
        ("other-admin", "accepted", "ok", TakeoverRefused),
        ("other-admin", "disputed", "", TakeoverRefused),
        ("other-admin", "ignored", REVIEW_NOTE, InvalidTransition),
    ],
    ids=["by-its-author", "by-an-operator", "short-note", "no-note", "unknown-verdict"],
)
def test_a_review_by_the_author_a_non_admin_or_without_a_note_is_refused(
    make_task, agent_lease, clock, root, reviewer, verdict, note, error
) -> None:
    task = make_task()
    agent_lease(task)
    forced = force(root, task)
    actor: Principal = root
    if reviewer == "operator":
        actor = operator_for(root, task, "ann")
    elif reviewer == "other-admin":
        actor = person("other", "admin")

    assert_refused(
        error, lambda: forced_release_review(actor=actor, forced_release_id=forced.pk, verdict=verdict, note=note)
    )
    assert ForcedRelease.objects.get(pk=forced.pk).status == "pending"


# --- 7. app-server clock skew ----------------------------------------------------------------------------------


class _MatchesRealDatetimes(type):
    """Metaclass of the skewed datetime: a real datetime (from the database, say) still passes isinstance."""

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, datetime)


SKEWS = [timedelta(minutes=10), -timedelta(minutes=10)]


@pytest.fixture(params=SKEWS, ids=["app-clock-ahead", "app-clock-behind"])
def skewed_app_clock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[timedelta]:
    """Python's clock off by ``param``: django.utils.timezone.now, and datetime.now wherever Reckon's modules
    imported ``datetime`` (still an ``isinstance`` match for real datetimes)."""
    skew: timedelta = request.param
    real_now = timezone.now
    real_datetime = datetime

    class SkewedDatetime(datetime, metaclass=_MatchesRealDatetimes):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Any:
            return real_datetime.now(tz) + skew

    monkeypatch.setattr(timezone, "now", lambda: real_now() + skew)
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("audit", "leases", "tasks", "console") and getattr(module, "datetime", None) is (
            real_datetime
        ):
            monkeypatch.setattr(module, "datetime", SkewedDatetime)
    assert abs(timezone.now() - real_now() - skew) < timedelta(seconds=1)
    yield skew


def database_now() -> datetime:
    return DatabaseClock().now()


def wait_past(moment: datetime) -> None:
    while database_now() <= moment:
        time.sleep(0.01)


def test_operator_lease_decisions_follow_the_database_clock_not_a_skewed_app_clock(
    make_task, root, skewed_app_clock: timedelta, settings: Settings
) -> None:
    settings.RECKON_OPERATOR_LEASE_TTL = timedelta(milliseconds=400)
    settings.RECKON_LEASE_GRACE = timedelta(milliseconds=200)
    task = make_task()
    ann, bob = operator_for(root, task, "ann"), operator_for(root, task, "bob")

    lease = granted(ann, task)

    assert abs(lease.granted_at - database_now()) < timedelta(seconds=2)
    assert lease.expires_at == lease.granted_at + timedelta(milliseconds=400)
    # An app clock 10 minutes ahead would call the lease lapsed, one behind would call it live forever.
    assert_refused(TakeoverHeld, lambda: takeover_claim(actor=bob, task_id=task.pk))
    renewed = takeover_renew(actor=ann, lease=lease, expected_renewal_seq=0)
    assert abs(renewed.expires_at - timedelta(milliseconds=400) - database_now()) < timedelta(seconds=2)
    wait_past(renewed.expires_at + settings.RECKON_LEASE_GRACE)
    assert_refused(LeaseExpired, lambda: takeover_renew(actor=ann, lease=renewed, expected_renewal_seq=1))
    successor = granted(bob, task)
    assert successor.epoch == lease.epoch + 1
    assert AuditEvent.objects.filter(action="takeover_expired", lease_epoch=lease.epoch).count() == 1


def test_a_reserved_claim_waits_for_the_agent_lease_on_the_database_clock(
    make_task, agent_lease, root, skewed_app_clock: timedelta, settings: Settings
) -> None:
    settings.RECKON_LEASE_GRACE = timedelta(milliseconds=400)
    task = make_task()
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task, ttl=timedelta(milliseconds=200))
    assert not takeover_claim(actor=ann, task_id=task.pk).granted

    wait_past(lease.expires_at)
    assert not takeover_claim(actor=ann, task_id=task.pk).granted, "inside the grace the agent may still renew"
    wait_past(lease.expires_at + settings.RECKON_LEASE_GRACE)
    operator_lease = granted(ann, task)

    assert operator_lease.epoch == lease.epoch + 1
    assert abs(operator_lease.granted_at - database_now()) < timedelta(seconds=2)


# --- 8. the takeover package ------------------------------------------------------------------------------------


def test_the_takeover_package_lists_what_a_person_needs_as_data(make_task, agent_lease, clock) -> None:
    switch = effect_node(
        "switch",
        irreversible=True,
        compensation="store.restore_reference",
        depends_on=["copy"],
    )
    task = make_task({"nodes": [copy_node(), switch, effect_node("verify", depends_on=["switch"])]})
    lease = agent_lease(task)
    copy_op = record(
        send(task, lease, "copy"),
        Committed(remote_id="batch-1", remote_version="7", count=100, digest=SOURCE_REF["digest"]),
        lease,
    )
    switch_op = record(send(task, lease, "switch"), interrupted(), lease)
    lease_release(lease=lease)
    before = snapshot()

    package = takeover_package(task.pk)

    assert snapshot() == before, "the package is a read"
    assert json.loads(json.dumps(package)) == package, "plain data, no model rows"
    t = fresh(task)
    assert package["task"] == {"id": task.pk, "version": t.version, "status": t.status, "reason": ""}
    assert package["input_refs"] == {"copy.source": SOURCE_REF}
    assert package["completed"] == [
        {
            "node": "copy",
            "output": {"remote_id": "batch-1", "remote_version": "7", "count": 100, "digest": SOURCE_REF["digest"]},
        }
    ]
    assert [p["node"] for p in package["pending"]] == ["switch", "verify"]
    assert package["operations_to_settle"] == [
        {"op_key": switch_op.op_key, "node": "p1/switch", "status": "unknown", "remote_id": ""}
    ]
    assert package["receipts"] == [
        {
            "op_key": copy_op.op_key,
            "remote_id": "batch-1",
            "remote_version": "7",
            "count": 100,
            "digest": SOURCE_REF["digest"],
        }
    ]
    assert f"query the remote for op key {switch_op.op_key}" in package["suggested_checks"]
    assert "confirm copy.source is still at version 7" in package["suggested_checks"]


def test_there_is_no_takeover_package_for_a_missing_task(db: None) -> None:
    with pytest.raises(TaskNotFound):
        takeover_package(10**9)
