"""A person approves an approval node (tasks/people/approvals.py): an audited compare-and-set under their takeover
lease,
its event in the log, a receipt that names the approval record and states what was approved — and every way to
approve what may not be approved is refused, writing nothing."""

from typing import Any

import pytest

from audit.models import AuditEvent
from audit.principals import Principal
from leases.services import lease_release
from tasks.access.permissions import PermissionDenied, permission_grant
from tasks.core.errors import InvalidTransition, NodeNotReady, OperationsOpen, TaskError, VersionConflict
from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, TaskStatus
from tasks.core.outcomes import Committed, Failed
from tasks.decide.decisions import approvable_nodes
from tasks.engine.protocol import next_directive
from tasks.engine.verification import find_problems
from tasks.models import Event, Node, Operation, Receipt, Task
from tasks.people.approvals import approval_record_id, node_approve, node_approve_and_resume
from tasks.people.takeover import takeover_claim, takeover_submit
from tests.conftest import SOURCE_REF, effect_node, person, snapshot
from tests.steps import asked, record, send, version

pytestmark = pytest.mark.django_db


def approval(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}, **extra}


# What a page made before the call showed (the test's refusal comes first, whatever it says).
ASKED_BEFORE = "sha256:" + "0" * 64


def approval_first() -> dict[str, Any]:
    return {"nodes": [approval("ok"), effect_node("b", depends_on=["ok"])]}


@pytest.fixture
def root() -> Principal:
    return person("root", "admin")


def operator_for(root: Principal, task: Task, name: str) -> Principal:
    operator = person(name, "operator")
    permission_grant(actor=root, user=operator.user, task=task)
    return operator


def claimed(actor: Principal, task: Task) -> None:
    claim = takeover_claim(actor=actor, task_id=task.pk)
    assert claim.granted


def node(task: Task, key: str) -> Node:
    task.refresh_from_db()
    return Node.objects.get(task=task, plan_version=task.plan_version, key=key)


def refused(error: type[BaseException], call: Any) -> BaseException:
    before = snapshot()
    with pytest.raises(error) as caught:
        call()
    assert snapshot() == before, "a refused approval writes nothing, audit included"
    return caught.value


def test_an_approval_is_audited_and_its_event_and_receipt_name_each_other(make_task, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    claimed(ann, task)
    v = version(task)

    after = node_approve(
        actor=ann,
        task_id=task.pk,
        node_key="ok",
        expected_version=v,
        approving=asked(task, "ok"),
        note="checked the diff",
    )

    # Nobody asked for it yet (a person took the task over before the agent reached it): the approval records what
    # it is asked to permit first, then the approval.
    assert after.version == v + 2 and after.status == TaskStatus.HUMAN, "the person still holds the task"
    assert Event.objects.get(task=task, seq=v + 1).type == "approval_proposed"
    event = Event.objects.get(task=task, seq=v + 2)
    assert event.type == "node_approved"
    assert event.payload["data"]["by"] == "user:ann"
    op = Operation.objects.get(node=node(task, "ok"))
    assert (op.status, op.settled_by) == (OperationStatus.COMMITTED, "user:ann")
    receipt = Receipt.objects.get(operation=op)
    assert receipt.remote_id == approval_record_id(task, v + 2), "the receipt names the approval record"
    assert event.payload["data"]["receipts"] == {
        op.op_key: {"remote_id": receipt.remote_id, "remote_version": "", "count": None, "digest": ""}
    }
    assert node(task, "ok").status == NodeStatus.SUCCEEDED
    audit = AuditEvent.objects.filter(task_id=task.pk).order_by("-seq").first()
    assert audit is not None
    assert (audit.action, audit.actor_id, audit.version_before, audit.version_after) == (
        "node_approved",
        "ann",
        v,
        v + 2,
    )
    assert audit.reason == "checked the diff"


def test_an_approval_states_what_was_approved_from_its_evidence_spec(make_task, clock, root) -> None:
    evidence = {"remote_id": True, "remote_version": {"input": "source", "field": "version"}}
    task = make_task({"nodes": [approval("ok", input={"source": {"ref": SOURCE_REF}}, evidence=evidence)]})
    ann = operator_for(root, task, "ann")
    claimed(ann, task)

    node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok"))

    assert Receipt.objects.get(operation__node=node(task, "ok")).remote_version == SOURCE_REF["version"]


def test_an_approved_task_passes_verify_log(make_task, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    claimed(ann, task)
    node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok"))
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def test_after_approval_and_hand_back_the_agent_runs_the_next_node(make_task, agent_lease, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    claimed(ann, task)
    node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok"))
    from leases.services import lease_open

    lease = lease_open(task.pk)
    assert lease is not None
    takeover_submit(actor=ann, lease=lease, based_on_version=version(task), decision="resume_agent")
    agent = agent_lease(task)
    directive = next_directive(task_id=task.pk, lease=agent)
    assert (directive.kind, directive.node_key) == ("execute", "b")


@pytest.mark.parametrize("who", ["outsider", "auditor", "operator-of-another-task", "agent"])
def test_only_a_person_allowed_to_operate_the_task_may_approve(make_task, clock, root, who) -> None:
    task, other = make_task(approval_first()), make_task()
    claimed(root, task)
    actor = {
        "outsider": lambda: person("eve"),
        "auditor": lambda: person("aud", "auditor"),
        "operator-of-another-task": lambda: operator_for(root, other, "olga"),
        "agent": lambda: Principal.agent("agent-1"),
    }[who]()
    refused(
        PermissionDenied,
        lambda: node_approve(
            actor=actor, task_id=task.pk, node_key="ok", expected_version=version(task), approving=ASKED_BEFORE
        ),
    )


def test_an_approval_needs_the_takeover_lease(make_task, agent_lease, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    refused(
        PermissionDenied,
        lambda: node_approve(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=ASKED_BEFORE
        ),
    )
    bob = operator_for(root, task, "bob")
    claimed(bob, task)
    error = refused(
        PermissionDenied,
        lambda: node_approve(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=ASKED_BEFORE
        ),
    )
    assert "user:bob" in str(error) or "operator:bob" in str(error)


def test_a_stale_approval_is_refused_with_the_changes_since(make_task, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    seen = version(task)
    claimed(ann, task)  # the task moved on since the page was rendered
    error = refused(
        VersionConflict,
        lambda: node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=seen, approving=ASKED_BEFORE),
    )
    assert isinstance(error, TaskError)
    assert [c["type"] for c in error.details["changes"]] == ["takeover_granted"]


@pytest.mark.parametrize(
    ("plan", "key", "error"),
    [
        ({"nodes": [effect_node("a")]}, "a", InvalidTransition),  # not an approval: its receipt is the remote's
        ({"nodes": [effect_node("a"), approval("ok", depends_on=["a"])]}, "ok", NodeNotReady),  # upstream not done
        ({"nodes": [approval("ok")]}, "nope", NodeNotReady),
    ],
    ids=["effect-node", "upstream-pending", "unknown-node"],
)
def test_it_refuses_what_is_not_an_approval_ready_now(make_task, clock, root, plan, key, error) -> None:
    task = make_task(plan)
    ann = operator_for(root, task, "ann")
    claimed(ann, task)
    refused(
        error,
        lambda: node_approve(actor=ann, task_id=task.pk, node_key=key, expected_version=version(task), approving=""),
    )


def test_it_refuses_to_approve_twice(make_task, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    claimed(ann, task)
    node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok"))
    refused(
        InvalidTransition,
        lambda: node_approve(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=ASKED_BEFORE
        ),
    )


def test_it_refuses_while_an_operation_is_open(make_task, agent_lease, clock, root) -> None:
    task = make_task({"nodes": [effect_node("a"), approval("ok")]})
    ann = operator_for(root, task, "ann")
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED, "timeout"), lease)
    lease_release(lease=lease)
    claimed(ann, task)
    refused(
        OperationsOpen,
        lambda: node_approve(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok")
        ),
    )


def test_approvable_nodes_are_pending_approvals_whose_upstream_succeeded(make_task, agent_lease, clock) -> None:
    task = make_task({"nodes": [effect_node("a"), approval("ok", depends_on=["a"]), approval("free")]})
    nodes = list(Node.objects.filter(task=task).order_by("position"))
    assert [n.key for n in approvable_nodes(nodes)] == ["free"]
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    nodes = list(Node.objects.filter(task=task).order_by("position"))
    assert sorted(n.key for n in approvable_nodes(nodes)) == ["free", "ok"]


def test_approve_and_resume_approves_and_hands_back_in_one_commit(
    make_task, agent_lease, clock, root, django_capture_on_commit_callbacks
) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    claimed(ann, task)
    v = version(task)
    with django_capture_on_commit_callbacks() as wakeups:
        after = node_approve_and_resume(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=v, approving=asked(task, "ok"), note="ok"
        )
    assert after.status == TaskStatus.PENDING and after.version == v + 3
    assert list(Event.objects.filter(task=task, seq__gt=v).values_list("type", flat=True).order_by("seq")) == [
        "approval_proposed",
        "node_approved",
        "takeover_result_submitted",
    ]
    assert node(task, "ok").status == NodeStatus.SUCCEEDED
    assert len(wakeups) == 1, "the agent is woken once the hand-back commits"
    directive = next_directive(task_id=task.pk, lease=agent_lease(task))  # the operator's lease is given back
    assert directive.kind in ("execute", "reconcile")
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def test_approve_and_resume_on_a_stale_page_writes_nothing(make_task, clock, root) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    seen = version(task)
    claimed(ann, task)
    refused(
        VersionConflict,
        lambda: node_approve_and_resume(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=seen, approving=ASKED_BEFORE
        ),
    )


def test_approve_and_resume_leaves_nothing_when_the_hand_back_is_refused(make_task, clock, root, monkeypatch) -> None:
    task = make_task(approval_first())
    ann = operator_for(root, task, "ann")
    claimed(ann, task)

    def refuse_the_hand_back(**_kwargs: Any) -> Task:
        raise PermissionDenied("the hand-back is refused")

    monkeypatch.setattr("tasks.people.approvals.takeover_submit", refuse_the_hand_back)
    refused(
        PermissionDenied,
        lambda: node_approve_and_resume(
            actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok")
        ),
    )
    assert node(task, "ok").status == NodeStatus.PENDING, "the approval rolled back with the refused hand-back"
