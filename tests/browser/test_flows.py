"""Whole jobs done by people in real Chromium against the live server (issue 9, "Tests"): each flow clicks and fills
the console's own pages; the starting state is reached through the real services, the worker loop and the
object-store simulator, never by writing a status column.

1. An operator finds a task whose copy spent its attempt budget in the needs-attention queue, takes it over,
   submits the copy they did by hand (with evidence) through the generated form, reviews the staged change,
   confirms "resume the agent", and the real Celery worker finishes the task.
2. An operator settles an unknown operation by hand on the actions page; the task page shows it settled.
3. An admin force-releases an agent's lease; another admin reviews it; the first may not review their own.
4. An auditor sees everything and can do nothing: no action link, and every action URL refuses a POST (with a
   valid CSRF token) with 403, writing nothing.
"""

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from agents.demo import SOURCE_DIGEST
from agents.migrate_project import KIND, plan
from audit.principals import Principal
from tasks.connectors.objectstore import ObjectStoreConnector
from tasks.lifecycle import TaskStatus
from tasks.models import Receipt, Task
from tasks.permissions import permission_grant
from tasks.plans import task_create
from tasks.runner import run_task_once
from tests.conftest import person
from tests.simulator_fixture import Simulator

pytestmark = pytest.mark.browser

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": SOURCE_DIGEST}
BATCH = 5  # objects in the one copy: a small task


def operator_of(task: Task, name: str = "ann") -> Principal:
    ann = person(name, "operator")
    permission_grant(actor=person(f"root-{name}", "admin"), user=ann.user, task=task)
    return ann


def budget_spent_task(store: Simulator) -> Task:
    """The reference agent's migration of five objects whose only copy attempt met an outage: the worker loop (the
    same one the Celery job runs) pauses it, budget exhausted."""
    document = plan("acme", objects=BATCH, source=SOURCE, max_batch=BATCH)
    for node in document["nodes"]:
        if node["key"] == "copy-batch-1":
            node["max_attempts"] = 1
    task = task_create(
        kind=KIND, title="Migrate project acme", plan=document, created_by="agent:migrator", project="acme"
    )
    store.fault("dependency_unavailable", match=f"rk-{task.uid.hex}-p1-copy-batch-1-")
    run_task_once(
        task_id=task.pk, holder_id="worker-1", connector=ObjectStoreConnector(store.url, idempotency="remote")
    )
    task.refresh_from_db()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "budget_exhausted"), task.status_detail
    return task


def copy_by_hand(store: Simulator, task: Task) -> dict[str, Any]:
    """What the operator did in the store's own console: the copy, under an id of their own. Its receipt."""
    target = Receipt.objects.get(operation__task=task, operation__node__key="prepare-target").remote_id
    params = {"target": target, "source": SOURCE, "batch": 1, "limit": BATCH}
    status, answer = store.call("POST", "/ops/manual-copy-acme-1", {"action": "copy_batch", "params": params})
    assert status == 200, answer
    receipt: dict[str, Any] = answer.get("receipt", answer)
    return receipt


def wait_on_the_task_page(page: Page, text: str, seconds: float = 30) -> None:
    """Reads the task page afresh until its state section says ``text`` (bounded)."""
    deadline = time.monotonic() + seconds
    while text not in (page.locator("#state").text_content() or ""):
        assert time.monotonic() < deadline, (
            f"the task page never said {text!r}: {page.locator('#state').text_content()}"
        )
        time.sleep(0.5)
        page.reload()


def test_an_operator_finishes_a_paused_task_by_hand_and_the_worker_completes_it(
    page: Page, store: Simulator, worker: str, login: Callable[..., None]
) -> None:
    task = budget_spent_task(store)
    ann = operator_of(task)
    receipt = copy_by_hand(store, task)

    login(page, ann.user)
    page.goto(reverse("attention"))
    row = page.get_by_role("row").filter(has_text=task.title)
    expect(row).to_contain_text("budget")
    row.get_by_role("link", name=str(task.pk), exact=True).click()
    assert page.url.endswith(reverse("task-detail", args=[task.pk]))
    expect(page.locator("#state")).to_contain_text("budget")
    page.get_by_role("link", name="Take over…").click()
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text("You hold this task.")).to_be_visible()

    copy = page.get_by_role("group", name="Step copy-batch-1")
    copy.get_by_label("Remote id").fill(receipt["remote_id"])
    copy.get_by_label("Count").fill(str(BATCH))
    copy.get_by_label("Evidence items").fill("console_url: https://store.example/ops/manual-copy-acme-1")
    page.get_by_label("Resume the agent", exact=False).check()
    page.get_by_role("button", name="Review what will change").click()
    expect(page.get_by_text("Review — nothing is saved until you confirm")).to_be_visible()
    expect(page.get_by_text("copy-batch-1")).not_to_have_count(0)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.HUMAN, "the review wrote nothing"

    page.get_by_role("button", name="Confirm and apply").click()
    expect(page.get_by_text("Result recorded and the task handed back")).to_be_visible()
    page.goto(reverse("task-detail", args=[task.pk]))
    wait_on_the_task_page(page, "Completed")
    expect(page.locator("#node-switch-reference")).to_contain_text("succeeded")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED
