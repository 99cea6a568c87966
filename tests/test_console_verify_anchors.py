"""The console's "Verify now" shows the anchors' verdict beside the chains': anchored and consistent, a cut
found — a chain whose tail was cut and whose head was rolled back, so that the database reads consistently —, or
not anchored, in plain words. Each case on a real anchor file, the cut made as a database superuser would make it
(tests/test_anchoring.py)."""

import html as html_text
import re
import types
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings as SettingsWrapper

from audit.anchors import anchor_heads
from audit.models import AuditEvent, VerificationRun
from console.views import admin as admin_views
from leases.clock import ControllableClock
from tasks.engine.verification import task_quarantine
from tasks.jobs import verify_logs
from tasks.models import Task
from tests.conftest import person
from tests.test_anchoring import ROW, a_task, anchoring, audited, cut_the_audit_chain, cut_the_task_log

__all__ = ["anchoring"]  # the fixture, used by name

pytestmark = pytest.mark.django_db


@pytest.fixture
def verify_now(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """An admin presses "Verify now"; the job runs at once (it goes to a worker after the commit:
    tests/test_console_admin.py). The audit log page's verification card, as text."""
    monkeypatch.setattr(admin_views, "transaction", types.SimpleNamespace(on_commit=lambda run, robust=False: run()))
    monkeypatch.setattr(verify_logs, "delay", verify_logs)
    browser = Client()
    browser.force_login(person("ada", "admin").user)

    def press() -> str:
        response = browser.post(reverse("verify-logs"), follow=True)
        assert response.status_code == 200
        return card(response.content.decode())

    return press


def card(page: str) -> str:
    """The verification card's words, tags stripped, spaces folded: what a person reads."""
    start = page.index('aria-labelledby="verify-title"')
    section = page[start : page.index("</section>", start)]
    return html_text.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section))).strip()


def anchors_line(text: str) -> str:
    return text[text.index("Anchors outside the database:") : text.index("Last run")]


def test_chains_that_reach_their_checkpoints_are_shown_anchored_and_consistent(
    verify_now: Callable[[], str],
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    clock: ControllableClock,
    anchoring: Path,
) -> None:
    a_task(make_task, agent_lease)
    audited(2, clock)
    checkpoint = anchor_heads()
    assert checkpoint is not None
    audited(1, clock)  # the chain moved on after the checkpoint: nothing wrong
    text = verify_now()
    assert "Both logs verified." in text
    newest = datetime.fromisoformat(checkpoint.at).astimezone(UTC)
    assert (
        "Anchors outside the database: ✓ Anchored and consistent: the audit chain and every anchored task's log "
        f"still reach the heads vouched for by 1 signed checkpoint (the newest of {newest:%Y-%m-%d %H:%M:%S} UTC, "
        f"in {anchoring})."
    ) in text
    run = VerificationRun.objects.get()
    assert run.anchor_verdict["state"] == "consistent" and run.sound
    assert AuditEvent.objects.filter(action="logs_verified").latest("seq").details["anchors"] == "consistent"


def test_a_chain_cut_and_rolled_back_is_shown_as_a_cut_beside_the_chains_verdict(
    verify_now: Callable[[], str],
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    clock: ControllableClock,
    anchoring: Path,
) -> None:
    task = a_task(make_task, agent_lease)
    before = dict(zip(ROW, Task.objects.filter(pk=task.pk).values_list(*ROW).get(), strict=True))
    task_quarantine(task_id=task.pk, expected_version=task.version, reason="what the tamperer hides")
    audited(4, clock)
    checkpoint = anchor_heads()
    assert checkpoint is not None
    cut_the_audit_chain(keep=checkpoint.audit_seq - 2)
    cut_the_task_log(task, before)  # both read consistently inside the database now

    text = verify_now()
    assert "Problems found." in text
    line = anchors_line(text)
    assert line.startswith(
        "Anchors outside the database: ✕ A cut found in 2 chains: the head a signed checkpoint outside the database "
        "vouched for is no longer there"
    ), line
    assert (
        f"the audit chain ends at #{checkpoint.audit_seq - 2} but the checkpoint of {checkpoint.at} anchored it at "
        f"#{checkpoint.audit_seq}: its tail was cut and its head rolled back"
    ) in line
    assert f"task {task.pk}: the log was cut: the checkpoint of {checkpoint.at} anchored version" in line
    run = VerificationRun.objects.get()
    assert run.anchor_verdict["state"] == "cut" and run.anchor_verdict["found"] == 2 and not run.sound


def test_without_a_key_the_page_says_not_anchored_and_what_that_misses(
    verify_now: Callable[[], str], make_task: Callable[..., Task], settings: SettingsWrapper
) -> None:
    settings.RECKON_ANCHOR_KEY = ""
    make_task()
    text = verify_now()
    assert "Both logs verified." in text
    assert (
        "Anchors outside the database: ? Not anchored: RECKON_ANCHOR_KEY is not set, so a chain whose tail was cut "
        "and whose head was rolled back would not be found."
    ) in text
    assert VerificationRun.objects.get().anchor_verdict["state"] == "not_anchored"


def test_a_run_recorded_before_the_verdict_was_kept_says_so(verify_now: Callable[[], str]) -> None:
    verify_now()
    VerificationRun.objects.update(anchor_verdict={})
    browser = Client()
    browser.force_login(person("carol", "auditor").user)
    text = card(browser.get(reverse("audit-log")).content.decode())
    assert "Anchors outside the database: not checked by this run" in text
