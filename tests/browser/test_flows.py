"""Whole jobs done by people in real Chromium against the live server: each flow clicks and fills
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
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from audit.principals import Principal
from leases.models import ForcedRelease
from leases.services import lease_open
from reference.demo import SOURCE_DIGEST
from reference.migrate_project import KIND, plan
from reference.objectstore import ObjectStoreConnector
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import TaskStatus
from tasks.engine.plans import task_create
from tasks.engine.runner import run_task_once
from tasks.models import Operation, Receipt, Task
from tasks.people.forced_release import lease_force_release
from tests.conftest import chain_plan, person, snapshot
from tests.kinds import kind_registered
from tests.simulator_fixture import Simulator
from tests.test_console_reconcile import KIND as RECONCILE_KIND
from tests.test_console_reconcile import Remote, stuck_temp, unknown_task

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
        if node["key"] == "copy-batch":  # the fan-out node: every batch, here the one
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
    review = page.get_by_role("region", name="What will change")
    expect(review).to_contain_text("Step copy-batch-1: pending → succeeded")
    expect(review).to_contain_text("Task: human → pending")
    expect(review).to_contain_text("the agent is woken once this is committed")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.HUMAN, "the review wrote nothing"

    page.get_by_role("button", name="Confirm and apply").click()
    expect(page.get_by_text("Result recorded and the task handed back")).to_be_visible()
    page.goto(reverse("task-detail", args=[task.pk]))
    wait_on_the_task_page(page, "Completed")
    expect(page.locator("#node-copy-batch-1")).to_contain_text(receipt["remote_id"])
    expect(page.locator("#node-verify-digests")).to_contain_text("satisfies the evidence spec")
    expect(page.locator("#node-switch-reference")).to_contain_text("succeeded")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED


@pytest.fixture
def remote() -> Iterator[Remote]:
    """The reconcile test kind's remote (in this process: the live server's thread asks it)."""
    held = Remote()
    with kind_registered(RECONCILE_KIND, connector=lambda: held):
        yield held


def test_an_operator_settles_an_unknown_operation_by_hand_and_the_task_page_shows_it(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    login: Callable[..., None],
    remote: Remote,
) -> None:
    task = unknown_task(make_task, agent_lease)
    op = Operation.objects.get(task=task, status="unknown")
    ann = operator_of(task)
    login(page, ann.user)
    page.goto(reverse("attention"))
    row = page.get_by_role("row").filter(has_text=task.title)
    expect(row).to_contain_text("unknown")
    expect(page.get_by_role("link", name="Act on these tasks in bulk…")).to_be_visible()  # an auditor has none
    row.get_by_role("link", name=str(task.pk), exact=True).click()
    expect(page.locator("#state")).to_contain_text(op.op_key)

    page.get_by_role("link", name="Take over…").click()
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text("You hold this task.")).to_be_visible()
    page.goto(reverse("task-detail", args=[task.pk]))
    page.get_by_role("link", name="Cancel, reconcile…").click()
    expect(page.get_by_role("heading", name="Open operations (1)")).to_be_visible()
    page.get_by_role("link", name=f"Settle: done… {op.op_key}").click()
    dialog = page.locator("#dialog")
    dialog.get_by_label("Remote id").fill("batch-1")
    dialog.get_by_label("What you checked").fill("the store's console lists batch-1 under this op key")
    dialog.get_by_label(f"Type {task.pk} to confirm").fill(str(task.pk))
    dialog.get_by_role("button", name="Settle the operation").click()
    expect(page.get_by_text(f"Operation {op.op_key} settled by hand (done).")).to_be_visible()
    expect(page.get_by_role("heading", name="Open operations (0)")).to_be_visible()

    page.goto(reverse("task-detail", args=[task.pk]))
    node = page.locator("#node-a")
    expect(node).to_contain_text("succeeded")
    expect(node).to_contain_text("batch-1")
    expect(node).to_contain_text(op.op_key)
    expect(page.locator("#state")).not_to_contain_text(op.op_key)
    assert Operation.objects.get(pk=op.pk).status == "committed"


def test_an_admin_force_releases_a_lease_and_only_another_admin_reviews_it(
    page: Page, make_task: Callable[..., Task], agent_lease: Callable[..., Any], login: Callable[..., None]
) -> None:
    task = make_task(chain_plan("a", "b"), title="Migrate project stuck-agent")
    agent_lease(task, holder="agent-7")
    ada, bob = person("ada", "admin").user, person("bob", "admin").user

    login(page, ada)
    page.goto(reverse("task-detail", args=[task.pk]))
    page.get_by_role("link", name="Cancel, reconcile…").click()
    page.get_by_role("link", name="Force-release the lease… (admin)").click()
    dialog = page.locator("#dialog")
    expect(dialog).to_contain_text("agent-7")
    dialog.get_by_label("Justification").fill("agent-7's host is gone and its lease blocks the migration")
    dialog.get_by_label("Impact").fill("nothing was in flight; the operators on call are told in #ops")
    dialog.get_by_label(f"Type {task.pk} to confirm").fill(str(task.pk))
    dialog.get_by_role("button", name="Force-release the lease").click()
    expect(page.get_by_text(f"Lease of task {task.pk} released; it waits for another admin's review.")).to_be_visible()
    forced = ForcedRelease.objects.get(task=task)
    assert forced.status == "pending" and "agent-7" in forced.removed_holder

    assert lease_open(task.pk) is None, "the agent's lease is closed"
    page.get_by_role("navigation").get_by_role("link", name="Reviews").click()
    card = page.get_by_role("article").filter(has_text=f"Forced release #{forced.pk}")
    expect(card).to_contain_text("You forced this release: another admin reviews it.")
    expect(card.get_by_role("button", name="Record the review")).to_have_count(0)
    # Past the page: ada posts a verdict on her own release anyway; the service refuses it.
    refused = page.request.post(
        reverse("review", args=[forced.pk]),
        headers={"X-CSRFToken": csrf_token(page)},
        form={"verdict": "accepted", "note": "I reviewed my own release, which must not count"},
    )
    assert refused.url.endswith(reverse("reviews")), refused.url
    assert "message-error" in refused.text(), "the refusal is said on the reviews page"
    assert ForcedRelease.objects.get(pk=forced.pk).status == "pending", "an admin reviewed their own release"
    page.get_by_role("button", name="Log out").click()

    login(page, bob)
    page.get_by_role("navigation").get_by_role("link", name="Reviews").click()
    card = page.get_by_role("article").filter(has_text=f"Forced release #{forced.pk}")
    expect(card).to_contain_text("user:ada")
    card.get_by_label("Accept: the release was justified").check()
    card.get_by_label("Note").fill("checked: agent-7's host was decommissioned this morning")
    card.get_by_role("button", name="Record the review").click()
    expect(page.get_by_text(f"Forced release #{forced.pk} accepted.")).to_be_visible()
    expect(page.get_by_role("row").filter(has_text="checked: agent-7's host")).to_contain_text("bob")
    reviewed = ForcedRelease.objects.get(pk=forced.pk)
    assert (reviewed.status, reviewed.reviewed_by) == ("accepted", "user:bob")


def csrf_token(page: Page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def auditor_action_posts(
    task: Task, op: Operation, temp_task: Task, temp_id: int, forced: ForcedRelease
) -> dict[str, dict[str, str | float | bool]]:
    """Every console URL that changes something, with a form that would pass its validation."""
    v, pk, user_id = str(task.version), str(task.pk), str(forced.forced_by_user_id)
    change: dict[str, str | float | bool] = {
        "version": v,
        "expected_version": v,
        "confirm": pk,
        "reason": "the auditor tries to act here",
    }
    return {
        reverse("takeover-claim", args=[task.pk]): change,
        reverse("takeover-renew", args=[task.pk]): {"epoch": "1", "renewal_seq": "0"},
        reverse("takeover-release", args=[task.pk]): {"epoch": "1", "reason": "giving it back"},
        reverse("takeover-submit", args=[task.pk]): change
        | {"epoch": "1", "decision": "resume_agent", "stage": "confirm"},
        reverse("takeover-approve", args=[task.pk]): change | {"node_key": "a", "approving": "sha256:" + "0" * 64},
        reverse("takeover-replan", args=[task.pk]): change | {"plan": '{"nodes": []}'},
        reverse("takeover-replan-accept", args=[task.pk]): change | {"revision_id": "1"},
        reverse("task-cancel", args=[task.pk]): change,
        reverse("force-release", args=[task.pk]): change
        | {"justification": "the auditor pretends an agent hangs", "impact": "none at all, it is a test of access"},
        reverse("operation-settle", args=[task.pk, op.op_key]): change
        | {"resolution": "done", "remote_id": "batch-1", "note": "the auditor pretends to have checked"},
        reverse("operation-query", args=[task.pk, op.op_key]): change,
        reverse("temp-reset", args=[temp_task.pk, temp_id]): {
            "version": str(temp_task.version),
            "confirm": str(temp_task.pk),
            "reason": "the auditor tries to reset",
        },
        reverse("task-notes", args=[task.pk]): {"text": "an auditor's note"},
        reverse("review", args=[forced.pk]): {"verdict": "accepted", "note": "an auditor may read, never review"},
        reverse("role-grant"): {"user": user_id, "role": "admin"},
        reverse("role-revoke"): {"user": user_id, "role": "admin"},
        reverse("task-grant"): {"user": user_id, "task": pk},
        reverse("task-revoke"): {"user": user_id, "task": pk},
        reverse("account-create"): {"username": "mallory", "role": "admin"},
        reverse("password-reset", args=[forced.forced_by_user_id]): {"confirm": "ada"},
        reverse("scope-grant"): {"user": user_id, "kind": RECONCILE_KIND},
        reverse("scope-revoke"): {"user": user_id, "kind": RECONCILE_KIND},
        reverse("bulk"): {"operation": "cancel", "filter": "", "seen": f"{pk}:{v}", "confirm": "1", "reason": "x" * 20},
    }


def test_an_auditor_sees_everything_and_no_action_works(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    login: Callable[..., None],
    remote: Remote,
) -> None:
    task = unknown_task(make_task, agent_lease)
    op = Operation.objects.get(task=task, status="unknown")
    temp_task, temp = stuck_temp(make_task, agent_lease, remote)
    held = make_task(chain_plan("a"), title="Migrate project held")
    agent_lease(held, holder="agent-7")
    forced = lease_force_release(
        actor=person("ada", "admin"),
        task_id=held.pk,
        justification="agent-7's host is gone and its lease blocks the work",
        impact="nothing was in flight; the operators are told",
    )
    audrey = person("audrey", "auditor").user
    login(page, audrey)

    page.goto(reverse("task-list"))
    expect(page.get_by_role("row").filter(has_text=task.title).first).to_be_visible()
    expect(page.get_by_role("link", name="Act on these tasks in bulk…")).to_have_count(0)
    page.goto(reverse("task-detail", args=[task.pk]))
    expect(page.get_by_role("heading", level=1)).to_have_text(task.title)
    expect(page.locator("#state")).to_contain_text(op.op_key)
    for name in ("Take over…", "Cancel, reconcile…"):
        expect(page.get_by_role("link", name=name)).to_have_count(0)
    page.get_by_role("navigation").get_by_role("link", name="Audit log").click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    expect(page.locator("main")).to_contain_text("force")
    page.get_by_role("navigation").get_by_role("link", name="Reviews").click()
    card = page.get_by_role("article").filter(has_text=f"Forced release #{forced.pk}")
    expect(card).to_contain_text("agent-7")
    expect(page.get_by_text("You read this queue; only admins review.")).to_be_visible()
    expect(page.get_by_role("button", name="Record the review")).to_have_count(0)
    expect(page.get_by_role("navigation").get_by_role("link", name="Roles")).to_have_count(0)

    token = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
    # The token is good: what an auditor may do (check a task's chain) takes it.
    check = page.request.post(reverse("task-chain-check", args=[task.pk]), headers={"X-CSRFToken": token})
    assert check.status == 200, check.status
    before = snapshot()
    answers = {}
    for url, form in auditor_action_posts(task, op, temp_task, temp.pk, forced).items():
        answer = page.request.post(url, headers={"X-CSRFToken": token}, form=form, max_redirects=0)
        answers[url] = answer.status
        assert "CSRF verification failed" not in answer.text(), (
            f"{url}: refused for its token, not for the auditor's role"
        )
    assert {url: status for url, status in answers.items() if status != 403} == {}
    assert snapshot() == before, "a refused action wrote something"
