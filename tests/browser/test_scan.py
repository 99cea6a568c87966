"""Pages a person can scan (issue 24, point 5), in real Chromium at 1280x800:

- axe-core (the copy shipped in the PyPI package axe-playwright-python, MPL-2.0) finds nothing serious or critical
  on any console page — login, the two queues, a task page in every state worth one, the takeover, re-plan, actions,
  cancel, notes and bulk pages, the admin's and the auditor's pages, the refusal and not-found pages — in light
  mode with every rule, in dark mode with the rules about colour (all that dark mode changes);
- the work queue shows at least 12 rows above the fold when no filter is active, and its last column is not cut off;
- no element on a task page scrolls sideways (receipts and digests wrap);
- "taken over", a normal state, is not told in the alarm colour that failed and quarantined tasks are;
- a form offers one primary action (the filled button) at most;
- every glyph the templates and the console's labels use is drawn by a font Debian's Chromium has (no empty box).

Each check collects every finding of every page before it fails, and prints them all."""

import re
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse
from playwright.sync_api import Page, expect

from audit.principals import Principal
from leases.models import Lease
from leases.services import lease_release
from reference.migrate_project import KIND
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed
from tasks.models import Task
from tasks.people.forced_release import lease_force_release
from tasks.people.takeover import takeover_claim
from tests.browser import test_demo_console
from tests.browser.conftest import VIEWPORT
from tests.browser.test_screenshots import operator, states
from tests.conftest import chain_plan, effect_node, person
from tests.steps import record, send
from tests.test_console_reconcile import KIND as RECONCILE_KIND

pytestmark = pytest.mark.browser

demo = test_demo_console.demo  # the demo's fixture: load_demo against the simulator

# axe-core as the PyPI package axe-playwright-python ships it (axe.min.js, MPL-2.0), injected into each page.
AXE_SCRIPT = (files("axe_playwright_python") / "axe.min.js").read_text(encoding="utf-8")
GRAVE = ("serious", "critical")
# Dark mode changes colours only (static/console/*.css: custom properties under prefers-color-scheme): in it, only
# axe's rules about colour can find anything the light run did not.
COLOUR_RULES = ("color-contrast", "link-in-text-block")
DIGEST = "sha256:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" * 2


def axe_findings(page: Page, rules: tuple[str, ...] = ()) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, one line per rule, with its targets;
    only ``rules``' when given."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE_SCRIPT)
    options: dict[str, Any] = {"resultTypes": ["violations"]}
    if rules:
        options["runOnly"] = {"type": "rule", "values": list(rules)}
    result: dict[str, Any] = page.evaluate("(options) => axe.run(document, options)", options)
    lines = []
    for violation in result["violations"]:
        if violation["impact"] not in GRAVE:
            continue
        targets = [" ".join(map(str, node["target"])) for node in violation["nodes"]]
        lines.append(
            f"{violation['id']} ({violation['impact']}, {len(targets)} nodes): {violation['help']}: "
            + "; ".join(targets[:4])
        )
    return lines


# The forms on the page that show more than one button in the filled (primary) style: their buttons' names.
PRIMARIES = """() => {
  const probe = document.createElement('span');
  probe.style.color = getComputedStyle(document.documentElement).getPropertyValue('--accent').trim();
  document.body.append(probe);
  const filled = getComputedStyle(probe).color;
  probe.remove();
  return [...document.querySelectorAll('form')].map((form) => [...form.querySelectorAll('button')]
      .filter((b) => b.checkVisibility() && getComputedStyle(b).backgroundColor === filled)
      .map((b) => b.textContent.trim()))
    .filter((names) => names.length > 1);
}"""


class Walk:
    """On each page visited: axe in light mode, its colour rules in dark mode, and the forms with more than one
    primary button. Every finding is kept until ``check``, so one run lists every page's."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.findings: list[str] = []
        self.primaries: list[str] = []

    def take(self, name: str) -> None:
        self.page.wait_for_load_state()
        self._scan(name, "light", ())
        self._scan(name, "dark", COLOUR_RULES)
        self.page.emulate_media(color_scheme="no-preference")

    def _scan(self, name: str, scheme: Literal["light", "dark"], rules: tuple[str, ...]) -> None:
        self.page.emulate_media(color_scheme=scheme)
        self.findings += [f"{name} ({scheme}): {line}" for line in axe_findings(self.page, rules)]
        self.primaries += [f"{name} ({scheme}): {names}" for names in self.page.evaluate(PRIMARIES)]

    def visit(self, url: str, name: str, status: int = 200) -> None:
        answer = self.page.goto(url)
        assert answer is not None and answer.status == status, (name, url, answer and answer.status)
        self.take(name)

    def check(self) -> None:
        problems = [f"{len(self.findings)} serious or critical axe findings:", *self.findings] if self.findings else []
        if self.primaries:
            problems += ["forms with more than one primary (filled) button:", *self.primaries]
        assert not problems, "\n".join(problems)


def paused_then_taken_over(make_task: Callable[..., Task], agent_lease: Callable[..., Lease], who: Any) -> Task:
    """hazel's story: the remote refused the reference switch for lack of permission, the task paused, and a person
    took it over."""
    task = make_task(
        {"nodes": [effect_node("switch-reference")]},
        title="Migrate project hazel",
    )
    lease = agent_lease(task)
    record(
        send(task, lease, "switch-reference"),
        Failed(FailureClass.PERMISSION_REVOKED, detail="the store answered 403 to switch_reference"),
        lease,
    )
    lease_release(lease=lease)
    assert Task.objects.get(pk=task.pk).status == "paused"
    assert takeover_claim(actor=who, task_id=task.pk).granted
    return Task.objects.get(pk=task.pk)


def with_a_long_receipt(make_task: Callable[..., Task], agent_lease: Callable[..., Lease]) -> Task:
    """Completed, its receipt carrying a long remote id and a digest: one long word each."""
    task = make_task(chain_plan("copy-batch-1"), title="Migrate project oak")
    lease = agent_lease(task)
    op = send(task, lease, "copy-batch-1")
    record(op, Committed(remote_id="tgt-oak-" + "0123456789abcdef" * 4, remote_version="7", digest=DIGEST), lease)
    return Task.objects.get(pk=task.pk)


# --- axe on every page ---------------------------------------------------------------------------------------------


def test_axe_finds_nothing_serious_on_the_pages_an_operator_sees(
    page: Page, make_task: Callable[..., Task], agent_lease: Callable[..., Lease], login: Callable[..., None]
) -> None:
    ann = operator("test", RECONCILE_KIND)
    tasks = states(make_task, agent_lease, ann)
    tasks["taken-over-after-a-pause"] = paused_then_taken_over(make_task, agent_lease, Principal.of_user(ann))
    tasks["completed-long-receipt"] = with_a_long_receipt(make_task, agent_lease)
    axe = Walk(page)

    page.goto(reverse("login"))
    axe.take("login")
    login(page, ann)
    page.goto(reverse("task-list") + "?exclude=completed")  # a saved view, so the list of saved views shows
    page.get_by_label("Save these filters as").fill("Not completed")
    page.get_by_role("button", name="Save view").click()
    expect(page.get_by_role("link", name="Not completed")).to_be_visible()
    axe.take("work-queue with a flash message")
    axe.visit(reverse("task-list"), "work-queue")
    axe.visit(reverse("task-list") + "?state=paused&q=hazel", "work-queue filtered")
    axe.visit(reverse("attention"), "needs-attention")
    for state, task in tasks.items():
        axe.visit(reverse("task-detail", args=[task.pk]), f"task {state}")

    unknown = tasks["unknown-operation"]
    axe.visit(reverse("takeover", args=[unknown.pk]), "takeover, free")
    held = tasks["held-by-a-person"]
    hazel = tasks["taken-over-after-a-pause"]
    axe.visit(reverse("takeover", args=[hazel.pk]), "takeover, holding after a pause")
    axe.visit(reverse("takeover", args=[tasks["awaiting-approval"].pk]), "takeover, an approval waiting")
    axe.visit(reverse("takeover", args=[held.pk]), "takeover, holding")
    page.get_by_label("Resume the agent", exact=False).check()
    page.get_by_role("button", name="Review what will change").click()
    expect(page.get_by_text("Review — nothing is saved until you confirm")).to_be_visible()
    axe.take("takeover, a result under review")
    approving = tasks["awaiting-approval"]
    assert takeover_claim(actor=Principal.of_user(ann), task_id=approving.pk).granted
    axe.visit(reverse("takeover", args=[approving.pk]), "takeover, holding with an approval waiting")
    axe.visit(reverse("takeover-replan", args=[held.pk]), "replan")
    axe.visit(reverse("task-actions", args=[held.pk]), "actions")
    page.get_by_role("link", name="Cancel this task…").click()
    expect(page.locator("#dialog")).to_contain_text(f"Type {held.pk} to confirm")
    axe.take("cancel dialog")
    axe.visit(reverse("task-actions", args=[unknown.pk]), "actions, an unknown operation")
    axe.visit(reverse("task-cancel", args=[held.pk]), "cancel page")
    axe.visit(reverse("task-notes", args=[held.pk]), "notes")
    axe.visit(reverse("task-retained", args=[held.pk]), "retained objects")
    axe.visit(reverse("bulk") + "?op=cancel&exclude=completed", "bulk preview")
    axe.visit(reverse("password_change"), "password change")
    axe.visit(reverse("task-detail", args=[999_999]), "not found", status=404)
    axe.check()


def test_axe_finds_nothing_serious_on_the_pages_an_admin_and_an_outsider_see(
    page: Page, make_task: Callable[..., Task], agent_lease: Callable[..., Lease], login: Callable[..., None]
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
    axe = Walk(page)
    login(page, ada.user)
    axe.visit(reverse("force-release", args=[stuck.pk]), "force release")
    axe.visit(reverse("roles"), "roles")
    axe.visit(reverse("reviews"), "reviews")
    axe.visit(reverse("audit-log"), "audit log")
    axe.visit(reverse("api-tokens"), "agent tokens")
    page.context.clear_cookies()
    login(page, person("oscar").user)
    axe.visit(reverse("task-detail", args=[stuck.pk]), "refused", status=403)
    axe.check()
    # The check sees what it looks for: a list item outside a list, and an image without a text, are found.
    page.evaluate("""() => { const ul = document.createElement('ul'); ul.setAttribute('role', 'status');
      ul.innerHTML = '<li>a message</li>'; document.querySelector('main').append(ul);
      const img = document.createElement('img'); img.src = '/static/none.png';
      document.querySelector('main').append(img); }""")
    found = " ".join(axe_findings(page))
    assert "listitem" in found and "image-alt" in found, found
    # The dark run's colour rules see what they look for: a heading in a grey the dark background hides is found.
    page.emulate_media(color_scheme="dark")
    page.evaluate("() => { document.querySelector('h1').style.color = 'rgb(48, 54, 61)'; }")
    found = " ".join(axe_findings(page, COLOUR_RULES))
    assert "color-contrast" in found and "listitem" not in found, found


# --- the demo at 1280x800: the queue above the fold, nothing sideways, the colours of the states -------------------

ROWS_ABOVE = """(fold) => [...document.querySelectorAll('#queue-rows tr[data-task]')]
  .filter((tr) => tr.getBoundingClientRect().top < fold).length"""

# The queue's cells past the screen's right edge, and how wide the page is.
CUT_OFF = """() => ({page: document.documentElement.scrollWidth,
  cells: [...document.querySelectorAll('table.tasks th, table.tasks td')]
    .filter((c) => c.getBoundingClientRect().right > innerWidth + 1).slice(0, 3)
    .map((c) => c.textContent.trim().slice(0, 30))})"""

# Elements that scroll sideways (their content wider than their box, in a box that scrolls).
SIDEWAYS = """() => [...document.querySelectorAll('body *')].filter((e) => {
  const x = getComputedStyle(e).overflowX;
  return (x === 'auto' || x === 'scroll') && e.scrollWidth > e.clientWidth + 1;
}).map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${e.scrollWidth}px in ${e.clientWidth}px`)"""

COLOUR = "(selector) => getComputedStyle(document.querySelector(selector)).color"


def test_the_demo_at_1280_by_800(
    page: Page,
    demo: list[Task],
    make_task: Callable[..., Task],
    login: Callable[..., None],
    screenshot: Callable[..., list[Path]],
) -> None:
    """The demo's twelve tasks and four more: at least twelve queue rows begin above the fold with no filter set
    (and a saved view and a flash message on the page), the last column is on the screen; no task page has
    anything that scrolls sideways; hazel, taken over by a person, says on its takeover page why it paused; "taken
    over" is not in the alarm colour of failed and quarantined tasks, nor in that of the paused ones waiting for a
    person."""
    for project in ("oak", "pine", "rowan", "yew"):
        title = f"Migrate project {project}: waiting for a worker"
        make_task(chain_plan("a", "b"), kind=KIND, title=title, project=project)
    operator_login = User.objects.get(username="operator")
    hazel = next(task for task in demo if task.project == "hazel")
    assert hazel.status == "paused" and hazel.status_reason == "permission_revoked", hazel.status
    assert takeover_claim(actor=Principal.of_user(operator_login), task_id=hazel.pk).granted
    login(page, User.objects.get(username="admin"))

    page.goto(reverse("task-list") + "?exclude=completed")
    page.get_by_label("Save these filters as").fill("Not completed")
    page.get_by_role("button", name="Save view").click()
    expect(page.get_by_role("link", name="Not completed")).to_be_visible()
    page.goto(reverse("task-list"))
    screenshot(page, "scan-demo-work-queue")
    above = page.evaluate(ROWS_ABOVE, VIEWPORT["height"])
    assert above >= 12, f"only {above} queue rows begin above the fold ({VIEWPORT['height']} px)"
    cut = page.evaluate(CUT_OFF)
    assert cut["page"] <= VIEWPORT["width"] and not cut["cells"], f"the queue is wider than the screen: {cut}"
    expect(page.get_by_label("Text")).not_to_be_visible()  # folded away: no filter is set
    page.goto(reverse("task-list") + "?q=hazel")
    expect(page.get_by_label("Text")).to_have_value("hazel")  # a filter that is set is shown
    page.goto(reverse("attention"))
    screenshot(page, "scan-demo-needs-attention")

    page.goto(reverse("task-list"))
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        taken, paused = page.evaluate(COLOUR, ".badge.status-human"), page.evaluate(COLOUR, ".badge.status-paused")
        alarm = page.evaluate(COLOUR, ".badge.status-quarantined")
        assert taken not in (alarm, paused), f"'taken over' is told in the colour {taken} of alarms ({scheme})"

    sideways = []
    for task in demo:
        page.goto(reverse("task-detail", args=[task.pk]))
        sideways += [f"task {task.project} ({task.status}): {what}" for what in page.evaluate(SIDEWAYS)]
        if task.project in ("ginkgo", "alder"):
            screenshot(page, f"scan-demo-task-{task.project}")
    assert not sideways, "scrolls sideways:\n" + "\n".join(sideways)

    page.context.clear_cookies()
    login(page, operator_login)  # the person who took hazel over
    page.goto(reverse("takeover", args=[hazel.pk]))
    expect(page.get_by_text("You hold this task.")).to_be_visible()
    pause = page.locator(".pause-before")
    expect(pause).to_contain_text("permission revoked")
    expect(pause).to_contain_text("HTTP 403")  # the detail the pause recorded, from the store's answer
    screenshot(page, "scan-demo-takeover-hazel")


# --- every glyph is drawn --------------------------------------------------------------------------------------------

# A glyph no font has is drawn as the font's "missing" box, the same for every such character: one from the Private
# Use Area is that box. A character drawn exactly like it, at two sizes, is missing here.
MISSING = """(chars) => {
  const canvas = document.createElement('canvas'); canvas.width = 64; canvas.height = 64;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (c, size) => {
    ctx.clearRect(0, 0, 64, 64); ctx.font = `${size}px system-ui, sans-serif`; ctx.fillText(c, 4, 48);
    return Array.from(ctx.getImageData(0, 0, 64, 64).data).join(',');
  };
  const box = [draw('\\uE000', 40), draw('\\uE000', 24)];
  return chars.filter((c) => draw(c, 40) === box[0] && draw(c, 24) === box[1]);
}"""

SHOWN = re.compile(r"[^\x00-\x7f]")


def glyphs_of_the_console() -> list[str]:
    """Every non-ASCII character in the templates and the console's Python (labels, icons, messages)."""
    root = Path(settings.BASE_DIR)
    files = [*root.glob("templates/**/*.html"), *root.glob("console/**/*.py")]
    return sorted({char for path in files for char in SHOWN.findall(path.read_text(encoding="utf-8"))})


def test_every_glyph_the_console_uses_is_drawn(page: Page, live_server: Any) -> None:
    chars = glyphs_of_the_console()
    assert "◆" in chars and len(chars) > 20, "the glyphs were not found"
    page.goto(live_server.url + reverse("login"))
    assert page.evaluate(MISSING, ["\ue001", "\U0001f6d1"]) != [], "the check does not see a missing glyph"
    missing = page.evaluate(MISSING, chars)
    assert not missing, "drawn as an empty box (no font here has them): " + " ".join(
        f"{c} (U+{ord(c):04X})" for c in missing
    )
