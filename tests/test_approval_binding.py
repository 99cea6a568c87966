"""An approval bound to the exact call (tasks/decide/approval_binding.py, tasks/people/approvals.py): it permits the
digest of the request its gated operation will send, under the plan revision it was given under, until it expires on
the database clock — and every way to start the gated operation outside that is refused by name, writing nothing:
a changed request, a moved plan, an expired approval, a stale form, a binding rewritten in the database. Proposed,
approved and executed are three events of the log, shown over the API and on the task page, and audited."""

import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F
from django.test import Client

from api.tokens import api_token_issue
from audit.errors import Refused
from audit.hygiene import digest_of
from audit.models import AuditEvent
from audit.principals import Principal
from leases.clock import ControllableClock
from leases.models import Lease
from leases.services import lease_acquire, lease_open, lease_release
from tasks.access.permissions import can_operate, permission_grant
from tasks.core.errors import (
    ApprovalExpired,
    ApprovalMissing,
    ApprovalPlanMoved,
    ApprovalRequestChanged,
    ApprovalTtlInvalid,
    InvalidTransition,
    StoredFactAltered,
    VersionConflict,
)
from tasks.core.lifecycle import NodeStatus, TaskStatus
from tasks.core.outcomes import Committed
from tasks.engine.plans import plan_accept, plan_propose
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.engine.verification import find_problems
from tasks.models import Event, Node, Operation, Task
from tasks.people.approvals import node_approve, node_approve_and_resume
from tasks.people.replan import plan_accept_by_person, plan_propose_by_person
from tasks.people.takeover import takeover_claim
from tests.conftest import EFFECT, effect_node, person, snapshot
from tests.steps import asked, record, send, version

pytestmark = pytest.mark.django_db

KIND = "copy"
B_INPUT = {"target": "t-1", "batch": 1, "limit": 5}
# b's request once a committed "target-7": what its start sends, and what an approval of it permits.
B_DIGEST = digest_of({"action": EFFECT, "input": {**B_INPUT, "source": "target-7"}})


def approval(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}, **extra}


def gated_plan(**b: Any) -> dict[str, Any]:
    """a, then the approval ok, then b — the gated operation — reading a's output."""
    b_input = {**B_INPUT, "source": {"from": "a", "field": "remote_id"}}
    return {
        "nodes": [
            effect_node("a"),
            approval("ok", depends_on=["a"]),
            effect_node("b", depends_on=["ok"], input=b_input, **b),
        ]
    }


@pytest.fixture
def root() -> Principal:
    return person("root", "admin")


@pytest.fixture
def ann(root: Principal) -> Principal:
    return person("ann", "operator")


def events(task: Task, after: int = 0) -> list[Event]:
    return list(Event.objects.filter(task=task, seq__gt=after).order_by("seq"))


def node(task: Task, key: str) -> Node:
    plan = Task.objects.values_list("plan_version", flat=True).get(pk=task.pk)
    return Node.objects.get(task=task, plan_version=plan, key=key)


def refused(error: type[Refused], call: Any) -> Refused:
    """``call`` is refused with ``error`` and nothing is written: every row of every table (events, audit rows,
    operations, nodes, the lease's expiry) is as it was."""
    before = snapshot()
    with pytest.raises(error) as caught:
        call()
    assert snapshot() == before, "a refusal writes nothing"
    return caught.value


def at_the_gate(make_task: Any, plan: dict[str, Any] | None = None) -> tuple[Task, Lease]:
    """A task whose agent ran ``a`` and stopped at the approval (recording what it asks), lease released."""
    task = make_task(plan or gated_plan(), kind=KIND)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")
    record(send(task, lease, "a"), Committed(remote_id="target-7"), lease)
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.reason, d.node_key) == ("stop", "awaiting_approval", "ok")
    lease_release(lease=lease)
    return task, lease


def approve(task: Task, who: Principal, root: Principal, **given: Any) -> Task:
    """``who`` takes the task over, approves ok as the page shows it and hands it back."""
    if not can_operate(who, task):
        permission_grant(actor=root, user=who.user, task=task)
    if lease_open(task.pk) is None:
        assert takeover_claim(actor=who, task_id=task.pk).granted
    return node_approve_and_resume(
        actor=who, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok"), **given
    )


def grant_and_claim(who: Principal, root: Principal, task: Task) -> None:
    if not can_operate(who, task):
        permission_grant(actor=root, user=who.user, task=task)
    assert takeover_claim(actor=who, task_id=task.pk).granted


def approved_and_back(make_task: Any, ann: Principal, root: Principal, **given: Any) -> tuple[Task, Lease]:
    task, _ = at_the_gate(make_task)
    approve(task, ann, root, **given)
    return task, lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")


def start_b(task: Task, lease: Lease) -> Operation:
    return send(task, lease, "b")


# --- proposed, approved, executed ---------------------------------------------------------------------------------


def test_proposed_approved_and_executed_are_three_events_in_order(make_task, clock, ann, root) -> None:
    task, _ = at_the_gate(make_task)
    [proposed] = [e for e in events(task) if e.type == "approval_proposed"]
    # The digest is of the request b's start will send: its action and its input, resolved from a's receipt.
    b_request = {"action": EFFECT, "input": {**B_INPUT, "source": "target-7"}}
    requests = {"b": digest_of(b_request)}
    assert proposed.payload["data"] | {"node": None} == {
        "node": None,
        "digest": digest_of(requests),
        "requests": requests,
        "plan_revision": 1,
        "why": "approval_missing",
        "by": "agent:agent-1",
    }
    assert proposed.payload["nodes"] == {"p1/ok": {"approval_proposed_digest": digest_of(requests)}}

    approve(task, ann, root, note="read the diff")
    [given] = [e for e in events(task) if e.type == "node_approved"]
    assert given.seq > proposed.seq
    expires_at = given.created_at + settings.RECKON_APPROVAL_TTL
    assert {k: given.payload["data"][k] for k in ("digest", "requests", "plan_revision", "expires_at", "by")} == {
        "digest": digest_of(requests),
        "requests": requests,
        "plan_revision": 1,
        "expires_at": expires_at.isoformat(),
        "by": "user:ann",
    }
    assert given.payload["nodes"]["p1/ok"] | {"output": None} == {
        "status": "succeeded",
        "output": None,
        "last_error_class": "",
        "next_allowed_action": "",
        "not_before": None,
        "approval_proposed_digest": "",
        "approval_digest": digest_of(requests),
        "approval_requests": requests,
        "approval_plan_version": 1,
        "approval_expires_at": expires_at.isoformat(),
        "approval_seq": given.seq,
        "approved_by": "user:ann",
    }

    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")
    assert next_directive(task_id=task.pk, lease=lease).node_key == "b"
    op = start_b(task, lease)
    assert op.request == b_request and op.request_digest == requests["b"]
    dispatched, executed = events(task, after=given.seq)[-2:]
    assert (dispatched.type, executed.type) == ("operation_dispatched", "approval_executed")
    assert executed.seq == dispatched.seq + 1 == version(task), "one write: the start and its execution"
    assert executed.payload["data"] == {
        "node": "p1/b",
        "op_key": op.op_key,
        "request_digest": requests["b"],
        "approvals": [
            {
                "node": "p1/ok",
                "seq": given.seq,
                "digest": digest_of(requests),
                "plan_revision": 1,
                "expires_at": expires_at.isoformat(),
                "by": "user:ann",
            }
        ],
        "by": "agent:agent-1",
    }
    record(op, Committed(remote_id="batch-1"), lease)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED
    assert find_problems(Task.objects.get(pk=task.pk)) == [], "verify_log rebuilds the bindings from the log"


def test_the_proposal_is_recorded_once_per_request(make_task, agent_lease, clock) -> None:
    task, _ = at_the_gate(make_task)
    lease = agent_lease(task)
    before = snapshot()
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.reason, d.node_key, d.task_version) == ("stop", "awaiting_approval", "ok", version(task))
    assert snapshot() == before, "asked again: the log holds the proposal already"


def test_the_audit_row_of_an_approval_names_digest_revision_and_expiry(make_task, clock, ann, root) -> None:
    task, _ = at_the_gate(make_task)
    digest = asked(task, "ok")
    approve(task, ann, root, note="checked", ttl=timedelta(minutes=20))
    given = next(e for e in events(task) if e.type == "node_approved")
    row = AuditEvent.objects.get(task_id=task.pk, action="node_approved")
    assert (row.actor_id, row.reason, row.version_after) == ("ann", "checked", given.seq)
    assert {k: row.details[k] for k in ("digest", "requests", "plan_revision", "expires_at", "ttl_seconds")} == {
        "digest": digest,
        "requests": node(task, "ok").approval_requests,
        "plan_revision": 1,
        "expires_at": (row.at + timedelta(minutes=20)).isoformat(),
        "ttl_seconds": 1200,
    }
    assert node(task, "ok").approval_expires_at == row.at + timedelta(minutes=20)


# --- the gated start: refused for a changed request, a moved plan, an expired approval -------------------------


def test_a_changed_request_is_refused_and_writes_nothing(make_task, clock, ann, root) -> None:
    task, lease = approved_and_back(make_task, ann, root)
    Node.objects.filter(task=task, key="b").update(input={**B_INPUT, "limit": 500, "source": "target-7"})
    error = refused(ApprovalRequestChanged, lambda: start_b(task, lease))
    assert (
        error.details["approval"] == "ok"
        and error.details["approved_digest"] == node(task, "ok").approval_requests["b"]
    )
    # The agent is told to wait for a new approval, and why.
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.reason, d.node_key) == ("stop", "awaiting_approval", "ok")
    assert events(task)[-1].payload["data"]["why"] == "approval_request_changed"


def test_a_moved_plan_is_refused_and_writes_nothing(make_task, clock, ann, root) -> None:
    task, lease = approved_and_back(make_task, ann, root)
    plan = gated_plan()
    plan["nodes"].append(effect_node("c", depends_on=["b"]))  # a, ok and b are kept as they are
    revision = plan_propose(
        task_id=task.pk, plan=plan, proposed_by="agent:agent-1", expected_version=version(task), lease=lease
    )
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    kept = node(task, "ok")
    assert (kept.plan_version, kept.status, kept.approval_plan_version) == (2, NodeStatus.SUCCEEDED, 1)
    error = refused(ApprovalPlanMoved, lambda: start_b(task, lease))
    assert error.details["approved_plan_revision"] == 1


def test_a_re_plan_invalidates_the_approval_until_a_person_approves_again(make_task, clock, ann, root) -> None:
    task, lease = approved_and_back(make_task, ann, root)
    first = node(task, "ok").approval_seq
    plan = gated_plan()
    plan["nodes"].append(effect_node("c", depends_on=["b"]))
    revision = plan_propose(
        task_id=task.pk, plan=plan, proposed_by="agent:agent-1", expected_version=version(task), lease=lease
    )
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.reason, d.node_key) == ("stop", "awaiting_approval", "ok")
    asked_again = events(task)[-1]
    assert (asked_again.type, asked_again.payload["data"]["plan_revision"]) == ("approval_proposed", 2)
    assert asked_again.payload["data"]["why"] == "approval_plan_moved"
    lease_release(lease=lease)
    approve(task, ann, root)
    again = node(task, "ok")
    assert again.approval_plan_version == 2 and again.approval_seq is not None and again.approval_seq > (first or 0)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")
    op = start_b(task, lease)
    assert events(task)[-1].payload["data"]["approvals"][0]["plan_revision"] == 2
    assert op.request_digest == again.approval_requests["b"]
    assert find_problems(Task.objects.get(pk=task.pk)) == [], "the carried binding and the new one are the log's"


def test_an_expired_approval_is_refused_and_writes_nothing(make_task, clock: ControllableClock, ann, root) -> None:
    task, lease = approved_and_back(make_task, ann, root, ttl=timedelta(minutes=10))
    expires_at = node(task, "ok").approval_expires_at
    assert expires_at is not None
    clock.set(expires_at)  # exactly at its expiry: expired, as a lease is
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-2")
    error = refused(ApprovalExpired, lambda: start_b(task, lease))
    assert error.details["expires_at"] == expires_at.isoformat()
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.reason, d.node_key) == ("stop", "awaiting_approval", "ok")
    assert events(task)[-1].payload["data"]["why"] == "approval_expired"


def test_an_approval_binds_until_just_before_its_expiry(make_task, clock: ControllableClock, ann, root) -> None:
    task, _ = approved_and_back(make_task, ann, root, ttl=timedelta(minutes=10))
    expires_at = node(task, "ok").approval_expires_at
    assert expires_at is not None
    clock.set(expires_at - timedelta(microseconds=1))
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-2")
    assert next_directive(task_id=task.pk, lease=lease).kind == "execute"
    start_b(task, lease)
    assert events(task)[-1].type == "approval_executed"


def test_after_expiry_a_new_approval_lets_the_operation_start(make_task, clock: ControllableClock, ann, root) -> None:
    task, lease = approved_and_back(make_task, ann, root)
    first = node(task, "ok").approval_seq
    lease_release(lease=lease)
    clock.advance(settings.RECKON_APPROVAL_TTL)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-2")
    assert next_directive(task_id=task.pk, lease=lease).reason == "awaiting_approval"
    lease_release(lease=lease)
    approve(task, ann, root)
    assert node(task, "ok").approval_seq != first
    assert Operation.objects.filter(node=node(task, "ok")).count() == 2, "a second approval record, its own receipt"
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")
    start_b(task, lease)
    assert events(task)[-1].payload["data"]["approvals"][0]["seq"] == node(task, "ok").approval_seq
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def test_an_approval_given_with_a_typed_receipt_binds_nothing(make_task, clock, ann, root) -> None:
    """A succeeded approval node with no binding (a takeover result, a row set by hand) permits no call."""
    task, lease = at_the_gate(make_task)
    Node.objects.filter(task=task, key="ok").update(status=NodeStatus.SUCCEEDED)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")
    refused(ApprovalMissing, lambda: start_b(task, lease))


def test_a_gated_start_is_never_shared_with_the_previous_receipt(make_task, agent_lease, clock, ann, root) -> None:
    """In a chain the receipt's commit starts the next node (start_next); a gated node starts in its own write, so
    the rule judges it and its execution is recorded with it."""
    plan = {"nodes": [approval("ok"), effect_node("a", depends_on=["ok"]), effect_node("b", depends_on=["a", "ok"])]}
    task = make_task(plan, kind=KIND)
    lease = agent_lease(task)
    next_directive(task_id=task.pk, lease=lease)
    lease_release(lease=lease)
    approve(task, ann, root)
    lease = agent_lease(task)
    op = send(task, lease, "a")
    step = record_outcome(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=version(task)),
        op.op_key,
        Committed(remote_id="r-a"),
        lease=lease,
        start_next=True,
    )
    assert step.started is None, "b is an approval's gated node: not started with a's receipt"
    # b reads nothing from a: its request was known, and bound, when ok was approved.
    b = operation_start(step.snapshot, "b", lease=lease).operation
    assert events(task)[-1].type == "approval_executed" and b.request_digest == node(task, "ok").approval_requests["b"]


def test_a_gated_request_not_known_at_approval_time_needs_its_own_approval(
    make_task, agent_lease, clock, ann, root
) -> None:
    """x and y both wait for ok; y reads x's output, unknown when ok was approved: ok does not cover it, and y asks
    for an approval of its own request once x has run."""
    plan = {
        "nodes": [
            approval("ok"),
            effect_node("x", depends_on=["ok"]),
            effect_node("y", depends_on=["ok", "x"], input={"source": {"from": "x", "field": "remote_id"}}),
        ]
    }
    task = make_task(plan, kind=KIND)
    lease = agent_lease(task)
    next_directive(task_id=task.pk, lease=lease)
    lease_release(lease=lease)
    assert list(events(task)[-1].payload["data"]["requests"]) == ["x"]
    approve(task, ann, root)
    lease = agent_lease(task)
    record(send(task, lease, "x"), Committed(remote_id="r-x"), lease)
    refused(ApprovalRequestChanged, lambda: send(task, lease, "y"))
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.reason, d.node_key) == ("awaiting_approval", "ok")
    assert list(events(task)[-1].payload["data"]["requests"]) == ["y"]
    lease_release(lease=lease)
    approve(task, ann, root)
    lease = agent_lease(task)
    y = send(task, lease, "y")
    assert y.request["input"] == {"source": "r-x"}


# --- the person's side: a stale form, the validity asked for, approving what binds already ------------------------


def test_a_stale_form_with_an_old_digest_is_refused_and_writes_nothing(make_task, clock, ann, root) -> None:
    """A page made under plan 1 posts its digest after a re-plan changed the request (the version it names is the
    current one): the approval would permit what the person never saw — refused."""
    task, _ = at_the_gate(make_task)
    shown = asked(task, "ok")
    grant_and_claim(ann, root, task)
    changed = gated_plan()
    changed["nodes"][2]["input"]["limit"] = 50  # b will send another request under the new plan
    revision = plan_propose_by_person(
        actor=ann, task_id=task.pk, plan=changed, expected_version=version(task), reason="b copies 50, not 5"
    )
    plan_accept_by_person(actor=ann, revision_id=revision.pk, expected_version=version(task))
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    assert asked(task, "ok") != shown
    error = refused(
        ApprovalRequestChanged,
        lambda: node_approve(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=shown
        ),
    )
    assert error.details == {"approval": "ok", "approving": shown, "asked": asked(task, "ok")}


def test_a_stale_version_is_refused_before_the_digest(make_task, clock, ann, root) -> None:
    task, _ = at_the_gate(make_task)
    seen, digest = version(task), asked(task, "ok")
    grant_and_claim(ann, root, task)
    refused(
        VersionConflict,
        lambda: node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=seen, approving=digest),
    )


@pytest.mark.parametrize(
    "ttl", [timedelta(0), timedelta(seconds=-5), settings.RECKON_APPROVAL_TTL_MAX + timedelta(seconds=1)]
)
def test_a_validity_outside_the_bounds_is_refused(make_task, clock, ann, root, ttl) -> None:
    task, _ = at_the_gate(make_task)
    grant_and_claim(ann, root, task)
    refused(
        ApprovalTtlInvalid,
        lambda: node_approve(
            actor=ann,
            task_id=task.pk,
            node_key="ok",
            expected_version=version(task),
            approving=asked(task, "ok"),
            ttl=ttl,
        ),
    )


def test_the_longest_validity_is_allowed(make_task, clock, ann, root) -> None:
    task, _ = at_the_gate(make_task)
    approve(task, ann, root, ttl=settings.RECKON_APPROVAL_TTL_MAX)
    row = AuditEvent.objects.get(task_id=task.pk, action="node_approved")
    assert node(task, "ok").approval_expires_at == row.at + settings.RECKON_APPROVAL_TTL_MAX


def test_an_approval_that_binds_is_not_given_again(make_task, clock, ann, root) -> None:
    task, lease = approved_and_back(make_task, ann, root)
    lease_release(lease=lease)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    refused(
        InvalidTransition,
        lambda: node_approve(
            actor=ann,
            task_id=task.pk,
            node_key="ok",
            expected_version=version(task),
            approving=node(task, "ok").approval_digest,
        ),
    )


# --- the other paths to the row, closed in the database ------------------------------------------------------------


def _rewrite(task: Task, **fields: Any) -> None:
    with transaction.atomic():
        Node.objects.filter(task=task, key="ok").update(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"approval_expires_at": F("approval_expires_at") + timedelta(days=30)},
        {"approval_digest": "sha256:" + "1" * 64},
        {"approval_requests": {"b": "sha256:" + "2" * 64}},
        {"approval_plan_version": 2},
        {"approved_by": "user:mallory"},
        {"approval_seq": F("approval_seq") - 1},
    ],
    ids=["stretched", "digest", "requests", "revision", "approver", "seq-back"],
)
def test_a_binding_is_not_rewritten_in_place(make_task, clock, ann, root, fields) -> None:
    task, _ = approved_and_back(make_task, ann, root)
    before = snapshot()
    with pytest.raises(DatabaseError):
        _rewrite(task, **fields)
    assert snapshot() == before


@pytest.mark.parametrize(
    "fields",
    [
        {"approved_by": "agent:agent-1"},  # another principal: only a person approves
        {"approved_by": ""},
        {"approval_digest": "not a digest"},
        {"approval_expires_at": None},
        {"approval_plan_version": 9},  # ahead of its node's plan
    ],
    ids=["agent", "nobody", "digest", "no-expiry", "ahead"],
)
def test_a_forged_binding_is_refused_by_the_database(make_task, clock, fields) -> None:
    task, _ = at_the_gate(make_task)
    forged = {
        "status": NodeStatus.SUCCEEDED,
        "approval_digest": "sha256:" + "3" * 64,
        "approval_requests": {"b": "sha256:" + "4" * 64},
        "approval_plan_version": 1,
        "approval_expires_at": clock.now() + timedelta(hours=1),
        "approval_seq": version(task),
        "approved_by": "user:mallory",
    }
    before = snapshot()
    with pytest.raises(IntegrityError):
        _rewrite(task, **(forged | fields))
    assert snapshot() == before


def test_a_binding_on_a_pending_node_is_refused_by_the_database(make_task, clock) -> None:
    task, _ = at_the_gate(make_task)
    with pytest.raises(IntegrityError):
        _rewrite(
            task,
            approval_digest="sha256:" + "3" * 64,
            approval_plan_version=1,
            approval_expires_at=clock.now(),
            approval_seq=version(task),
            approved_by="user:mallory",
        )


def test_a_binding_forged_at_a_later_seq_is_refused_at_the_start(make_task, clock, ann, root) -> None:
    """The trigger lets a later approval replace a binding; one written by hand at a later seq names an event that
    does not record it: the gated start checks the binding against the log and starts nothing."""
    task, lease = approved_and_back(make_task, ann, root)
    _rewrite(
        task, approval_seq=F("approval_seq") + 1, approval_expires_at=F("approval_expires_at") + timedelta(days=30)
    )
    refused(StoredFactAltered, lambda: start_b(task, lease))
    assert find_problems(Task.objects.get(pk=task.pk)), "verify_log finds it too"


# --- over the API and on the page ------------------------------------------------------------------------------


class _Agent:
    def __init__(self, client: Client, token: str) -> None:
        self.client, self.token = client, token

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        extra = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"}
        extra.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()})
        data = json.dumps(body) if body is not None else None
        return getattr(self.client, method)("/api/v1" + path, data=data, content_type="application/json", **extra)


def test_the_api_says_what_is_awaited_and_what_was_approved(client: Client, make_task, clock, ann, root) -> None:
    token = api_token_issue(actor=root, agent_id="agent-1", kinds=(KIND,), projects=())[1]
    agent = _Agent(client, token)
    task = make_task(gated_plan(), kind=KIND)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")
    record(send(task, lease, "a"), Committed(remote_id="target-7"), lease)
    v = version(task)

    response = agent.call("get", f"/tasks/{task.pk}/directive", Reckon_Lease=str(lease.pk))
    assert response.status_code == 200
    body = response.json()
    digest = asked(task, "ok")
    assert (body["kind"], body["reason"], body["node_key"], body["task_version"]) == (
        "stop",
        "awaiting_approval",
        "ok",
        v + 1,
    )
    assert response["ETag"] == f'"{v + 1}"', "the proposal it recorded moved the version"
    assert body["approval"] == {
        "node": "ok",
        "state": "awaited",
        "code": "approval_missing",
        "why": "approval ok is not given yet",
        "awaited": {"digest": digest, "requests": {"b": B_DIGEST}, "plan_revision": 1, "recorded": True},
        "approved": None,
    }
    lease_release(lease=lease)
    approve(task, ann, root)

    answer = agent.call("get", f"/tasks/{task.pk}").json()
    [shown] = answer["approvals"]
    ok = node(task, "ok")
    assert ok.approval_expires_at is not None
    assert (shown["state"], shown["awaited"]) == ("approved", None)
    assert shown["approved"] == {
        "digest": digest,
        "requests": ok.approval_requests,
        "plan_revision": 1,
        "expires_at": ok.approval_expires_at.isoformat().replace("+00:00", "Z"),
        "by": "user:ann",
        "event_seq": ok.approval_seq,
        "expired": False,
    }

    clock.advance(settings.RECKON_APPROVAL_TTL)
    [expired] = agent.call("get", f"/tasks/{task.pk}").json()["approvals"]
    assert (expired["state"], expired["code"], expired["approved"]["expired"]) == ("awaited", "approval_expired", True)
    assert expired["awaited"]["digest"] == digest and expired["awaited"]["recorded"] is False

    held = agent.call("post", f"/tasks/{task.pk}/lease", {}).json()
    d = agent.call("get", f"/tasks/{task.pk}/directive", Reckon_Lease=str(held["lease_id"])).json()
    before = snapshot()
    refusal = agent.call(
        "post",
        f"/tasks/{task.pk}/operations",
        {"node_key": "b"},
        Reckon_Lease=str(held["lease_id"]),
        If_Match=f'"{d["task_version"]}"',
    )
    assert refusal.status_code == 409 and refusal.json()["code"] == "approval_expired"
    assert snapshot() == before
    assert (d["reason"], d["approval"]["code"], d["approval"]["awaited"]["recorded"]) == (
        "awaiting_approval",
        "approval_expired",
        True,
    )


def test_the_task_page_shows_the_binding(client: Client, make_task, clock, ann, root) -> None:
    task, _ = at_the_gate(make_task)
    client.force_login(root.user)
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    assert "awaits a person&#x27;s approval" in page or "awaits a person's approval" in page
    assert asked(task, "ok") in page
    approve(task, ann, root)
    ok = node(task, "ok")
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    assert "approved by user:ann" in page and ok.approval_digest in page
    assert ok.approval_expires_at is not None and f"{ok.approval_expires_at:%Y-%m-%d %H:%M:%S}" in page


def test_the_takeover_page_offers_an_expired_approval_again_and_posts_what_it_shows(
    client: Client, make_task, clock: ControllableClock, ann, root
) -> None:
    task, lease = approved_and_back(make_task, ann, root)
    lease_release(lease=lease)
    clock.advance(settings.RECKON_APPROVAL_TTL)
    grant_and_claim(ann, root, task)
    client.force_login(ann.user)
    page = client.get(f"/tasks/{task.pk}/takeover/").content.decode()
    digest = asked(task, "ok")
    assert f'name="approving" value="{digest}"' in page
    assert "Approve again: approval ok expired at" in page
    form = {"node_key": "ok", "expected_version": version(task), "approving": digest, "valid_minutes": "5"}
    stale = form | {"approving": "sha256:" + "9" * 64}
    before = snapshot()
    response = client.post(f"/tasks/{task.pk}/takeover/approve/", stale)
    assert response.status_code == 409 and "not the one approved" in response.content.decode()
    assert snapshot() == before
    too_long = form | {"valid_minutes": str(int(settings.RECKON_APPROVAL_TTL_MAX.total_seconds()) // 60 + 1)}
    response = client.post(f"/tasks/{task.pk}/takeover/approve/", too_long)
    assert response.status_code == 400 and "That validity is not allowed" in response.content.decode()
    assert snapshot() == before
    response = client.post(f"/tasks/{task.pk}/takeover/approve/", form)
    assert response.status_code == 303
    ok = node(task, "ok")
    row = AuditEvent.objects.filter(task_id=task.pk, action="node_approved").order_by("-seq").first()
    assert row is not None and ok.approval_expires_at == row.at + timedelta(minutes=5)
    assert row.details["ttl_seconds"] == 300
