"""The partition scenarios (harness/partitions.py) in the test suite: ``manage.py verify_matrix --partitions`` at a
reduced size, as its own process (a throw-away database of its own), with real Celery workers, the real simulator
and the fault proxy between some workers and the database or the remote.

The full run (50 tasks per scenario) is ``./dev manage verify_matrix --partitions``. PostgreSQL only: a worker cut off
from its database needs a database reached over TCP.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from harness.partitions import (
    KOMBU_RESTORE_RACE,
    PARTITIONS,
    Lane,
    NeedsFaketime,
    PartitionRow,
    Tally,
    _clock_offset,
    _judge_worker_exits,
    _late_lines,
    faketime_library,
    skewed,
)
from observability.logs import STATE_LOGGER
from tests.simulator_fixture import ROOT

TASKS = int(os.environ.get("RECKON_PARTITION_TASKS", "3"))

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason=f"a worker partitioned from its database needs PostgreSQL over TCP (database vendor is {connection.vendor})",
)


@postgres_only
def test_every_partition_scenario_ends_clean() -> None:
    """Each task is cut off once, at a different step (prepare, the copies, verify, the irreversible switch): no
    duplicate side effect, no skipped step, no unknown left; every late write of a worker cut off from the database
    refused by the fencing; a worker whose connections were all reset reconnects by itself (never restarted); every
    call whose answer was lost reconciled by op key after the heal; workers whose clocks are minutes apart take over
    from each other on the database clock; a broker restarted with its queues lost, the scan makes them good."""
    run = subprocess.run(  # noqa: S603
        [
            sys.executable,
            "manage.py",
            "verify_matrix",
            "--partitions",
            "--tasks",
            str(TASKS),
            "--lanes",
            "3",
            "--timeout",
            "150",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(run.stdout)  # the table, for the CI log
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.endswith(("ok", "FAIL"))]
    assert len(rows) == len(PARTITIONS), run.stdout
    assert all(line.endswith(" ok") for line in rows), run.stdout
    assert f"{TASKS} tasks cut off after a dispatch commit" in run.stdout, run.stdout
    assert f"{TASKS} late writes refused by the fencing, 0 committed late" in run.stdout, run.stdout
    assert f"{TASKS} unknown operations reconciled by op key after the heal" in run.stdout, run.stdout
    assert f"{TASKS} tasks whose worker lost every database connection after a dispatch commit" in run.stdout
    assert "taken over after a SIGKILL by a worker whose clock differs from the dead one's by minutes" in run.stdout
    # A worker that exits on kombu's restore race is started again as a supervisor would; the row judges that only
    # such exits (explained by the worker's own log) are forgiven (test_the_broker_row_forgives_only_…).
    assert re.search(
        r"\(lost with it\); (no worker restarted|\d+ worker\(s\) exited on kombu's restore race and were "
        r"started again)",
        run.stdout,
    ), run.stdout


@postgres_only
def test_the_failover_row_ends_clean() -> None:
    """A primary and its synchronous standby of the run's own (initdb, pg_basebackup on free ports): the primary
    stopped in immediate mode mid-run, the standby promoted, the workers reconnecting through the multi-host URL by
    themselves — no duplicate, no skip, every task completed, no commit lost, every log verified, one lease holder at
    a time. The full row: ``./dev manage verify_matrix --partitions --scenario failover --tasks 50``."""
    run = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "verify_matrix", "--partitions", "--scenario", "failover", "--tasks", str(TASKS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"^failover +\d+ .* ok$", run.stdout, re.MULTILINE), run.stdout
    assert "primary stopped (immediate)" in run.stdout and "standby promoted" in run.stdout, run.stdout
    assert "0 lost commits, every log verified, one lease holder at a time" in run.stdout, run.stdout


def test_a_version_that_went_back_is_a_lost_commit() -> None:
    from harness.failover import lost_commits

    assert lost_commits({1: 5, 2: 7}, {1: 5, 2: 9}) == []
    assert lost_commits({1: 5, 2: 7}, {1: 4, 2: 9}) == ["task 1: version 5 before the failover, 4 after"]
    assert lost_commits({3: 2}, {}) == ["task 3: version 2 before the failover, None after"]


def test_a_skewed_process_reads_its_clock_minutes_off_and_its_monotonic_clock_true() -> None:
    """The clock-skew row proves something only if libfaketime takes: each process's wall clock is off by its skew
    (the row checks it for every process it starts, and fails otherwise), its monotonic clock is not (Celery's and
    kombu's timers run on it)."""
    try:
        library = faketime_library()
    except NeedsFaketime:
        if os.environ.get("CI"):
            raise
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    env = skewed(dict(os.environ), "-10m", library)
    assert abs(_clock_offset(env) + 600) < 30
    command = [sys.executable, "-c", "import time; print(time.monotonic())"]
    probe = subprocess.run(command, env=env, capture_output=True, text=True, check=True)  # noqa: S603
    assert abs(float(probe.stdout) - time.monotonic()) < 30


def test_an_unknown_partition_scenario_is_refused_by_name() -> None:
    with pytest.raises(CommandError, match="unknown partition scenario"):
        call_command("verify_matrix", "--partitions", "--scenario", "kill_before_call")


def test_a_row_fails_on_a_late_commit_a_missing_refusal_or_a_partition_that_missed() -> None:
    """Not checks that cannot fail (no processes: the verdict alone). The stale worker's log after the heal: a state
    change it committed is counted as a late commit, a refusal as a refusal; either shortfall fails the row."""
    clean = PartitionRow("db lost mid step", 2, expected=18, counted=18, fired=2, link="database")
    clean.tally.partitioned, clean.tally.refused = 2, 2
    assert clean.ok
    late = dataclasses.replace(clean, tally=dataclasses.replace(clean.tally, late_commits=1))
    assert not late.ok
    unrefused = dataclasses.replace(clean, tally=dataclasses.replace(clean.tally, refused=1))
    assert not unrefused.ok
    missed = dataclasses.replace(clean, fired=1)
    assert not missed.ok


def test_the_stale_workers_log_is_read_from_the_heal_on(tmp_path: Path) -> None:
    log = tmp_path / "lane.log"
    before = json.dumps({"logger": STATE_LOGGER, "message": "intent registered: …", "task_id": 7})
    after = [
        json.dumps({"logger": "tasks.engine.runner", "message": "run stopped: lease_lost", "task_id": 7}),
        # a stale write refused by the version's compare-and-set, read again (then refused by the lease)
        json.dumps({"logger": "tasks.engine.runner", "message": "write refused: version_conflict; …", "task_id": 7}),
        json.dumps({"logger": STATE_LOGGER, "message": "outcome recorded: …", "task_id": 7}),  # a stale write through
        json.dumps({"logger": STATE_LOGGER, "message": "outcome recorded: …", "task_id": 8}),  # another task's
        "not json: celery's banner",
        json.dumps(
            {"logger": "celery.app.trace", "message": "Task tasks.drive_task[x] succeeded in 0.1s", "task_id": 7}
        ),
    ]
    log.write_text(before + "\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("\n".join(after) + "\n")
    lane = Lane(0, proxy=None, queue="q", workers=_NoWorkers(), log=log, task=7, log_offset=offset)  # type: ignore[arg-type]
    assert _late_lines(lane) == (2, 1, True)


class _NoWorkers:
    processes = [type("P", (), {"pid": 1})()]


def test_the_broker_row_forgives_only_the_worker_exits_kombus_restore_race_explains(tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    log.write_text("consumer: Connection to broker lost.\n")
    kept, unexplained, explained = Tally(), Tally(), Tally()

    _judge_worker_exits(kept, [1, 2], [1, 2], log)
    _judge_worker_exits(unexplained, [1, 2], [1, 3], log)
    log.write_text(log.read_text() + f"CRITICAL celery.worker: {KOMBU_RESTORE_RACE}\n")
    _judge_worker_exits(explained, [1, 2], [1, 3], log)

    assert (kept.restarted, kept.problems) == (0, [])
    assert unexplained.restarted == 1 and unexplained.problems == [
        "1 worker(s) had to be started again, 0 of them on kombu's restore race"
    ]
    assert (explained.restarted, explained.problems) == (1, [])
    assert "1 worker(s) exited on kombu's restore race" in explained.line("broker")
