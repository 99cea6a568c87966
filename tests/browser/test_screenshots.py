"""Every console page, as people see it: at 1280x800 and on a narrow phone screen (390x844), each in light and dark
(prefers-color-scheme), saved under screenshots/ as ``page-<what>-<wide|narrow>-<light|dark>.png``. Each page is
checked on the way: it has an <h1>, it does not scroll sideways on the narrow screen, and no text is below WCAG AA
contrast (4.5:1, 3:1 when large) against the first opaque background behind it.

The tasks are put in their states through the services and the protocol steps (tests/steps.py), never by writing
a status column; the dialogs opened by HTMX are opened by clicking."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from playwright.sync_api import Page, ViewportSize, expect

from leases.models import Lease
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed
from tasks.engine.runner import run_task_once
from tasks.models import Operation, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import lease_force_release
from tasks.people.takeover import takeover_claim
from tests.conftest import chain_plan, effect_node, person
from tests.kinds import kind_registered
from tests.steps import record, send
from tests.test_console_reconcile import KIND as RECONCILE_KIND
from tests.test_console_reconcile import Remote, unknown_task

pytestmark = pytest.mark.browser

WIDE: ViewportSize = {"width": 1280, "height": 800}
NARROW: ViewportSize = {"width": 390, "height": 844}

# Elements with text of their own below WCAG AA contrast against the first opaque background behind them: 4.5:1
# for normal text, 3:1 for large text (24 px, or 18.66 px bold). The text colour is blended over that background
# when it is translucent. Disabled controls are exempt (as WCAG exempts them).
LOW_CONTRAST = """() => {
  const parse = (c) => {
    const m = /^rgba?\\(([^)]+)\\)$/.exec(c);
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
  };
  const dark = matchMedia('(prefers-color-scheme: dark)').matches
    && /dark/.test(getComputedStyle(document.documentElement).colorScheme);
  const canvas = dark ? {r: 18, g: 18, b: 18, a: 1} : {r: 255, g: 255, b: 255, a: 1};
  const behind = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0.5) return c;
    }
    return canvas;
  };
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  const luminance = (c) => 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b);
  const found = [];
  for (const el of document.querySelectorAll('body *')) {
    if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    if (el.closest('[disabled], [aria-disabled="true"]')) continue;
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    if (style.visibility === 'hidden' || box.width <= 1 || box.height <= 1) continue;
    if (style.clip === 'rect(0px, 0px, 0px, 0px)' || style.clipPath === 'inset(50%)') continue;  // visually hidden
    const fg0 = parse(style.color), bg = behind(el);
    if (!fg0) continue;
    const fg = {r: fg0.r * fg0.a + bg.r * (1 - fg0.a), g: fg0.g * fg0.a + bg.g * (1 - fg0.a),
                b: fg0.b * fg0.a + bg.b * (1 - fg0.a)};
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
    const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    if (ratio < need) {
      const text = el.textContent.trim().slice(0, 30);
      found.push(`${el.tagName.toLowerCase()}.${el.className} "${text}" ${style.color} on `
        + `rgb(${bg.r}, ${bg.g}, ${bg.b}): ${ratio.toFixed(2)}:1 < ${need}:1`);
    }
  }
  return found;
}"""

# What sticks out past the narrow screen: boxes, and text overflowing its box (a long word that does not wrap).
WIDER_THAN_NARROW = """(limit) => [...document.querySelectorAll('body *')]
  .filter((e) => e.getBoundingClientRect().right + scrollX > limit + 1
    || (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === 'visible' && e.clientWidth > 0))
  .slice(-4).map((e) => `${e.tagName.toLowerCase()}.${e.className} "${e.textContent.trim().slice(0, 24)}"`
    + ` right ${Math.round(e.getBoundingClientRect().right + scrollX)}px,`
    + ` content ${e.scrollWidth}px in ${e.clientWidth}px`)"""


class Shots:
    """Saves each page wide and narrow, light and dark, and notes what is wrong with it; asserted at the end of a
    test so every page of the test is saved even when one fails."""

    def __init__(self, page: Page, screenshot: Callable[[Page, str], list[Path]]) -> None:
        self.page, self.screenshot = page, screenshot
        self.saved: list[Path] = []
        self.problems: list[str] = []

    def take(self, name: str) -> None:
        page = self.page
        page.wait_for_load_state()
        if page.locator("h1").count() == 0:
            self.problems.append(f"{name}: no <h1>")
        for size_name, size in (("wide", WIDE), ("narrow", NARROW)):
            page.set_viewport_size(size)
            for scheme in ("light", "dark"):
                page.emulate_media(color_scheme=scheme)
                for faint in page.evaluate(LOW_CONTRAST):
                    self.problems.append(f"{name} ({size_name}, {scheme}): text below AA contrast: {faint}")
            if size_name == "narrow":
                width = page.evaluate("document.documentElement.scrollWidth")
                if width > NARROW["width"] + 1:
                    wide = page.evaluate(WIDER_THAN_NARROW, NARROW["width"])
                    self.problems.append(f"{name}: scrolls sideways at 390 px ({width} px): {wide}")
            self.saved += self.screenshot(page, f"page-{name}-{size_name}")
        page.set_viewport_size(WIDE)

    def visit(self, url: str, name: str, status: int = 200) -> None:
        answer = self.page.goto(url)
        assert answer is not None
        if answer.status != status:
            self.problems.append(f"{name}: {url} answered {answer.status}, not {status}")
        self.take(name)

    def check(self) -> None:
        assert not self.problems, "\n".join(self.problems)


@pytest.fixture
def shots(page: Page, screenshot: Callable[[Page, str], list[Path]]) -> Shots:
    return Shots(page, screenshot)


def approval(key: str) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}}


def operator(*kinds: str) -> User:
    """ann, who operates every task of these kinds (scope grants)."""
    ann = person("ann", "operator")
    root = person("root", "admin")
    user: User = ann.user
    for kind in kinds:
        permission_grant(actor=root, user=user, kind=kind)
    return user


@contextmanager
def registered(remote: Remote) -> Iterator[None]:
    with kind_registered(RECONCILE_KIND, connector=lambda: remote):
        yield


def states(make_task: Callable[..., Task], agent_lease: Callable[..., Lease], ann: User) -> dict[str, Task]:
    """A task in each state worth a page, reached through the protocol and the services."""
    from audit.principals import Principal

    who = Principal.of_user(ann)
    tasks: dict[str, Task] = {}

    tasks["awaiting-approval"] = make_task(
        {"nodes": [approval("ok"), effect_node("b", depends_on=["ok"])]}, title="Migrate project birch"
    )

    running = make_task(chain_plan("a", "b"), title="Migrate project cedar")
    send(running, agent_lease(running), "a")
    tasks["running"] = running

    tasks["unknown-operation"] = unknown_task(make_task, agent_lease)

    budget = make_task(
        {"nodes": [effect_node("a", max_attempts=1, on_failure={"dependency_unavailable": "retry"})]},
        title="Migrate project juniper",
    )
    lease = agent_lease(budget)
    record(send(budget, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE), lease)
    tasks["paused"] = budget

    held = make_task(chain_plan("a", "b"), title="Migrate project hazel")
    assert takeover_claim(actor=who, task_id=held.pk).granted
    tasks["held-by-a-person"] = held

    stopping = make_task(chain_plan("a", "b"), title="Migrate project larch")
    lease = agent_lease(stopping)
    send(stopping, lease, "a")
    task_request_cancel(actor=who, task_id=stopping.pk, reason="the customer withdrew the migration")
    tasks["stopping"] = stopping

    # Cancelled with an operation of unknown outcome the remote cannot answer about yet: stopped, to reconcile.
    pending = unknown_task(make_task, agent_lease)
    task_request_cancel(actor=who, task_id=pending.pk, reason="the customer withdrew the migration")
    silent = Remote()
    for op in Operation.objects.filter(task=pending, status="unknown"):
        silent.holds[op.op_key] = Failed(FailureClass.CONNECTION_INTERRUPTED)
    with registered(silent):
        run_task_once(task_id=pending.pk, holder_id="worker-1", connector=silent)
    tasks["stopped-pending"] = pending

    done = make_task(chain_plan("a"), title="Migrate project alder")
    lease = agent_lease(done)
    record(send(done, lease, "a"), Committed(remote_id="r-a"), lease)
    tasks["completed"] = done

    return {name: Task.objects.get(pk=task.pk) for name, task in tasks.items()}


def test_the_pages_an_operator_sees(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    login: Callable[..., None],
    shots: Shots,
) -> None:
    ann = operator("test", RECONCILE_KIND)
    tasks = states(make_task, agent_lease, ann)
    assert tasks["paused"].status == "paused", (tasks["paused"].status, tasks["paused"].status_reason)
    assert tasks["completed"].status == "completed"
    assert tasks["stopping"].status == "stopping"
    assert tasks["stopped-pending"].status == "stopped_pending", tasks["stopped-pending"].status

    page.goto(reverse("login"))
    shots.take("login")
    login(page, ann)
    shots.visit(reverse("task-list"), "work-queue")
    shots.visit(reverse("attention"), "needs-attention")

    for state, task in tasks.items():
        shots.visit(reverse("task-detail", args=[task.pk]), f"task-{state}")

    unknown = tasks["unknown-operation"]
    shots.visit(reverse("takeover", args=[unknown.pk]), "takeover-free")
    held = tasks["held-by-a-person"]
    shots.visit(reverse("takeover", args=[held.pk]), "takeover-holding")
    shots.visit(reverse("takeover-replan", args=[held.pk]), "replan")
    shots.visit(reverse("task-actions", args=[held.pk]), "actions")
    page.get_by_role("link", name="Cancel this task…").click()
    expect(page.locator("#dialog")).to_contain_text(f"Type {held.pk} to confirm")
    shots.take("cancel-dialog")
    shots.visit(reverse("task-cancel", args=[held.pk]), "cancel-page")

    shots.visit(reverse("task-notes", args=[held.pk]), "notes")
    shots.visit(reverse("bulk") + "?op=cancel&exclude=completed", "bulk-preview")
    shots.visit(reverse("password_change"), "password-change")
    shots.visit(reverse("task-detail", args=[999_999]), "not-found-404", status=404)
    shots.check()


def test_a_saved_view(page: Page, make_task: Callable[..., Task], login: Callable[..., None], shots: Shots) -> None:
    make_task(title="Migrate project birch")
    login(page, operator("test"))
    page.goto(reverse("task-list") + "?exclude=completed")
    page.get_by_label("Save these filters as").fill("Not completed")
    page.get_by_role("button", name="Save view").click()
    page.get_by_role("link", name="Not completed").click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    shots.take("saved-view")
    shots.check()


def test_the_settle_dialog(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    login: Callable[..., None],
    shots: Shots,
) -> None:
    ann = operator(RECONCILE_KIND)
    unknown = unknown_task(make_task, agent_lease)
    login(page, ann)
    page.goto(reverse("takeover", args=[unknown.pk]))
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text("You hold this task.")).to_be_visible()
    op = Operation.objects.get(task=unknown, status="unknown")
    shots.visit(reverse("task-actions", args=[unknown.pk]), "actions-unknown-operation")
    page.get_by_role("link", name=f"Settle: done… {op.op_key}").click()
    expect(page.locator("#dialog")).to_contain_text(f"Type {unknown.pk} to confirm")
    shots.take("settle-dialog")
    shots.check()


def test_the_pages_an_admin_sees(
    page: Page,
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    login: Callable[..., None],
    shots: Shots,
) -> None:
    ada = person("ada", "admin")
    person("ann", "operator")
    person("audrey", "auditor")
    stuck = make_task(chain_plan("a", "b"), title="Migrate project stuck-agent")
    agent_lease(stuck, holder="agent-7")
    gone = make_task(chain_plan("a"), title="Migrate project gone-agent")
    agent_lease(gone, holder="agent-9")
    lease_force_release(
        actor=person("root", "admin"),
        task_id=gone.pk,
        justification="agent-9's host is gone and its lease blocks the work",
        impact="nothing was in flight; the operators on call are told",
    )
    login(page, ada.user)
    shots.visit(reverse("force-release", args=[stuck.pk]), "force-release")
    shots.visit(reverse("task-actions", args=[stuck.pk]), "actions-admin")
    page.get_by_role("link", name="Force-release the lease… (admin)").click()
    expect(page.locator("#dialog")).to_contain_text("agent-7")
    shots.take("force-release-dialog")
    shots.visit(reverse("roles"), "roles")
    shots.visit(reverse("reviews"), "reviews")
    shots.visit(reverse("audit-log"), "audit-log")
    shots.check()


def test_the_refusal_page(page: Page, make_task: Callable[..., Task], login: Callable[..., None], shots: Shots) -> None:
    task = make_task(title="Migrate project secret-acme")
    login(page, person("oscar").user)
    shots.visit(reverse("task-detail", args=[task.pk]), "refused-403", status=403)
    assert "secret-acme" not in page.content()
    shots.check()
    # The contrast check sees what it looks for: a paragraph in grey on white (3.9:1, below 4.5:1) is found.
    page.evaluate("""() => { const p = document.querySelector('main p') || document.querySelector('p');
      p.style.background = 'rgb(255, 255, 255)'; p.style.color = 'rgb(130, 130, 130)'; p.style.fontSize = '15px';
      p.style.fontWeight = '400'; }""")
    assert page.evaluate(LOW_CONTRAST), "the contrast check finds nothing even in a page made to fail it"
