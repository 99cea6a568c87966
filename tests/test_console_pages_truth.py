"""Pages show only what the database holds, tried as someone who would get a page to lie or a stale form through:

- a step behind an approval not given is not offered in the result form, and a result for it posted anyway (a form
  from before the approval expired, or a forged one) is refused by name (approval_not_given) and writes nothing;
- a superseded re-plan proposal is shown as superseded without an accept button, and accepting it — from a page
  made before the newer one, or posted after the newer one was accepted, by a person or an agent — is refused by
  the service (proposal_superseded) and writes nothing;
- the review states the transition the confirm then makes, for every decision and with a cancel recorded;
- the task page's state sentence on real rows: a task awaiting approval, a task a person released, a lapsed lease.
"""

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from audit.principals import Principal
from console.errors import SENTENCES
from leases.models import Lease
from leases.services import lease_open, lease_release
from tasks.access.permissions import permission_grant
from tasks.core.errors import ApprovalNotGiven, ProposalSuperseded
from tasks.core.outcomes import Committed
from tasks.engine.plans import plan_accept, plan_propose
from tasks.engine.protocol import next_directive
from tasks.models import PlanRevision, Task
from tasks.people.approvals import node_approve
from tasks.people.cancel import task_request_cancel
from tasks.people.replan import plan_accept_by_person, plan_propose_by_person
from tasks.people.takeover import NodeResult, takeover_claim, takeover_preview, takeover_release, takeover_submit
from tests.conftest import effect_node, person, snapshot
from tests.steps import asked, record, send, version

pytestmark = pytest.mark.django_db

GATED = "delete-temp-copies"


def approval(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}, **extra}


def gated_plan() -> dict[str, Any]:
    """A copy, an approval, then the irreversible step the approval gates."""
    return {
        "nodes": [
            effect_node("copy"),
            approval("approve-cleanup", depends_on=["copy"]),
            effect_node(GATED, depends_on=["approve-cleanup"], irreversible=True),
        ]
    }


def text(response: Any) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", response.content.decode())))


@pytest.fixture
def root() -> Principal:
    return person("root", "admin")


@pytest.fixture
def copied(make_task: Any, agent_lease: Any, clock: Any) -> Task:
    """The copy done by the agent, which then stopped awaiting the approval (and recorded what it asks) and let go:
    the task is still ``running`` in the database."""
    task = make_task(gated_plan())
    lease = agent_lease(task)
    record(send(task, lease, "copy"), Committed(remote_id="copy-1"), lease)
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason, directive.node_key) == ("stop", "awaiting_approval", "approve-cleanup")
    lease_release(lease=lease)
    return Task.objects.get(pk=task.pk)


@pytest.fixture
def ann(root: Principal, copied: Task) -> Principal:
    operator = person("ann", "operator")
    permission_grant(actor=root, user=operator.user, task=copied)
    return operator


def claimed(who: Principal, task: Task) -> Lease:
    claim = takeover_claim(actor=who, task_id=task.pk)
    assert claim.granted and claim.lease is not None
    return claim.lease


def result_post(task: Task, lease: Lease, key: str, stage: str = "confirm") -> dict[str, Any]:
    return {
        "expected_version": version(task),
        "epoch": lease.epoch,
        "stage": stage,
        "decision": "resume_agent",
        f"n-{key}-remote_id": "deleted-by-hand",
    }


# --- a step behind an approval not given ------------------------------------------------------------------------


def test_the_task_page_says_which_step_waits_for_whose_approval(client: Client, copied: Task, ann: Principal) -> None:
    client.force_login(ann.user)
    page = text(client.get(reverse("task-detail", args=[copied.pk])))
    assert f"Nothing runs until a person approves: {GATED} waits for a person's approval of approve-cleanup" in page
    assert "1 of 3 steps done" in page
    assert "working through" not in page and "first step" not in page


def test_the_result_form_does_not_offer_a_step_behind_an_approval_not_given(
    client: Client, copied: Task, ann: Principal
) -> None:
    claimed(ann, copied)
    client.force_login(ann.user)
    page = client.get(reverse("takeover", args=[copied.pk])).content.decode()
    assert f'name="n-{GATED}-remote_id"' not in page
    assert "Approvals waiting" in page


def test_a_result_posted_for_a_step_behind_an_approval_is_refused_and_writes_nothing(
    client: Client, copied: Task, ann: Principal
) -> None:
    lease = claimed(ann, copied)
    client.force_login(ann.user)
    before = snapshot()
    response = client.post(reverse("takeover-submit", args=[copied.pk]), result_post(copied, lease, GATED))
    assert response.status_code == 409
    assert SENTENCES["approval_not_given"] in text(response)
    assert snapshot() == before


def test_the_service_refuses_a_result_for_a_gated_step_even_with_the_approval_typed_in(
    copied: Task, ann: Principal
) -> None:
    """A typed result for the approval node succeeds it without a binding: it permits nothing."""
    lease = claimed(ann, copied)
    before = snapshot()
    with pytest.raises(ApprovalNotGiven) as refused:
        takeover_submit(
            actor=ann,
            lease=lease,
            based_on_version=version(copied),
            decision="resume_agent",
            results=[NodeResult("approve-cleanup", remote_id="typed"), NodeResult(GATED, remote_id="by-hand")],
        )
    assert refused.value.details["why"] == "approval_missing"
    assert snapshot() == before


def test_once_approved_the_step_is_offered_and_its_result_accepted(
    client: Client, copied: Task, ann: Principal
) -> None:
    lease = claimed(ann, copied)
    node_approve(
        actor=ann,
        task_id=copied.pk,
        node_key="approve-cleanup",
        expected_version=version(copied),
        approving=asked(copied, "approve-cleanup"),
    )
    client.force_login(ann.user)
    assert f'name="n-{GATED}-remote_id"' in client.get(reverse("takeover", args=[copied.pk])).content.decode()
    response = client.post(reverse("takeover-submit", args=[copied.pk]), result_post(copied, lease, GATED))
    assert response.status_code == 303, text(response)[:1500]


def test_a_form_made_before_the_approval_expired_is_refused_after_it_and_writes_nothing(
    client: Client, copied: Task, ann: Principal, clock: Any, settings: Any
) -> None:
    lease = claimed(ann, copied)
    node_approve(
        actor=ann,
        task_id=copied.pk,
        node_key="approve-cleanup",
        expected_version=version(copied),
        approving=asked(copied, "approve-cleanup"),
    )
    client.force_login(ann.user)
    data = result_post(copied, lease, GATED)  # the page offered the step
    clock.advance(settings.RECKON_APPROVAL_TTL + timedelta(seconds=1))
    renewed = lease_open(copied.pk)
    assert renewed is not None
    Lease.objects.filter(pk=renewed.pk).update(expires_at=clock.now() + timedelta(minutes=2))  # still holding it
    assert f'name="n-{GATED}-remote_id"' not in client.get(reverse("takeover", args=[copied.pk])).content.decode()
    before = snapshot()
    response = client.post(reverse("takeover-submit", args=[copied.pk]), data)
    assert response.status_code == 409
    assert SENTENCES["approval_not_given"] in text(response) and "expired" in text(response)
    assert snapshot() == before


# --- a superseded proposal --------------------------------------------------------------------------------------


def _two_proposals(ann: Principal, task: Task) -> tuple[PlanRevision, PlanRevision, int]:
    claimed(ann, task)
    older = plan_propose_by_person(
        actor=ann, task_id=task.pk, plan=gated_plan(), expected_version=version(task), reason="first try at a plan"
    )
    seen = version(task)  # the page with only the older proposal was made at this version
    plan = {"nodes": [*gated_plan()["nodes"], effect_node("verify", depends_on=[GATED])]}
    newer = plan_propose_by_person(
        actor=ann, task_id=task.pk, plan=plan, expected_version=seen, reason="second try, with a check"
    )
    return older, newer, seen


def test_a_superseded_proposal_is_shown_as_superseded_without_an_accept_button(
    client: Client, copied: Task, ann: Principal
) -> None:
    older, newer, _seen = _two_proposals(ann, copied)
    client.force_login(ann.user)
    response = client.get(reverse("takeover-replan", args=[copied.pk]))
    page = text(response)
    assert f"Proposed plan {older.number} by user:ann, superseded" in page
    assert f"Superseded by plan {newer.number}: it can no longer be accepted." in page
    assert f"Accept plan {older.number}" not in page and f"Accept plan {newer.number}" in page
    assert "(1 proposal waiting)" in text(client.get(reverse("takeover", args=[copied.pk])))


def test_accepting_an_older_proposal_after_a_newer_one_is_refused_and_writes_nothing(
    client: Client, copied: Task, ann: Principal
) -> None:
    older, newer, seen = _two_proposals(ann, copied)
    client.force_login(ann.user)
    for expected_version in (version(copied), seen):  # a form made now, and one from the page before the newer one
        before = snapshot()
        response = client.post(
            reverse("takeover-replan-accept", args=[copied.pk]),
            {"expected_version": expected_version, "revision_id": older.pk},
        )
        assert response.status_code == 303
        assert snapshot() == before
    with pytest.raises(ProposalSuperseded) as refused:
        plan_accept_by_person(actor=ann, revision_id=older.pk, expected_version=version(copied))
    assert refused.value.details == {"revision": older.number, "superseded_by": newer.number}
    page = text(client.get(reverse("takeover", args=[copied.pk])))
    assert SENTENCES["proposal_superseded"] in page


def test_an_older_proposal_posted_after_the_newer_was_accepted_is_refused(copied: Task, ann: Principal) -> None:
    older, newer, _seen = _two_proposals(ann, copied)
    plan_accept_by_person(actor=ann, revision_id=newer.pk, expected_version=version(copied))
    claimed(ann, copied)
    before = snapshot()
    with pytest.raises(ProposalSuperseded):
        plan_accept_by_person(actor=ann, revision_id=older.pk, expected_version=version(copied))
    assert snapshot() == before


def test_an_agent_cannot_accept_a_superseded_proposal_either(make_task: Any, agent_lease: Any, clock: Any) -> None:
    task = make_task({"nodes": [effect_node("a")]})
    lease = agent_lease(task)
    older = plan_propose(
        task_id=task.pk,
        plan={"nodes": [effect_node("b")]},
        proposed_by="agent",
        expected_version=version(task),
        lease=lease,
    )
    plan_propose(
        task_id=task.pk,
        plan={"nodes": [effect_node("c")]},
        proposed_by="agent",
        expected_version=version(task),
        lease=lease,
    )
    before = snapshot()
    with pytest.raises(ProposalSuperseded):
        plan_accept(revision_id=older.pk, expected_version=version(task), lease=lease)
    assert snapshot() == before


# --- the review says what the confirm does ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "extra"),
    [
        ("resume_agent", {}),
        ("end_task", {"end_status": "failed"}),
        ("replan", {"replan_reason": "the plan is wrong about the target"}),
    ],
)
@pytest.mark.parametrize("cancelled", [False, True], ids=["", "cancel recorded"])
def test_the_review_states_the_transition_the_confirm_makes(
    copied: Task, ann: Principal, root: Principal, decision: str, extra: dict[str, Any], cancelled: bool
) -> None:
    lease = claimed(ann, copied)
    if cancelled:
        task_request_cancel(
            actor=root, task_id=copied.pk, reason="the customer withdrew", expected_version=version(copied)
        )
    arguments: dict[str, Any] = {
        "actor": ann,
        "lease": lease,
        "based_on_version": version(copied),
        "decision": decision,
    }
    preview = takeover_preview(**arguments, **extra)
    assert preview.task_status_before == Task.objects.get(pk=copied.pk).status
    after = takeover_submit(**arguments, **extra)
    assert after.status == preview.task_fields.get("status", preview.task_status_before)
    assert after.status_reason == preview.task_fields.get("status_reason", after.status_reason)


# --- the state sentence on real rows ----------------------------------------------------------------------------


def test_a_task_a_person_released_names_them_never_nobody(client: Client, copied: Task, ann: Principal) -> None:
    lease = claimed(ann, copied)
    takeover_release(actor=ann, lease=lease, reason="going home, someone else decides")
    client.force_login(ann.user)
    for name in ("task-detail", "task-actions"):
        page = text(client.get(reverse(name, args=[copied.pk])))
        assert "Taken over by operator ann, who no longer holds it (lease released)" in page, name
    assert "nobody" not in text(client.get(reverse("task-detail", args=[copied.pk]))).lower()


def test_a_lapsed_takeover_lease_is_said_on_the_task_and_actions_pages(
    client: Client, copied: Task, ann: Principal, clock: Any
) -> None:
    lease = claimed(ann, copied)
    clock.set(lease.expires_at + timedelta(seconds=44))
    client.force_login(ann.user)
    for name in ("task-detail", "task-actions"):
        page = text(client.get(reverse(name, args=[copied.pk])))
        assert "Taken over by operator ann, whose lease lapsed 44 s ago" in page, name
        assert "that is you" not in page


def test_the_queue_names_who_let_go_of_a_task_taken_over_never_nobody(
    client: Client, copied: Task, ann: Principal
) -> None:
    lease = claimed(ann, copied)
    takeover_release(actor=ann, lease=lease, reason="going home, someone else decides")
    client.force_login(ann.user)
    page = client.get(reverse("task-list")).content.decode()
    row = page[page.index(f'<tr data-task="{copied.pk}">') :].split("</tr>")[0]
    assert "taken over" in row and "person ann" in row and "let go" in row
    assert "nobody" not in row


def test_the_queue_marks_a_holder_whose_lease_lapsed_and_only_then(
    client: Client, copied: Task, ann: Principal, clock: Any
) -> None:
    lease = claimed(ann, copied)
    client.force_login(ann.user)

    def row() -> str:
        page = client.get(reverse("task-list")).content.decode()
        return page[page.index(f'<tr data-task="{copied.pk}">') :].split("</tr>")[0]

    assert "person ann" in row() and "lapsed" not in row()
    clock.set(lease.expires_at + timedelta(seconds=1))  # expired, in its grace: ann may still renew
    assert "person ann" in row() and "lapsed" not in row()
    clock.set(lease.expires_at + timedelta(seconds=44))
    assert "person ann" in row() and "lapsed" in row()
