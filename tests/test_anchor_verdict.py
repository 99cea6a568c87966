"""The anchors' verdict (audit.anchors.anchors_verify), what the console's "Verify now" shows beside the chains'
verdict: anchored and consistent, a cut found (a tail cut and a head rolled back, a rewrite, a task deleted — with
the database reading consistently), lines of the anchor file not trusted, or not anchored. Always with a real anchor
file, and cuts made as a database superuser would make them (tests/test_anchoring.py)."""

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from audit.anchors import AnchorVerdict, anchor_heads, anchors_verify, read_anchors
from leases.clock import ControllableClock
from tasks.engine import anchors as task_anchors
from tasks.engine.anchors import find_anchor_problem
from tasks.engine.verification import task_quarantine
from tasks.models import Event, Task
from tests.conftest import as_a_tamperer, chain_plan
from tests.test_anchoring import (
    ROW,
    a_task,
    anchoring,
    audited,
    cut_the_audit_chain,
    cut_the_task_log,
    raw,
    triggers_back,
)

__all__ = ["anchoring"]  # the fixture, used by name

pytestmark = pytest.mark.django_db


def test_without_a_key_the_verdict_is_not_anchored_and_says_what_that_misses(settings: SettingsWrapper) -> None:
    settings.RECKON_ANCHOR_KEY = ""
    verdict = anchors_verify()
    assert verdict.state == "not_anchored" and "RECKON_ANCHOR_KEY is not set" in verdict.summary
    assert "would not be found" in verdict.summary and verdict.findings == ()


def test_with_a_key_and_no_checkpoint_yet_the_verdict_is_not_anchored_yet(anchoring: Path) -> None:
    verdict = anchors_verify()
    assert verdict.state == "not_anchored" and verdict.summary.startswith("Not anchored yet: no checkpoint in")


def test_chains_that_moved_on_past_their_checkpoint_are_anchored_and_consistent(
    make_task: Callable[..., Task], agent_lease: Callable[..., Any], clock: ControllableClock, anchoring: Path
) -> None:
    a_task(make_task, agent_lease)
    audited(2, clock)
    checkpoint = anchor_heads()
    assert checkpoint is not None
    audited(2, clock)  # the chains go on after the checkpoint: no problem
    a_task(make_task, agent_lease)
    verdict = anchors_verify()
    assert verdict.state == "consistent", verdict
    assert verdict.summary.startswith("Anchored and consistent: the audit chain and every anchored task's log")
    newest = datetime.fromisoformat(checkpoint.at).astimezone(UTC)
    assert f"vouched for by 1 signed checkpoint (the newest of {newest:%Y-%m-%d %H:%M:%S} UTC" in verdict.summary


def test_an_audit_chain_cut_and_rolled_back_is_a_cut_naming_the_anchored_seq(
    db: None, clock: ControllableClock, anchoring: Path
) -> None:
    audited(5, clock)
    checkpoint = anchor_heads()
    assert checkpoint is not None
    cut_the_audit_chain(keep=checkpoint.audit_seq - 2)
    verdict = anchors_verify()
    assert verdict.state == "cut" and verdict.summary.startswith("A cut found in 1 chain: the head a signed checkpoint")
    assert verdict.findings == (
        f"the audit chain ends at #{checkpoint.audit_seq - 2} but the checkpoint of {checkpoint.at} anchored it at "
        f"#{checkpoint.audit_seq}: its tail was cut and its head rolled back",
    )


def test_a_task_log_cut_with_its_row_rolled_back_and_a_task_deleted_are_cuts(
    make_task: Callable[..., Task], agent_lease: Callable[..., Any], clock: ControllableClock, anchoring: Path
) -> None:
    task = a_task(make_task, agent_lease)
    doomed = make_task(chain_plan("x"))
    before = dict(zip(ROW, Task.objects.filter(pk=task.pk).values_list(*ROW).get(), strict=True))
    task_quarantine(task_id=task.pk, expected_version=task.version, reason="what the tamperer hides")
    anchor_heads()
    cut_the_task_log(task, before)
    as_a_tamperer()
    for table in ("tasks_event", "tasks_node", "tasks_planrevision"):
        raw(f"DELETE FROM {table} WHERE task_id = %s", [doomed.pk])  # noqa: S608
    raw("DELETE FROM tasks_task WHERE id = %s", [doomed.pk])
    triggers_back()

    verdict = anchors_verify()
    assert verdict.state == "cut" and verdict.found == 2
    cut, gone = verdict.findings
    assert cut == f"task {task.pk}: {find_anchor_problem(Task.objects.get(pk=task.pk))}"
    assert "the log was cut" in cut and f"anchored version {task.version + 1}" in cut
    assert gone.startswith(f"task {doomed.pk}: anchored at version") and "no longer in the database" in gone


def test_an_altered_line_alone_is_untrusted_and_never_believed(
    db: None, clock: ControllableClock, anchoring: Path
) -> None:
    audited(2, clock)
    anchor_heads()
    anchoring.write_text(anchoring.read_text().replace('"seq":2', '"seq":999'))
    verdict = anchors_verify()
    assert verdict.state == "untrusted" and "1 line altered, not ours or taken out" in verdict.summary
    assert verdict.findings == read_anchors().bad_lines and "#999" not in " ".join(verdict.findings)


def test_the_bulk_check_finds_what_the_one_task_check_finds_at_two_queries_per_chunk(
    make_task: Callable[..., Task],
    clock: ControllableClock,
    anchoring: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_assert_num_queries: Any,
) -> None:
    monkeypatch.setattr(task_anchors, "CHUNK", 4)
    tasks = [make_task(chain_plan("a")) for _ in range(10)]
    anchor_heads()
    for task in tasks[2], tasks[7]:  # rolled back one version: the anchored event is gone
        kept = Event.objects.get(task=task, seq=task.version - 1)
        cut_the_task_log(task, {"version": task.version - 1, "log_head": kept.digest})
    anchors = read_anchors()
    with django_assert_num_queries(6):  # 3 chunks, the task rows' versions and the events at the anchored seqs
        found = task_anchors.anchored_tasks_problems(anchors)
    expected = [f"task {t.pk}: {find_anchor_problem(Task.objects.get(pk=t.pk), anchors)}" for t in tasks]
    assert found == [line for line in expected if not line.endswith(": None")] and len(found) == 2


def test_a_verdict_stored_as_json_reads_back_and_anything_else_reads_as_none() -> None:
    verdict = AnchorVerdict("cut", "A cut found: …", ("task 1: the log was cut",), 1)
    assert AnchorVerdict.from_json(verdict.as_json()) == verdict
    stored: Any
    for stored in ({}, None, [], {"state": "fine"}):
        assert AnchorVerdict.from_json(stored) is None
