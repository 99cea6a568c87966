"""The partition scenarios (harness/partitions.py) in the test suite: ``manage.py verify_matrix --partitions`` at a
reduced size, as its own process (a throw-away database of its own), with real Celery workers, the real simulator
and the fault proxy between some workers and the database or the remote.

The full run (50 tasks per scenario) is ``./dev manage verify_matrix --partitions``. PostgreSQL only: a worker cut off
from its database needs a database reached over TCP.
"""

import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from harness.partitions import PARTITIONS
from tests.simulator_fixture import ROOT

TASKS = int(os.environ.get("RECKON_PARTITION_TASKS", "3"))

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason=f"a worker partitioned from its database needs PostgreSQL over TCP (database vendor is {connection.vendor})",
)


def test_every_partition_scenario_ends_clean() -> None:
    """Each task is cut off once, at a different step (prepare, the copies, verify, the irreversible switch): no
    duplicate side effect, no skipped step, no unknown left; every late write of a worker cut off from the database
    refused by the fencing; a worker whose connections were all reset reconnects by itself (never restarted); every
    call whose answer was lost reconciled by op key after the heal."""
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


def test_an_unknown_partition_scenario_is_refused_by_name() -> None:
    with pytest.raises(CommandError, match="unknown partition scenario"):
        call_command("verify_matrix", "--partitions", "--scenario", "kill_before_call")
