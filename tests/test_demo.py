"""The demo is alive: ``load_demo`` lands a task in every state through the services and the simulator's faults
(read back from the database, and each record still verifies), it can run again, and ``./dev demo`` starts every
process and stops every one of them on Ctrl-C."""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db.models import Q

from api.tokens import api_token_authenticate
from audit.models import AuditEvent
from harness.ports import free_port
from reference.demo_agent import DEMO_KINDS
from reference.demo_logins import DEMO_LOGINS
from reference.demo_states import CREATED_BY, SCENARIOS
from reference.migrate_project import KIND
from tasks.access.permissions import roles_of
from tasks.core.lifecycle import OperationStatus, PauseReason, TaskStatus
from tasks.engine.verification import task_verify_log
from tasks.models import Event, Operation, Task
from tasks.querysets import Attention
from tasks.reads.queries import attention_reasons
from tasks.reads.takeover import takeover_package
from tests.simulator_fixture import ROOT, Simulator

EVERY_STATUS = {
    TaskStatus.RUNNING,
    TaskStatus.OBSERVING,
    TaskStatus.BACKING_OFF,
    TaskStatus.PAUSED,
    TaskStatus.STOPPING,
    TaskStatus.STOPPED_PENDING,
    TaskStatus.COMPLETED,
    TaskStatus.QUARANTINED,
}


def load(simulator: Simulator) -> str:
    out = StringIO()
    call_command("load_demo", store_url=simulator.url, wait=5, stdout=out)
    return out.getvalue()


def demo_tasks() -> list[Task]:
    return list(Task.objects.filter(created_by=CREATED_BY).with_attention().order_by("pk"))


def printed_passwords(output: str) -> dict[str, str]:
    return dict(re.findall(r"^  (\w+)\s+(\S+)\s{3}", output, flags=re.MULTILINE))


def by_project(project: str) -> Task:
    return Task.objects.get(created_by=CREATED_BY, project=project)


# ------------------------------------------------------------------------------------------------ load_demo


def test_load_demo_lands_a_task_in_every_state_each_waiting_for_what_it_says(db: None, simulator: Simulator) -> None:
    """One load (it takes seconds), every promise of it checked from the database."""
    output = load(simulator)
    tasks = demo_tasks()
    assert len(tasks) == len(SCENARIOS)
    assert {t.status for t in tasks} >= EVERY_STATUS
    assert {t.status_reason for t in tasks} >= {PauseReason.PERMISSION_REVOKED, PauseReason.BUDGET_EXHAUSTED}
    reasons = {reason for t in tasks for reason in attention_reasons(t)}
    assert reasons >= {
        Attention.AWAITING_APPROVAL,
        Attention.BUDGET_EXHAUSTED,
        Attention.STOPPED_PENDING,
        Attention.QUARANTINED,
        Attention.UNKNOWN_OPERATION,
        Attention.PAUSED,
    }
    what_each_state_waits_for_is_in_the_database()
    the_reconciled_task_went_through_unknown_and_settled_by_op_key(simulator)
    the_budget_exhausted_task_has_a_takeover_package()
    every_record_verifies_except_the_tampered_one(tasks)
    the_logins_have_their_roles_through_audited_services(printed_passwords(output))


def what_each_state_waits_for_is_in_the_database() -> None:
    observing, stopping = by_project("dogwood"), by_project("larch")
    assert observing.status == TaskStatus.OBSERVING
    assert Operation.objects.filter(task=observing, status=OperationStatus.ACCEPTED).count() == 1
    assert stopping.status == TaskStatus.STOPPING and stopping.cancel_requested_at is not None
    assert Operation.objects.filter(task=stopping, status=OperationStatus.ACCEPTED).count() == 1, "awaited"
    pending = by_project("maple")
    assert pending.status == TaskStatus.STOPPED_PENDING
    unsettled = Operation.objects.filter(task=pending).exclude(status=OperationStatus.COMMITTED)
    assert list(unsettled.values_list("status", flat=True)) == [OperationStatus.UNKNOWN]
    backing_off = by_project("elm")
    assert backing_off.status == TaskStatus.BACKING_OFF
    assert backing_off.nodes.get(key="copy-batch-1").not_before is not None
    awaiting = Task.objects.with_attention().get(pk=by_project("birch").pk)
    assert attention_reasons(awaiting) == [Attention.AWAITING_APPROVAL]


def the_reconciled_task_went_through_unknown_and_settled_by_op_key(simulator: Simulator) -> None:
    task = by_project("fir")
    unknown = Event.objects.get(task=task, type="operation_unknown")
    (op_key,) = unknown.payload["operations"]
    assert Operation.objects.get(op_key=op_key).status == OperationStatus.COMMITTED
    assert task.status == TaskStatus.COMPLETED
    assert simulator.stats()["by_op_key"][op_key] == 1, "reconciled by asking, never sent twice"


def the_budget_exhausted_task_has_a_takeover_package() -> None:
    task = by_project("juniper")
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, PauseReason.BUDGET_EXHAUSTED)
    package = takeover_package(task.pk)
    assert {"node": "copy-batch-1", "status": "pending", "last_error": "dependency_unavailable"} in package["pending"]
    assert package["completed"] and package["suggested_checks"]


def every_record_verifies_except_the_tampered_one(tasks: list[Task]) -> None:
    problems = {t.project: task_verify_log(task_id=t.pk, quarantine=False).problem for t in tasks}
    assert problems.pop("nutmeg")
    assert problems == dict.fromkeys(problems)
    assert "receipt" in by_project("nutmeg").status_detail


def the_logins_have_their_roles_through_audited_services(passwords: dict[str, str]) -> None:
    assert set(passwords) == set(DEMO_LOGINS)
    for username, role in DEMO_LOGINS.items():
        user = authenticate(username=username, password=passwords[username])
        assert user is not None, username
        assert roles_of(user) == ({role} if role else set())
    granted = AuditEvent.objects.filter(action="role_granted").values_list("details__user", flat=True)
    assert sorted(granted) == sorted(u for u, role in DEMO_LOGINS.items() if role)
    # The operator operates the worker's kind and every kind the demo's agents drive over the API.
    kinds = AuditEvent.objects.filter(action="permission_granted", details__user="operator")
    assert sorted(kinds.values_list("details__kind", flat=True)) == sorted([KIND, *DEMO_KINDS])
    assert not any(p in User.objects.values_list("password", flat=True) for p in passwords.values())


def printed_token(output: str) -> str:
    lines = output.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith("Demo agent token"))
    return lines[index + 1].strip()


def test_load_demo_runs_again_without_duplicates_and_gives_fresh_passwords(db: None, simulator: Simulator) -> None:
    loaded = load(simulator)
    first = printed_passwords(loaded)
    not_tokens = ~Q(action__startswith="api_token_")
    before = (Task.objects.count(), User.objects.count(), AuditEvent.objects.filter(not_tokens).count())
    again = load(simulator)
    assert "already loaded" in again
    assert (Task.objects.count(), User.objects.count(), AuditEvent.objects.filter(not_tokens).count()) == before
    # The demo agent's token is new on every load; the one printed before no longer works.
    old, new = printed_token(loaded), printed_token(again)
    assert old != new
    assert api_token_authenticate(old) is None and api_token_authenticate(new) is not None
    second = printed_passwords(again)
    for username in DEMO_LOGINS:
        assert first[username] != second[username]
        assert authenticate(username=username, password=first[username]) is None
        assert authenticate(username=username, password=second[username]) is not None


def test_load_demo_without_the_simulator_says_so_and_loads_no_task(db: None) -> None:
    port = free_port()  # nothing listens on it
    with pytest.raises(CommandError, match="does not answer"):
        call_command("load_demo", store_url=f"http://127.0.0.1:{port}", wait=0.5, stdout=StringIO())
    assert not Task.objects.exists()


# ------------------------------------------------------------------------------------------------ the simulator


def test_a_fault_aimed_at_one_op_key_spares_the_others(simulator: Simulator) -> None:
    simulator.fault("permission_revoked", times=5, match="rk-aaaa-")
    request = {"action": "prepare_target", "params": {"project": "p"}}
    assert simulator.call("POST", "/ops/rk-bbbb-1", request)[0] == 200
    assert simulator.call("POST", "/ops/rk-aaaa-1", request)[0] == 403
    assert simulator.call("GET", "/ops/rk-bbbb-1")[0] == 200


def test_drop_leaves_a_query_unanswered(simulator: Simulator) -> None:
    simulator.call("POST", "/ops/rk-aaaa-1", {"action": "prepare_target", "params": {"project": "p"}})
    simulator.fault("drop", times=1, match="rk-aaaa-1")
    with pytest.raises((ConnectionError, OSError, urllib.error.URLError)):
        simulator.call("GET", "/ops/rk-aaaa-1")
    assert simulator.call("GET", "/ops/rk-aaaa-1")[0] == 200


# ------------------------------------------------------------------------------------------------ ./dev


def test_dev_prints_its_help_without_installing_anything(tmp_path: Path) -> None:
    """Only ``sed`` on PATH: no python, no uv. Asking for help must not need them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sed").symlink_to(shutil.which("sed") or "/bin/sed")
    (bin_dir / "dirname").symlink_to(shutil.which("dirname") or "/usr/bin/dirname")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    for args, code in (([], 0), (["help"], 0), (["nonsense"], 2)):
        done = subprocess.run(  # noqa: S603
            ["/bin/bash", str(ROOT / "dev"), *args], env=env, capture_output=True, text=True, timeout=10, check=False
        )
        assert done.returncode == code, done.stderr
        assert "./dev demo" in done.stdout + done.stderr
        assert "installing" not in done.stderr


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):  # noqa: S310
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@pytest.mark.demo
def test_dev_demo_serves_and_ctrl_c_stops_every_process_it_started(tmp_path: Path) -> None:
    """``./dev demo`` in its own session (as a terminal would run it): once the URL answers, SIGINT to the script
    alone — its children never see it — must stop every process of the session."""
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "RECKON_DEMO_POSTGRES")
    }
    env |= {
        "RECKON_DATA_DIR": str(tmp_path / "demo"),
        "RECKON_DEMO_PORT": str(port),
        "RECKON_DEMO_STORE_PORT": str(free_port()),
    }
    log = (tmp_path / "demo.log").open("w")
    demo = subprocess.Popen(  # noqa: S603
        [str(ROOT / "dev"), "demo"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # As a terminal starts it: SIGINT not ignored, even when this test runs in a background job (whose shell
        # ignores SIGINT, and a non-interactive bash cannot trap a signal ignored at its start).
        preexec_fn=_interruptible,
    )
    try:
        deadline, url = time.monotonic() + 90, f"http://127.0.0.1:{port}/"  # a loaded CI machine: ~15 s idle
        while f"Reckon demo on {url}" not in (tmp_path / "demo.log").read_text():
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "demo.log").read_text()
            time.sleep(0.2)
        assert _answers(f"{url}login/")
        started = _session_members(demo.pid)
        assert len(started) >= 5, "the script, the simulator, the worker (and its pool), beat and the web"
        os.kill(demo.pid, signal.SIGINT)
        assert demo.wait(20) == 130
        time.sleep(0.3)
        assert _session_members(demo.pid) == []
        assert not _answers(f"{url}login/")
        output = (tmp_path / "demo.log").read_text()
        assert "Demo logins" in output and "quarantined" in output
        # No PostgreSQL named: the table migration is skipped, and the demo says how to see it.
        assert "Skipped: the embedded default has no PostgreSQL" in output and "RECKON_DEMO_POSTGRES=" in output
    finally:
        # Every member of the session: the demo puts each process it starts in its own group, so killing the
        # script's group would leave them running past a failed test.
        for pid in _session_members(demo.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()
