"""Pages show only what the database holds, in real Chromium, tried the way a person gets a stale page through:

- a settle dialog opened while the takeover lease was live, confirmed after it lapsed: refused by name (not a
  server error), nothing written, and the page then shows the lease as lapsed with nothing to settle;
- a superseded re-plan proposal: shown superseded without an accept button, and a form forged to accept it
  anyway is refused by the service;
- an irreversible step behind an approval not given: not offered in the result form, a result forged into the
  form is refused by name; once approved, the step is offered.

One task shape for all three (a copy, an approval, the irreversible step it gates), each test taking it where it
needs it."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from audit.principals import Principal
from console.errors import SENTENCES
from leases.clock import ControllableClock
from leases.services import lease_open, lease_release
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed
from tasks.engine.protocol import next_directive
from tasks.models import Operation, PlanRevision, Task
from tasks.people.replan import plan_propose_by_person
from tasks.people.takeover import takeover_claim
from tests.conftest import effect_node, person, snapshot
from tests.steps import record, send, version

pytestmark = pytest.mark.browser

GATED = "delete-temp-copies"


def gated_plan(*extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodes": [
            effect_node("copy"),
            {"key": "approve-cleanup", "action": "approval", "depends_on": ["copy"], "evidence": {"remote_id": True}},
            effect_node(GATED, depends_on=["approve-cleanup"], irreversible=True),
            *extra,
        ]
    }


@pytest.fixture
def scene(make_task: Callable[..., Task], agent_lease: Callable[..., Any]) -> Callable[[str], tuple[Task, Principal]]:
    """The task, its copy sent by an agent and answered ``outcome`` ("lost": the answer lost, its outcome unknown;
    "done": committed, and the agent stopped awaiting the approval), the agent gone; ann may operate it."""

    def make(outcome: str) -> tuple[Task, Principal]:
        task = make_task(gated_plan(), title="migrate acme")
        lease = agent_lease(task)
        answer = Committed(remote_id="copy-1") if outcome == "done" else Failed(FailureClass.CONNECTION_INTERRUPTED)
        record(send(task, lease, "copy"), answer, lease)
        if outcome == "done":
            assert next_directive(task_id=task.pk, lease=lease).reason == "awaiting_approval"
        lease_release(lease=lease)
        ann = person("ann", "operator")
        permission_grant(actor=person("root", "admin"), user=ann.user, task=task)
        return Task.objects.get(pk=task.pk), ann

    return make


def test_a_settle_confirmed_after_the_lease_lapsed_is_refused_and_the_page_says_lapsed(
    page: Page, scene: Any, login: Callable[..., None], clock: ControllableClock
) -> None:
    task, ann = scene("lost")
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    op = Operation.objects.get(task=task, status="unknown")
    login(page, ann.user)
    page.goto(reverse("task-actions", args=[task.pk]))
    expect(page.get_by_text("that is you: you may reconcile below")).to_be_visible()
    page.get_by_role("link", name=f"Settle: done… {op.op_key}").click()
    dialog = page.locator("#dialog")
    dialog.get_by_label("Remote id").fill("copy-1")
    dialog.get_by_label("What you checked").fill("the store's console lists copy-1 for this op key")
    dialog.get_by_label(f"Type {task.pk} to confirm").fill(str(task.pk))

    lease = lease_open(task.pk)
    assert lease is not None
    clock.set(lease.expires_at + timedelta(seconds=44))  # the person was away: past the expiry and the grace
    before = snapshot()
    with page.expect_response(lambda r: "/settle/" in r.url and r.request.method == "POST") as answered:
        dialog.get_by_role("button", name="Settle the operation").click()
    assert answered.value.status == 409
    expect(page.get_by_text(SENTENCES["lease_expired"], exact=False)).to_be_visible()
    assert snapshot() == before, "a refusal writes nothing"

    page.goto(reverse("task-actions", args=[task.pk]))
    expect(page.get_by_text("Lapsed: operator ann's lease expired 44 s ago", exact=False).first).to_be_visible()
    expect(page.get_by_text("that is you")).to_have_count(0)
    expect(page.get_by_role("link", name=f"Settle: done… {op.op_key}")).to_have_count(0)
    page.goto(reverse("task-detail", args=[task.pk]))
    expect(page.get_by_text("Taken over by operator ann, whose lease lapsed 44 s ago").first).to_be_visible()


def test_a_superseded_proposal_has_no_accept_button_and_a_forged_accept_is_refused(
    page: Page, scene: Any, login: Callable[..., None]
) -> None:
    task, ann = scene("done")
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    older = plan_propose_by_person(
        actor=ann, task_id=task.pk, plan=gated_plan(), expected_version=version(task), reason="first try at a plan"
    )
    newer = plan_propose_by_person(
        actor=ann,
        task_id=task.pk,
        plan=gated_plan(effect_node("verify", depends_on=[GATED])),
        expected_version=version(task),
        reason="second try, with a check at the end",
    )
    login(page, ann.user)
    page.goto(reverse("takeover-replan", args=[task.pk]))
    expect(page.get_by_text(f"Superseded by plan {newer.number}: it can no longer be accepted.")).to_be_visible()
    expect(page.get_by_role("button", name=f"Accept plan {older.number}", exact=False)).to_have_count(0)
    accept_newer = page.get_by_role("button", name=f"Accept plan {newer.number}", exact=False)
    expect(accept_newer).to_be_visible()

    # A form forged to accept the older one: the newer one's form, pointed at the older revision.
    page.locator(f'input[name="revision_id"][value="{newer.pk}"]').evaluate(f"input => input.value = '{older.pk}'")
    before = snapshot()
    accept_newer.click()
    expect(page.get_by_text(SENTENCES["proposal_superseded"], exact=False)).to_be_visible()
    assert snapshot() == before
    assert Task.objects.get(pk=task.pk).plan_version == 1
    assert set(PlanRevision.objects.filter(task=task).values_list("number", "status")) == {
        (1, "accepted"),
        (older.number, "proposed"),
        (newer.number, "proposed"),
    }


def test_an_irreversible_step_is_not_offered_before_its_approval_and_a_forged_result_is_refused(
    page: Page, scene: Any, login: Callable[..., None]
) -> None:
    task, ann = scene("done")
    login(page, ann.user)
    page.goto(reverse("task-detail", args=[task.pk]))
    expect(page.get_by_text(f"{GATED} waits for a person's approval of approve-cleanup").first).to_be_visible()
    page.goto(reverse("takeover", args=[task.pk]))
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text("You hold this task.")).to_be_visible()
    expect(page.get_by_role("heading", name="Approvals waiting")).to_be_visible()
    expect(page.get_by_role("group", name=f"Step {GATED}")).to_have_count(0)

    # A result for the gated step forged into the form: the service refuses it by name.
    page.locator("#result form").evaluate(
        f"""form => {{ const input = document.createElement('input'); input.type = 'hidden';
        input.name = 'n-{GATED}-remote_id'; input.value = 'deleted-by-hand'; form.appendChild(input); }}"""
    )
    page.get_by_label("Resume the agent", exact=False).check()
    before = snapshot()
    with page.expect_response(lambda r: "/takeover/submit/" in r.url) as answered:
        page.get_by_role("button", name="Review what will change").click()
    assert answered.value.status == 409
    expect(page.get_by_text(SENTENCES["approval_not_given"], exact=False)).to_be_visible()
    assert snapshot() == before

    page.get_by_role("button", name="Approve only (keep the task)").click()
    expect(page.get_by_text("Approved approve-cleanup.")).to_be_visible()
    expect(page.get_by_role("group", name=f"Step {GATED}")).to_be_visible()
