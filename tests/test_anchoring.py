"""Chain heads anchored outside the database (audit/anchors.py, tasks/engine/anchors.py).

Someone with database superuser rights gets past the append-only triggers, cuts a chain's tail and rolls its head
back so that the database reads consistently: verify_audit and verify_log, which read only the database, pass. A
signed checkpoint written before the cut, in a file the database does not hold, still names the head the chain once
reached: with it, both find the cut and name the anchored seq. A checkpoint line altered is reported and not trusted;
without a key nothing pretends to be anchored; the file is private and only appended to.
"""

import base64
import json
import os
import stat
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from pytest_django.fixtures import Settings as SettingsWrapper

from audit.anchors import AnchorKeyInvalid, anchor_heads, read_anchors
from audit.jobs import anchor_heads_job
from audit.models import AuditEvent, AuditHead
from audit.principals import Principal
from audit.services import audit_append, verify_audit
from leases.clock import ControllableClock
from tasks.core.outcomes import Committed
from tasks.engine.anchors import OVERLAP, anchored_task_heads, find_anchor_problem
from tasks.engine.verification import find_problems, task_quarantine
from tasks.models import Event, Task
from tests.conftest import _SQLITE_TRIGGER_CREATES, as_a_tamperer, chain_plan
from tests.steps import record, send

KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.fixture
def anchoring(settings: SettingsWrapper, tmp_path: Path) -> Path:
    """Anchoring on: a key the database never sees, and the anchor file in a directory of the test's own."""
    settings.RECKON_ANCHOR_KEY = KEY
    settings.RECKON_ANCHOR_PATH = str(tmp_path / "anchors" / "heads.log")
    return Path(settings.RECKON_ANCHOR_PATH)


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def triggers_back() -> None:
    """The tamperer puts the append-only triggers back (SQLite drops them; PostgreSQL only skipped them for the
    transaction), so the database reads as untouched."""
    if connection.vendor == "sqlite":
        for sql in _SQLITE_TRIGGER_CREATES:
            raw(sql)


def audited(count: int, clock: ControllableClock) -> None:
    for n in range(count):
        with transaction.atomic():
            audit_append(actor=Principal.system("test"), action=f"did_{n}", at=clock.now(), reason="for the chain")


def cut_the_audit_chain(keep: int) -> None:
    """Delete every audit event past ``keep`` and roll the head back to it: consistent inside the database."""
    kept = AuditEvent.objects.get(seq=keep)
    as_a_tamperer()
    raw("DELETE FROM audit_auditevent WHERE seq > %s", [keep])
    raw("UPDATE audit_audithead SET seq = %s, digest = %s WHERE id = 1", [keep, kept.digest])
    triggers_back()


# --- the audit chain ---------------------------------------------------------------------------------------------


def test_a_cut_audit_chain_with_its_head_rolled_back_is_found_only_with_an_anchor(
    db: None, clock: ControllableClock, settings: SettingsWrapper, anchoring: Path
) -> None:
    audited(5, clock)
    checkpoint = anchor_heads()
    assert checkpoint is not None and checkpoint.audit_seq == AuditHead.objects.get().seq
    anchored_seq = checkpoint.audit_seq

    cut_the_audit_chain(keep=anchored_seq - 2)

    settings.RECKON_ANCHOR_KEY = ""  # what verify_audit sees without anchoring: a sound chain
    unanchored = verify_audit()
    assert unanchored.problem is None, unanchored.problem
    assert unanchored.anchor.startswith("not anchored")
    call_command("verify_audit", stdout=StringIO())  # passes: nothing in the database shows the cut

    settings.RECKON_ANCHOR_KEY = KEY
    verdict = verify_audit()
    assert verdict.broken_at == anchored_seq
    assert verdict.problem is not None and f"#{anchored_seq}" in verdict.problem and "cut" in verdict.problem
    out = StringIO()
    with pytest.raises(CommandError, match=f"#{anchored_seq}"):
        call_command("verify_audit", stdout=out)
    assert "FIRST BROKEN LINK" in out.getvalue() and f"anchored it at #{anchored_seq}" in out.getvalue()


def test_an_audit_chain_rewritten_below_its_anchor_is_found(
    db: None, clock: ControllableClock, anchoring: Path
) -> None:
    """Cut, then appended again to the same length: the seq is back, its digest is not the anchored one."""
    audited(3, clock)
    checkpoint = anchor_heads()
    assert checkpoint is not None
    cut_the_audit_chain(keep=checkpoint.audit_seq - 1)
    audited(1, clock)  # a new, well-chained event at the anchored seq
    assert AuditHead.objects.get().seq == checkpoint.audit_seq

    verdict = verify_audit()
    assert verdict.broken_at == checkpoint.audit_seq
    assert verdict.problem is not None and "not the one the checkpoint" in verdict.problem


def test_an_intact_chain_passes_against_its_anchor_and_later_appends(
    db: None, clock: ControllableClock, anchoring: Path
) -> None:
    audited(2, clock)
    anchor_heads()
    audited(3, clock)  # the chain moves on past the checkpoint: that is no problem
    verdict = verify_audit()
    assert verdict.problem is None, verdict.problem
    assert verdict.anchor.startswith("anchored: 1 checkpoint")


# --- a task's event log ------------------------------------------------------------------------------------------


def a_task(make_task: Callable[..., Task], agent_lease: Callable[..., Any]) -> Task:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    return Task.objects.get(pk=task.pk)


def cut_the_task_log(task: Task, back_to: dict[str, Any]) -> None:
    """Delete the task's events past ``back_to['version']`` and put its row back as it was then: the log, the
    projection and the row's head agree again."""
    as_a_tamperer()
    raw("DELETE FROM tasks_event WHERE task_id = %s AND seq > %s", [task.pk, back_to["version"]])
    assignments = ", ".join(f"{name} = %s" for name in back_to)
    raw(f"UPDATE tasks_task SET {assignments} WHERE id = %s", [*back_to.values(), task.pk])  # noqa: S608
    triggers_back()


ROW = ("version", "log_head", "status", "status_reason", "status_detail", "updated_at")


def test_a_cut_task_log_with_its_row_rolled_back_is_found_only_with_an_anchor(
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Any],
    clock: ControllableClock,
    settings: SettingsWrapper,
    anchoring: Path,
) -> None:
    task = a_task(make_task, agent_lease)
    before = dict(zip(ROW, Task.objects.filter(pk=task.pk).values_list(*ROW).get(), strict=True))
    # The change the tamperer will hide: the task was quarantined.
    task_quarantine(task_id=task.pk, expected_version=task.version, reason="an operator saw something wrong")
    anchored_version = Task.objects.get(pk=task.pk).version
    checkpoint = anchor_heads()
    assert checkpoint is not None
    assert anchored_task_heads()[task.pk][0] == anchored_version

    cut_the_task_log(task, before)
    task = Task.objects.get(pk=task.pk)
    assert task.version == anchored_version - 1 and task.status != "quarantined"

    settings.RECKON_ANCHOR_KEY = ""
    assert find_problems(task) == []  # inside the database, the record reads consistently
    call_command("verify_log", "--dry-run", stdout=StringIO())  # and verify_log passes

    settings.RECKON_ANCHOR_KEY = KEY
    problem = find_anchor_problem(task)
    assert problem is not None and f"anchored version {anchored_version}" in problem and "cut" in problem
    out = StringIO()
    with pytest.raises(CommandError, match="failed verification"):
        call_command("verify_log", "--dry-run", stdout=out)
    assert f"task {task.pk}: the log was cut" in out.getvalue()
    assert Event.objects.filter(task=task).count() == anchored_version - 1  # dry run: nothing appended

    with pytest.raises(CommandError, match="failed verification"):
        call_command("verify_log", stdout=StringIO())
    stopped = Task.objects.get(pk=task.pk)
    assert stopped.status == "quarantined" and "the log was cut" in stopped.status_detail
    # The quarantine's own event now sits at the anchored seq, with another digest: still found, the task stays put.
    assert find_anchor_problem(stopped) is not None


def test_only_the_tasks_that_moved_are_in_the_next_checkpoint_and_earlier_anchors_still_hold(
    make_task: Callable[..., Task], agent_lease: Callable[..., Any], clock: ControllableClock, anchoring: Path
) -> None:
    first, second = a_task(make_task, agent_lease), make_task(chain_plan("x"))
    clock.advance(OVERLAP * 2)  # the tasks last moved well before the first checkpoint
    anchor_heads()
    task_quarantine(task_id=second.pk, expected_version=second.version, reason="moved after the first checkpoint")
    newest = anchor_heads()
    assert newest is not None
    assert set(newest.sections["tasks"]["heads"]) == {str(second.pk)}
    heads = anchored_task_heads()
    assert heads[first.pk][0] == first.version and heads[second.pk][0] == second.version + 1

    before = dict(zip(ROW, Task.objects.filter(pk=first.pk).values_list(*ROW).get(), strict=True))
    before["version"], before["log_head"] = (
        first.version - 1,
        Event.objects.get(task=first, seq=first.version - 1).digest,
    )
    cut_the_task_log(first, before)  # the first checkpoint alone anchored this task
    problem = find_anchor_problem(Task.objects.get(pk=first.pk))
    assert problem is not None and f"anchored version {first.version}" in problem


def test_a_task_anchored_then_deleted_is_reported(
    make_task: Callable[..., Task], clock: ControllableClock, anchoring: Path
) -> None:
    task = make_task(chain_plan("a"))
    anchor_heads()
    as_a_tamperer()
    for table in ("tasks_event", "tasks_node", "tasks_planrevision"):
        raw(f"DELETE FROM {table} WHERE task_id = %s", [task.pk])  # noqa: S608
    raw("DELETE FROM tasks_task WHERE id = %s", [task.pk])
    triggers_back()
    out = StringIO()
    with pytest.raises(CommandError, match="no longer in the database"):
        call_command("verify_log", "--dry-run", stdout=out)
    assert f"task {task.pk}: anchored at version" in out.getvalue()


# --- the anchor file ---------------------------------------------------------------------------------------------


def test_an_altered_checkpoint_line_is_reported_and_not_trusted(
    make_task: Callable[..., Task], clock: ControllableClock, anchoring: Path
) -> None:
    make_task(chain_plan("a"))
    audited(2, clock)
    anchor_heads()
    body = json.loads(anchoring.read_text())
    body["audit"]["seq"] = 999  # claims a head the chain never reached
    anchoring.write_text(json.dumps(body) + "\n")

    anchors = read_anchors()
    assert anchors.checkpoints == () and len(anchors.bad_lines) == 1
    verdict = verify_audit()
    assert verdict.problem is not None and "line 1 fails its HMAC" in verdict.problem
    assert "#999" not in verdict.problem  # the altered claim is not believed
    out = StringIO()
    with pytest.raises(CommandError, match="anchor file are not trusted"):
        call_command("verify_log", "--dry-run", stdout=out)
    assert "fails its HMAC" in out.getvalue()


def test_a_line_taken_out_of_the_middle_is_reported(db: None, clock: ControllableClock, anchoring: Path) -> None:
    for _ in range(3):
        audited(1, clock)
        anchor_heads()
    lines = anchoring.read_text().splitlines(keepends=True)
    anchoring.write_text(lines[0] + lines[2])
    verdict = verify_audit()
    assert verdict.problem is not None and "does not follow the line before it" in verdict.problem


def test_a_checkpoint_after_a_line_not_ours_follows_the_last_good_one(
    db: None, clock: ControllableClock, anchoring: Path
) -> None:
    first = anchor_heads()
    with anchoring.open("a") as file:
        file.write('{"at": "forged", "audit": {"seq": 1}, "mac": "00"}\n')
    anchor_heads()
    anchors = read_anchors()
    assert first is not None and [c.line for c in anchors.checkpoints] == [1, 3]
    assert json.loads(anchoring.read_text().splitlines()[2])["prev"] == first.mac
    assert len(anchors.bad_lines) == 1 and "line 2 fails its HMAC" in anchors.bad_lines[0]  # only the forged line


def test_without_a_key_nothing_is_anchored_and_verify_says_so(
    db: None, clock: ControllableClock, settings: SettingsWrapper, tmp_path: Path
) -> None:
    settings.RECKON_ANCHOR_KEY = ""
    settings.RECKON_ANCHOR_PATH = str(tmp_path / "heads.log")
    audited(1, clock)
    assert anchor_heads() is None and anchor_heads_job() is None
    assert not (tmp_path / "heads.log").exists()
    verdict = verify_audit()
    assert verdict.problem is None and verdict.anchor.startswith("not anchored (RECKON_ANCHOR_KEY is not set)")
    for command in ("verify_audit", "verify_log", "anchor_heads"):
        out = StringIO()
        call_command(command, stdout=out)
        assert "not anchored" in out.getvalue()


def test_a_key_that_is_not_32_bytes_is_refused(db: None, settings: SettingsWrapper, tmp_path: Path) -> None:
    settings.RECKON_ANCHOR_PATH = str(tmp_path / "heads.log")
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        settings.RECKON_ANCHOR_KEY = bad
        with pytest.raises(AnchorKeyInvalid):
            anchor_heads()
    assert not (tmp_path / "heads.log").exists()


def test_the_anchor_file_is_private_and_only_appended_to(db: None, clock: ControllableClock, anchoring: Path) -> None:
    old_umask = os.umask(0)  # even a permissive umask leaves the file private
    try:
        audited(1, clock)
        anchor_heads_job()
        first = anchoring.read_bytes()
        audited(1, clock)
        out = StringIO()
        call_command("anchor_heads", stdout=out)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(anchoring.stat().st_mode) == 0o600
    assert stat.S_IMODE(anchoring.parent.stat().st_mode) == 0o700
    after = anchoring.read_bytes()
    assert after.startswith(first) and after.count(b"\n") == 2  # appended, the first line untouched
    checkpoints = read_anchors().checkpoints
    assert [c.audit_seq for c in checkpoints] == [1, 2]
    assert json.loads(after.splitlines()[1])["prev"] == checkpoints[0].mac  # each line names the one before it
    assert "checkpoint appended to" in out.getvalue() and "audit #2" in out.getvalue()


def test_the_beat_writes_a_checkpoint_periodically(settings: SettingsWrapper) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["anchor-heads"]
    assert entry["task"] == "audit.anchor_heads" and entry["schedule"] == settings.RECKON_ANCHOR_SECONDS
    assert anchor_heads_job.name == "audit.anchor_heads"


def test_the_worker_finds_the_job_where_celery_looks_for_jobs(db: None) -> None:
    from console.celery import app

    app.loader.import_default_modules()
    assert "audit.anchor_heads" in app.tasks
