"""Reconcile, cancel and force release in real Chromium: an operator asks the remote about an unknown operation and
settles another by hand through the one dangerous-action dialog (opened by HTMX, nothing runs until the task id is
typed); an operator cancels and the page follows the task to stopped; an admin sees the force-release form.
Screenshots in light and dark, at 1280x800 and on a narrow screen."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from tasks.core.outcomes import Committed
from tasks.models import Operation, Task
from tasks.people.takeover import takeover_claim
from tests.conftest import chain_plan, person
from tests.kinds import kind_registered
from tests.steps import record, send
from tests.test_console_reconcile import KIND, Remote, operator_of, unknown_task

pytestmark = pytest.mark.browser

NARROW = {"width": 390, "height": 844}


@pytest.fixture
def remote() -> Iterator[Remote]:
    held = Remote()
    with kind_registered(KIND, connector=lambda: held):
        yield held


def test_an_operator_settles_an_unknown_operation_in_the_browser(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
    remote: Remote,
) -> None:
    task = unknown_task(make_task, agent_lease, chain_plan("a", "b"))
    ann = operator_of(task)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    op = Operation.objects.get(task=task, status="unknown")
    login(page, ann.user)
    page.goto(reverse("task-actions", args=[task.pk]))
    expect(page.get_by_role("heading", name="Open operations (1)")).to_be_visible()
    screenshot(page, "reconcile-actions")

    page.get_by_role("link", name=f"Settle: done… {op.op_key}").click()  # HTMX: the dialog opens in the page
    dialog = page.locator("#dialog")
    expect(dialog.get_by_text("is recorded committed, with the receipt you give")).to_be_visible()
    assert page.url.endswith(reverse("task-actions", args=[task.pk]))  # no navigation: the dialog came by HTMX
    screenshot(page, "reconcile-settle-dialog")
    dialog.get_by_label("Remote id").fill("batch-1")
    dialog.get_by_label("What you checked").fill("the store's console lists batch-1 for this op key")
    dialog.get_by_label(f"Type {task.pk} to confirm").fill("nope")
    dialog.get_by_role("button", name="Settle the operation").click()
    expect(page.get_by_text("Type exactly")).to_be_visible()
    assert Operation.objects.get(pk=op.pk).status == "unknown"  # a wrong confirmation did nothing

    page.get_by_label("Remote id").fill("batch-1")
    page.get_by_label("What you checked").fill("the store's console lists batch-1 for this op key")
    page.get_by_label(f"Type {task.pk} to confirm").fill(str(task.pk))
    page.get_by_role("button", name="Settle the operation").click()
    expect(page.get_by_text(f"Operation {op.op_key} settled by hand (done).")).to_be_visible()
    assert Operation.objects.get(pk=op.pk).status == "committed"


def test_query_the_remote_shows_the_receipt_in_the_browser(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
    remote: Remote,
) -> None:
    task = unknown_task(make_task, agent_lease)
    ann = operator_of(task)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    op = Operation.objects.get(task=task, status="unknown")
    remote.holds[op.op_key] = Committed(remote_id="batch-1", remote_version="v9", count=100)
    login(page, ann.user)
    page.goto(reverse("task-actions", args=[task.pk]))
    page.get_by_role("button", name=f"Query the remote now about {op.op_key}").click()
    expect(page.get_by_text("Receipt found: committed.")).to_be_visible()
    screenshot(page, "reconcile-query-answer")
    assert Operation.objects.get(pk=op.pk).status == "committed"


def test_an_operator_cancels_and_the_page_follows_the_task_to_stopped(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    ann = operator_of(task)
    login(page, ann.user)
    page.goto(reverse("task-actions", args=[task.pk]))
    page.get_by_role("link", name="Cancel this task…").click()
    dialog = page.locator("#dialog")
    expect(dialog.get_by_text("1 operation in flight will be awaited")).to_be_visible()
    screenshot(page, "reconcile-cancel-dialog")
    dialog.get_by_label("Why cancel").fill("the customer withdrew the migration")
    dialog.get_by_label(f"Type {task.pk} to confirm").fill(str(task.pk))
    dialog.get_by_role("button", name="Cancel the task").click()
    expect(page.locator("#status")).to_contain_text("Stopping")
    screenshot(page, "reconcile-stopping")
    record(op, Committed(remote_id="r-a"), lease)  # the call in flight ends; the page polls its way to stopped
    expect(page.locator("#status")).to_contain_text("no longer refreshes", timeout=8000)
    expect(page.locator("#status")).to_contain_text("Stopped")


def test_an_admin_sees_the_force_release_form_wide_and_narrow(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
) -> None:
    task = make_task(chain_plan("a", "b"))
    agent_lease(task, holder="agent-1")
    login(page, person("ada", "admin").user)
    page.goto(reverse("force-release", args=[task.pk]))
    expect(page.get_by_text("The lease of agent agent-1 (epoch 1) is closed now")).to_be_visible()
    screenshot(page, "reconcile-force-release")
    page.set_viewport_size(NARROW)  # type: ignore[arg-type]
    screenshot(page, "reconcile-force-release-narrow")
    page.goto(reverse("task-actions", args=[task.pk]))
    screenshot(page, "reconcile-actions-narrow")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= NARROW["width"] + 1, f"the actions page scrolls sideways on a narrow screen ({width}px)"
