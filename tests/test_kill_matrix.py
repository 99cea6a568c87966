"""The kill matrix in the test suite: ``manage.py verify_matrix`` at a reduced size, as its own process (it makes
and drops a database of its own), with real Celery workers, the real simulator and real SIGKILLs.

The full run (50 tasks per scenario) is ``./dev manage verify_matrix``. Run by hand, this test runs every scenario;
``RECKON_MATRIX_SCENARIOS`` (names, comma-separated, spaces as underscores) narrows it: CI runs each scenario once —
the ones about many workers and true concurrency on PostgreSQL with Redis, the others on SQLite with the filesystem
broker (.ci/run) — so that the suite fits its time on two cores.
"""

import json
import os
import subprocess
import sys

from harness.killmatrix import choose
from tests.simulator_fixture import ROOT

TASKS = int(os.environ.get("RECKON_MATRIX_TASKS", "2"))
CHOSEN = [name.strip() for name in os.environ.get("RECKON_MATRIX_SCENARIOS", "").split(",") if name.strip()]


def test_every_scenario_of_the_kill_matrix_ends_clean() -> None:
    """The scenarios in two verify_matrix processes at once, each with a database, workers, queues and store of its
    own (a recovery scan reads its whole database, so two scenarios never share one): the matrix mostly waits on
    leases to lapse and workers to start, and two halves overlap those waits."""
    names = [scenario.key for scenario in choose(CHOSEN)]  # an unknown name fails here
    halves = [names[0::2], names[1::2]]
    runs = [
        subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "verify_matrix", "--tasks", str(TASKS), "--timeout", "120"]
            + [arg for name in half for arg in ("--scenario", name)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for half in halves
        if half
    ]
    outputs = [run.communicate(timeout=1200) for run in runs]
    stdout = "\n".join(out for out, _ in outputs)
    print(stdout)  # the tables, for the CI log (pytest -s / -rA)
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out[-3000:] + err[-3000:]
    rows = [line for line in stdout.splitlines() if line.endswith(("ok", "FAIL"))]
    assert len(rows) == len(names), stdout
    assert all(line.endswith(" ok") for line in rows), stdout
    # The kill scenarios killed a worker once per task at their point, and fresh workers finished the work.
    for line in rows:
        if line.startswith("kill "):
            assert int(line.split()[-3]) >= TASKS, line


def test_the_matrix_fails_when_the_store_breaks_its_contract() -> None:
    """Not a check that cannot fail: a store that silently stops deduping by op key (and cannot be queried) turns
    a worker killed after its call into a task paused as unprovable — reported, and the command exits non-zero."""
    env = os.environ | {"RECKON_MATRIX_SABOTAGE": json.dumps({"mode": "no_idempotency"})}
    run = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "verify_matrix",
            "--tasks",
            "1",
            "--scenario",
            "kill_after_call",
            "--timeout",
            "120",  # an upper bound only: the run ends as soon as the task pauses
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0
    assert "FAIL" in run.stdout and "unprovable" in run.stderr, run.stdout + run.stderr
    bad = subprocess.run(
        [sys.executable, "manage.py", "verify_matrix", "--scenario", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0 and "unknown scenario" in bad.stderr
