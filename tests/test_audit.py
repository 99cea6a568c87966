"""The audit log (invariant 9): append-only in the model and in the database, hash-chained, written in the
same transaction as the change it records, free of secrets — each rule tried against what should break it."""

import io
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit.hygiene import SecretInPayload, scan_payload
from audit.models import AuditEvent, AuditHead, AuditRefused
from audit.principals import Principal
from audit.services import GENESIS, audit_append, verify_audit
from leases.clock import ControllableClock
from leases.models import ForcedRelease, Lease
from leases.services import lease_release
from tasks.access.permissions import permission_grant, permission_revoke
from tasks.core.errors import VersionConflict
from tasks.core.outcomes import Committed
from tasks.engine.plans import plan_accept, plan_propose
from tasks.engine.protocol import next_directive, operation_start, snapshot_at
from tasks.models import Task
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import TakeoverRefused, forced_release_review, lease_force_release
from tasks.people.settlement import operation_settle_by_hand
from tasks.people.takeover import (
    NodeResult,
    takeover_claim,
    takeover_release,
    takeover_renew,
    takeover_submit,
)
from tests.conftest import as_a_tamperer, chain_plan, person, snapshot
from tests.steps import past_deadline

pytestmark = pytest.mark.django_db

JUSTIFICATION = "agent worker-7 has been wedged for an hour"
IMPACT = "its in-flight copy is reconciled by op key afterwards"
REVIEW_NOTE = "agreed: the worker was stuck and nothing was lost"
CREATOR = Principal.agent("tester")  # make_task's tasks are created by agent:tester: it may cancel them
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 3
URL_WITH_PASSWORD = "https://deploy:hunter2@store.example/bucket"


def current(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def append_events(clock: ControllableClock, count: int) -> list[AuditEvent]:
    """``count`` events, each in its own transaction, as services write them."""
    events = []
    for index in range(1, count + 1):
        with transaction.atomic():
            events.append(
                audit_append(
                    actor=Principal.system("test"),
                    action=f"step_{index}",
                    at=clock.now(),
                    task_id=index,
                    reason=f"reason {index}",
                    details={"index": index},
                )
            )
    return events


def row(seq: int) -> dict[str, Any]:
    return dict(AuditEvent.objects.filter(seq=seq).values().get())


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


# --- appending: only inside a transaction, one chain ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_audit_append_refuses_to_run_outside_a_transaction(clock) -> None:
    assert not connection.in_atomic_block
    with pytest.raises(RuntimeError, match="inside the transaction"):
        audit_append(actor=Principal.system("test"), action="loose", at=clock.now())
    assert not AuditEvent.objects.exists()
    assert not AuditHead.objects.exists()


def test_events_chain_each_to_the_one_before_with_seq_contiguous_from_one(make_task, clock) -> None:
    append_events(clock, 3)
    root, ann = person("root", "admin"), person("ann", "operator")
    permission_grant(actor=root, user=ann.user, task=make_task())
    append_events(clock, 2)
    events = list(AuditEvent.objects.order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[0].prev_digest == GENESIS
    assert [e.prev_digest for e in events[1:]] == [e.digest for e in events[:-1]]
    assert len({e.digest for e in events}) == len(events)
    head = AuditHead.objects.get()
    assert (head.seq, head.digest) == (6, events[-1].digest)
    assert verify_audit().problem is None


# --- append-only in the model -------------------------------------------------------------------------------------


def test_saving_an_existing_event_is_refused(clock) -> None:
    event = append_events(clock, 2)[0]
    before = row(1)
    event.reason = "rewritten"
    with pytest.raises(AuditRefused):
        event.save()
    with pytest.raises(AuditRefused):
        event.save(update_fields=["reason"])
    assert row(1) == before


def test_deleting_an_event_is_refused(clock) -> None:
    event = append_events(clock, 2)[0]
    with pytest.raises(AuditRefused):
        event.delete()
    assert AuditEvent.objects.count() == 2


def test_updating_events_through_a_queryset_is_refused(clock) -> None:
    append_events(clock, 2)
    before = list(AuditEvent.objects.values())
    with pytest.raises(AuditRefused):
        AuditEvent.objects.filter(seq=1).update(reason="rewritten")
    with pytest.raises(AuditRefused):
        AuditEvent.objects.all().update(reason="rewritten")
    events = list(AuditEvent.objects.all())
    for event in events:
        event.reason = "rewritten"
    with pytest.raises(AuditRefused), transaction.atomic():
        AuditEvent.objects.bulk_update(events, ["reason"])
    assert list(AuditEvent.objects.values()) == before


def test_deleting_events_through_a_queryset_is_refused(clock) -> None:
    append_events(clock, 2)
    with pytest.raises(AuditRefused):
        AuditEvent.objects.filter(seq=1).delete()
    with pytest.raises(AuditRefused):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.count() == 2


def test_the_base_manager_cannot_update_or_delete_events_either(clock) -> None:
    """Django itself uses the base manager (related objects, cascades): the model's refusal is not the only wall."""
    append_events(clock, 2)
    before = list(AuditEvent.objects.values())
    with pytest.raises((AuditRefused, DatabaseError)), transaction.atomic():
        AuditEvent._base_manager.filter(seq=1).update(reason="rewritten")
    with pytest.raises((AuditRefused, DatabaseError)), transaction.atomic():
        AuditEvent._base_manager.filter(seq=1).delete()
    assert list(AuditEvent.objects.values()) == before


# --- append-only in the database ----------------------------------------------------------------------------------


def test_the_database_refuses_a_raw_update(clock) -> None:
    append_events(clock, 3)
    before = list(AuditEvent.objects.values())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        raw("UPDATE audit_auditevent SET reason = %s WHERE seq = %s", ["rewritten", 2])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        raw("UPDATE audit_auditevent SET digest = prev_digest")
    assert list(AuditEvent.objects.values()) == before


def test_the_database_refuses_a_raw_delete(clock) -> None:
    append_events(clock, 3)
    before = list(AuditEvent.objects.values())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        raw("DELETE FROM audit_auditevent WHERE seq = %s", [2])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        raw("DELETE FROM audit_auditevent")
    assert list(AuditEvent.objects.values()) == before


# --- tamper evidence ----------------------------------------------------------------------------------------------

TAMPERINGS = {
    "reason of #3 changed": (["UPDATE audit_auditevent SET reason = 'nothing to see' WHERE seq = 3"], 3, "altered"),
    "details of #3 changed": (
        ["UPDATE audit_auditevent SET details = '{\"index\": 30}' WHERE seq = 3"],
        3,
        "altered",
    ),
    "#3 deleted": (["DELETE FROM audit_auditevent WHERE seq = 3"], 3, "missing"),
    "#1 deleted": (["DELETE FROM audit_auditevent WHERE seq = 1"], 1, "missing"),
    "newest #5 deleted": (["DELETE FROM audit_auditevent WHERE seq = 5"], 5, "head"),
    "digest of #3 changed": (["UPDATE audit_auditevent SET digest = '" + "f" * 64 + "' WHERE seq = 3"], 3, "altered"),
    "#4 altered, then #2 altered": (
        [
            "UPDATE audit_auditevent SET reason = 'later' WHERE seq = 4",
            "UPDATE audit_auditevent SET reason = 'earlier' WHERE seq = 2",
        ],
        2,
        "altered",
    ),
}


@pytest.mark.parametrize(("statements", "first_broken", "problem"), TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_verify_audit_reports_the_first_broken_link(clock, statements, first_broken, problem) -> None:
    append_events(clock, 5)
    assert verify_audit().problem is None
    as_a_tamperer()
    for sql in statements:
        raw(sql)
    verdict = verify_audit()
    assert verdict.broken_at == first_broken, verdict
    assert verdict.problem is not None
    assert f"#{first_broken}" in verdict.problem
    assert problem in verdict.problem


def test_manage_py_verify_audit_fails_and_prints_the_first_broken_link(clock) -> None:
    append_events(clock, 5)
    intact = io.StringIO()
    call_command("verify_audit", stdout=intact)
    assert "5 events, chain intact" in intact.getvalue()
    as_a_tamperer()
    raw("UPDATE audit_auditevent SET reason = 'nothing to see' WHERE seq = 3")
    raw("DELETE FROM audit_auditevent WHERE seq = 4")
    out = io.StringIO()
    with pytest.raises(CommandError, match="#3"):
        call_command("verify_audit", stdout=out)
    assert "FIRST BROKEN LINK: audit event #3 " in out.getvalue()


# --- the same transaction as the change ---------------------------------------------------------------------------


def test_a_stale_takeover_submit_writes_no_audit_row(make_task, clock) -> None:
    task = make_task(chain_plan("a"))
    ann = person("ann", "admin")
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert claim.lease is not None
    form_version = current(task).version
    task_request_cancel(actor=CREATOR, task_id=task.pk, reason="the customer withdrew the order")
    before = snapshot()
    with pytest.raises(VersionConflict, match="cancel_requested"):
        takeover_submit(
            actor=ann, lease=claim.lease, based_on_version=form_version, decision="resume_agent", note="all checked"
        )
    assert snapshot() == before
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["takeover_granted", "cancel_requested"]


@pytest.mark.parametrize(
    ("justification", "impact"),
    [("", IMPACT), (" " * 40, IMPACT), ("too short", IMPACT), (JUSTIFICATION, ""), (JUSTIFICATION, "short")],
    ids=["no justification", "blank justification", "short justification", "no impact", "short impact"],
)
def test_a_refused_forced_release_writes_no_audit_row(make_task, agent_lease, clock, justification, impact) -> None:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root = person("root", "admin")
    before = snapshot()
    with pytest.raises(TakeoverRefused):
        lease_force_release(actor=root, task_id=task.pk, justification=justification, impact=impact)
    assert snapshot() == before
    assert not AuditEvent.objects.exists()


class AuditDown(Exception):
    pass


def _scenario_claim(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    admin = person("ann", "admin")
    return lambda: takeover_claim(actor=admin, task_id=task.pk)


def _scenario_takeover_requested(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    admin = person("ann", "admin")
    return lambda: takeover_claim(actor=admin, task_id=task.pk)


def _scenario_submit(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    admin = person("ann", "admin")
    lease = takeover_claim(actor=admin, task_id=task.pk).lease
    assert lease is not None
    version = current(task).version
    return lambda: takeover_submit(
        actor=admin,
        lease=lease,
        based_on_version=version,
        decision="end_task",
        end_status="completed",
        results=[NodeResult(node_key="a", remote_id="r-a")],
    )


def _scenario_force_release(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root = person("root", "admin")
    return lambda: lease_force_release(actor=root, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)


def _scenario_review(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root, other = person("root", "admin"), person("other", "admin")
    forced = lease_force_release(actor=root, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)
    return lambda: forced_release_review(actor=other, forced_release_id=forced.pk, verdict="disputed", note=REVIEW_NOTE)


def _scenario_cancel(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    return lambda: task_request_cancel(actor=CREATOR, task_id=task.pk, reason="not needed now")


def _scenario_grant(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    root, ann = person("root", "admin"), person("ann", "operator")
    return lambda: permission_grant(actor=root, user=ann.user, project="billing")


def _scenario_task_grant(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    root, ann = person("root", "admin"), person("ann", "operator")
    return lambda: permission_grant(actor=root, user=ann.user, task=task)


def _scenario_resolve(make_task: Callable[..., Task], agent_lease: Any, clock: Any) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    d = next_directive(task_id=task.pk, lease=lease)
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), "a", lease=lease
    ).operation
    lease_release(lease=lease)
    admin = person("ann", "admin")
    held = takeover_claim(actor=admin, task_id=task.pk).lease
    assert held is not None
    version = current(task).version
    past_deadline(clock, op)  # "not done" is final: no request under the op key can land any more
    return lambda: operation_settle_by_hand(
        actor=admin,
        task_id=task.pk,
        op_key=op.op_key,
        expected_version=version,
        resolution="not_done",
        note="nothing in the remote's history",
    )


def _scenario_plan_accepted_after_replan(
    make_task: Callable[..., Task], agent_lease: Any, clock: Any
) -> Callable[[], object]:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    revision = plan_propose(
        task_id=task.pk,
        plan=chain_plan("a", "b"),
        proposed_by="agent:model",
        expected_version=current(task).version,
        lease=lease,
    )
    version = current(task).version
    return lambda: plan_accept(revision_id=revision.pk, expected_version=version, lease=lease)


AUDITED_CHANGES = {
    "takeover granted": _scenario_claim,
    "takeover requested": _scenario_takeover_requested,
    "result submitted": _scenario_submit,
    "forced release": _scenario_force_release,
    "forced release reviewed": _scenario_review,
    "cancel requested": _scenario_cancel,
    "project permission granted": _scenario_grant,
    "task permission granted": _scenario_task_grant,
    "operation resolved by a person": _scenario_resolve,
    "plan accepted after replan": _scenario_plan_accepted_after_replan,
}


@pytest.mark.parametrize("scenario", AUDITED_CHANGES.values(), ids=AUDITED_CHANGES.keys())
def test_a_change_whose_audit_row_cannot_be_written_is_rolled_back(
    make_task, agent_lease, clock, monkeypatch, scenario
) -> None:
    change = scenario(make_task, agent_lease, clock)
    before = snapshot()
    granted_before = list(User.objects.filter(userobjectpermission__isnull=False).values_list("pk", flat=True))

    def audit_insert_fails(self: AuditEvent, *args: Any, **kwargs: Any) -> None:
        raise AuditDown("the audit insert failed")

    monkeypatch.setattr(AuditEvent, "save", audit_insert_fails)
    with pytest.raises(AuditDown):
        change()
    assert snapshot() == before
    assert list(User.objects.filter(userobjectpermission__isnull=False).values_list("pk", flat=True)) == granted_before


# --- no secrets -----------------------------------------------------------------------------------------------------


def secret_or_clean[T](call: Callable[[str], T], secret: str, clean: str) -> T:
    """Try to smuggle a secret through a free-text field; a refusal is fine, then the clean text is used."""
    try:
        return call(secret)
    except SecretInPayload:
        return call(clean)


def audit_leaks() -> list[str]:
    leaks = []
    for event in AuditEvent.objects.order_by("seq"):
        fields = {"reason": event.reason, "impact": event.impact, "details": event.details}
        leaks += [f"#{event.seq} {event.action}: {path}" for path in scan_payload(fields)]
    return leaks


def test_after_a_full_scenario_no_audit_row_carries_a_secret_and_the_chain_verifies(
    make_task, agent_lease, clock
) -> None:
    task = make_task(chain_plan("a", "b"), project="billing", kind="migrate")
    root, other, ann = person("root", "admin"), person("other", "admin"), person("ann", "operator")
    permission_grant(actor=root, user=ann.user, project="billing")
    permission_grant(actor=root, user=ann.user, task=task)

    lease = agent_lease(task)
    d = next_directive(task_id=task.pk, lease=lease)
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), "a", lease=lease
    ).operation
    assert not takeover_claim(actor=ann, task_id=task.pk).granted
    lease_release(lease=lease)
    held = takeover_claim(actor=ann, task_id=task.pk).lease
    assert held is not None
    clock.advance(timedelta(seconds=30))
    audited = AuditEvent.objects.count()
    renewed = takeover_renew(actor=ann, lease=held, expected_renewal_seq=held.renewal_seq)
    assert (renewed.renewal_seq, renewed.expires_at > held.expires_at) == (held.renewal_seq + 1, True)
    assert AuditEvent.objects.count() == audited, "a renewal extends the lease and is not audited row by row"
    held = renewed

    def resolve(note: str) -> object:
        return operation_settle_by_hand(
            actor=ann,
            task_id=task.pk,
            op_key=op.op_key,
            expected_version=current(task).version,
            resolution="done",
            receipt=Committed(remote_id="r-a", digest="sha256:" + "ab" * 32),
            note=note,
        )

    secret_or_clean(resolve, f"confirmed in the console, logged in with {GITHUB_TOKEN}", "confirmed in the console")

    def submit(evidence_url: str) -> object:
        return takeover_submit(
            actor=ann,
            lease=held,
            based_on_version=current(task).version,
            decision="replan",
            replan_reason="node b must write to the new bucket",
            results=[],
            note=f"see {evidence_url}",
        )

    secret_or_clean(submit, URL_WITH_PASSWORD, "https://store.example/bucket")

    lease = agent_lease(task)
    revision = plan_propose(
        task_id=task.pk,
        plan=chain_plan("a", "b", "c"),
        proposed_by="agent:model",
        expected_version=current(task).version,
        lease=lease,
    )
    plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)

    def force(justification: str) -> ForcedRelease:
        return lease_force_release(actor=root, task_id=task.pk, justification=justification, impact=IMPACT)

    forced = secret_or_clean(force, f"{JUSTIFICATION}; its token is {GITHUB_TOKEN}", JUSTIFICATION)

    def review(note: str) -> ForcedRelease:
        return forced_release_review(actor=other, forced_release_id=forced.pk, verdict="accepted", note=note)

    secret_or_clean(review, f"{REVIEW_NOTE}; I checked with {URL_WITH_PASSWORD}", REVIEW_NOTE)

    held_again = takeover_claim(actor=ann, task_id=task.pk).lease
    assert held_again is not None

    def release(reason: str) -> Lease:
        return takeover_release(actor=ann, lease=held_again, reason=reason)

    secret_or_clean(release, f"handing over; the store password is in {URL_WITH_PASSWORD}", "handing over")

    def cancel(reason: str) -> Task:
        return task_request_cancel(actor=Principal.of_user(ann.user), task_id=task.pk, reason=reason)

    long_prose = (
        "the customer withdrew the order after the migration window closed. " * 8
    )  # past the event's and the task row's cuts
    secret_or_clean(cancel, f"{long_prose}Their key was {GITHUB_TOKEN}", long_prose)
    permission_revoke(actor=root, user=ann.user, project="billing")
    permission_revoke(actor=root, user=ann.user, task=task)

    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {
        "permission_granted",
        "takeover_requested",
        "takeover_granted",
        "operation_resolved_by_person",
        "takeover_result_submitted",
        "plan_accepted_after_replan",
        "lease_forced_release",
        "forced_release_accepted",
        "takeover_released",
        "cancel_requested",
        "permission_revoked",
    } <= actions, actions
    verdict = verify_audit()
    assert (audit_leaks(), verdict.problem) == ([], None)
