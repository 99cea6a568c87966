"""Take over, approve, submit a result and resume the agent — in real Chromium: the page waits for an agent to let go
(HTMX claims again until granted), keeps the lease alive by itself (HTMX renewals carrying the renewal seq), and
applies a result only after its staged review. Screenshots in light and dark, at 1280x800 and on a narrow screen."""

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, ViewportSize, expect

from leases.models import Lease
from leases.services import lease_open, lease_release
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import NodeStatus, TaskStatus
from tasks.models import Node, Task
from tests.conftest import SOURCE_REF, copy_node, effect_node, person

pytestmark = pytest.mark.browser

NARROW: ViewportSize = {"width": 390, "height": 844}


def approval(key: str) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}}


def _task_for_ann(make_task: Callable[..., Task]) -> tuple[Task, Any]:
    task = make_task(
        {"nodes": [approval("ok"), copy_node(depends_on=["ok"]), effect_node("b", depends_on=["copy"])]},
        title="migrate acme",
    )
    ann = person("ann", "operator")
    permission_grant(actor=person("root", "admin"), user=ann.user, task=task)
    return task, ann


def test_an_operator_takes_over_approves_submits_with_evidence_and_resumes_the_agent(
    page: Page,
    make_task: Callable[..., Task],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
) -> None:
    task, ann = _task_for_ann(make_task)
    login(page, ann.user)
    page.goto(reverse("takeover", args=[task.pk]))
    expect(page.get_by_text("Nobody holds this task.")).to_be_visible()
    screenshot(page, "takeover-free")
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text("You hold this task.")).to_be_visible()
    screenshot(page, "takeover-holding")

    page.get_by_role("button", name="Approve only (keep the task)").click()
    expect(page.get_by_text("Approved ok.")).to_be_visible()

    copy = page.get_by_role("group", name="Step copy")
    copy.get_by_label("Remote id").fill("batch-1")
    copy.get_by_label("Remote version").fill(SOURCE_REF["version"])
    copy.get_by_label("Digest").fill(SOURCE_REF["digest"])
    copy.get_by_label("Count").fill("100")
    copy.get_by_label("Evidence items").fill("console_url: https://store.example/batches/1")
    page.get_by_label("Resume the agent", exact=False).check()
    page.get_by_role("button", name="Review what will change").click()
    expect(page.get_by_text("Review — nothing is saved until you confirm")).to_be_visible()
    expect(page.get_by_text("Task: human → pending")).to_be_visible()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.HUMAN, "the review wrote nothing"
    screenshot(page, "takeover-review")

    page.get_by_role("button", name="Confirm and apply").click()
    expect(page.get_by_text("Result recorded and the task handed back")).to_be_visible()
    after = Task.objects.get(pk=task.pk)
    assert after.status == TaskStatus.PENDING
    assert Node.objects.get(task=task, key="copy", plan_version=after.plan_version).status == NodeStatus.SUCCEEDED
    assert lease_open(task.pk) is None


def test_the_page_waits_for_the_agent_then_holds_and_renews_by_itself(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
    settings: Any,
) -> None:
    settings.RECKON_OPERATOR_LEASE_TTL = timedelta(seconds=6)  # renewed every 2 s
    task, ann = _task_for_ann(make_task)
    agent = agent_lease(task)
    login(page, ann.user)
    page.goto(reverse("takeover", args=[task.pk]))
    page.get_by_role("button", name="Request takeover").click()
    expect(page.get_by_text("Takeover requested.")).to_be_visible()
    expect(page.get_by_text("agent:agent-1 holds the task until")).to_be_visible()
    screenshot(page, "takeover-waiting")

    lease_release(lease=agent)  # the agent finished its step and let go
    expect(page.get_by_text("You hold this task.")).to_be_visible(timeout=10_000)
    held = lease_open(task.pk)
    assert held is not None and held.holder_id == "ann"
    expect(page.locator('#lease-panel input[name="renewal_seq"][value="2"]')).to_be_attached(timeout=10_000)
    renewed = lease_open(task.pk)
    assert renewed is not None and renewed.epoch == held.epoch and renewed.renewal_seq >= 2


def test_the_replan_page_and_a_narrow_screen(
    page: Page,
    make_task: Callable[..., Task],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
) -> None:
    from tasks.people.takeover import takeover_claim

    task, ann = _task_for_ann(make_task)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    login(page, ann.user)
    page.goto(reverse("takeover-replan", args=[task.pk]))
    expect(page.get_by_role("heading", name="Propose a plan")).to_be_visible()
    screenshot(page, "takeover-replan")
    page.set_viewport_size(NARROW)
    page.goto(reverse("takeover", args=[task.pk]))
    expect(page.get_by_text("You hold this task.")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    wide = page.evaluate(
        "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 392)"
        ".slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"
    )
    assert width <= NARROW["width"] + 1, f"the page scrolls sideways on a narrow screen ({width}px): {wide}"
    screenshot(page, "takeover-narrow")
