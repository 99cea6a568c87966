"""The bench at tiny sizes, on the backend the suite runs on: every figure there, positive and consistent; the
recovery bench's invariants (every worker killed mid-run, every task done, no duplicate side effect) and the scan
bench's (every pending task found, the finished history written with its constraints, plans that use indexes).

No timing thresholds: only what holds by construction (the raw limit's 2 commits and 3 statements per step) and
what the counts must satisfy whatever the speed.
"""

import io
import json
import statistics

import pytest
from django.core.management import call_command
from django.db import connection

from harness.bench import (
    FIGURES,
    MODES,
    PG_ONLY,
    PHASES,
    PhaseTimer,
    machine_cpu_seconds,
    processes_cpu_seconds,
)

TASKS, NODES, WORKERS = 1, 2, (1, 2)
RECOVERY_TASKS = 8
SCAN_PENDING, SCAN_SMALL, SCAN_LARGE = 20, 200, 2_000
# Figures that may be 0 in a short window: commits elsewhere on the server, full-page images, CPU read from /proc
# (counted in ticks of 10 ms: a run of a few steps may fall within one).
ZERO_OK = {"other_db_commits", "wal_fpi_per_step", "server_cpu_ms_per_step", "machine_cpu_ms_per_step"}


def test_bench_reports_every_figure_positive_and_consistent(tmp_path, django_db_blocker):
    path = tmp_path / "bench.json"
    out, err = io.StringIO(), io.StringIO()
    with django_db_blocker.unblock():
        call_command(
            "bench",
            tasks=TASKS,
            nodes=NODES,
            rounds=3,
            workers=",".join(map(str, WORKERS)),
            json=str(path),
            profile=True,
            stdout=out,
            stderr=err,
        )
    report = json.loads(path.read_text())
    postgres = connection.vendor == "postgresql"
    env = report["environment"]
    assert env["vendor"] == connection.vendor
    assert env["python"] and env["django"] and env["database"]
    assert env["python_reference_us"] > 0
    waiting = report["one_worker_waiting"]
    one = report["figures"]["reckon"]["1"]
    assert waiting["reckon_wait_ms_per_step"] == pytest.approx(1000 / one["steps_per_s"] - one["cpu_ms_per_step"])
    assert waiting["raw_ms_per_step"] == pytest.approx(1000 / report["figures"]["raw"]["1"]["steps_per_s"])
    if postgres:  # every step waits for its round trips (SQLite's in-process writes may wait for nothing at all)
        assert waiting["reckon_wait_ms_per_step"] > 0
    if waiting["reckon_wait_ms_per_step"] > 0:
        # Reckon's step takes its waiting plus its CPU: without the CPU the ratio of the medians could only be higher.
        assert waiting["ratio_with_no_client_cpu"] > waiting["raw_ms_per_step"] / (1000 / one["steps_per_s"])
    else:  # no waiting measured (a CPU-bound step, timer noise): no bound to state
        assert waiting["ratio_with_no_client_cpu"] is None
    if postgres:
        assert {"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"} <= set(env["settings"])
        assert report["durable"]
    assert report["config"] == {"tasks_per_worker": TASKS, "nodes": NODES, "rounds": 3, "workers": list(WORKERS)}
    assert len(report["runs"]) == 3 * len(WORKERS) * 3  # rounds x worker counts x (raw, shared, reckon)
    # The machine's speed is timed before each round; a run's CPU is also read in that round's reference loops.
    for round_ in (1, 2, 3):
        in_round = [run for run in report["runs"] if run["round"] == round_]
        assert len({run["reference_us"] for run in in_round}) == 1 and in_round[0]["reference_us"] > 0
        for run in in_round:
            assert run["cpu_reference_loops_per_step"] == pytest.approx(
                1000 * run["cpu_ms_per_step"] / run["reference_us"]
            )
    per_round = {run["round"]: run["reference_us"] for run in report["runs"]}
    assert report["reference_us_rounds"] == statistics.median(per_round.values())  # every round runs alike
    assert f"{2000 / report['reference_us_rounds']:.1f} loops" in out.getvalue()

    for mode in ("raw", "shared", "reckon"):
        for workers in WORKERS:
            cell = report["figures"][mode][str(workers)]
            assert set(cell) == set(FIGURES)
            for name in FIGURES:
                if not postgres and name in PG_ONLY:
                    assert cell[name] is None, name
                elif name in ZERO_OK:
                    assert cell[name] >= 0, (mode, workers, name)
                else:
                    assert cell[name] > 0, (mode, workers, name)
            assert cell["steps"] == TASKS * NODES * workers
            assert cell["steps_per_s"] > 0 and cell["wall_s"] > 0

            if mode == "raw":  # by construction
                assert cell["commits_per_step"] == cell["transactions_per_step"] == 2
                assert cell["statements_per_step"] == 3
                assert cell["loop_iterations_per_step"] == 1
                if postgres:
                    assert cell["round_trips_per_step"] == 7
                    assert cell["xact_commit_per_step"] >= 2  # server-side; more only if autovacuum committed
                    assert cell["rows_written_per_step"] >= 3
                else:
                    assert cell["rows_written_per_step"] == 3  # 2 inserts, 1 update
            elif mode == "shared":  # by construction: the same rows, n + 1 commits for n steps
                assert cell["commits_per_step"] == cell["transactions_per_step"] == (NODES + 1) / NODES
                assert cell["statements_per_step"] == 3
                if postgres:
                    assert cell["round_trips_per_step"] == (3 * NODES + 2 * (NODES + 1)) / NODES
                else:
                    assert cell["rows_written_per_step"] == 3
            else:
                assert cell["statements_per_step"] > 0
                assert cell["commits_per_step"] >= 1
                assert cell["rows_written_per_step"] >= 2  # at least an intent and a receipt
                if postgres:
                    # Every commit the client made is a server commit; read-only autocommit reads add more.
                    assert cell["xact_commit_per_step"] >= cell["commits_per_step"] - 1e-9
                    assert cell["round_trips_per_step"] > cell["statements_per_step"]

        runs = {m: [r for r in report["runs"] if r["mode"] == m and r["workers"] == workers] for m in MODES}
        reckon = report["figures"]["reckon"][str(workers)]
        for base, key in (("raw", "ratios"), ("shared", "ratios_shared")):
            ratio = report[key][str(workers)]
            paired = [k["steps_per_s"] / w["steps_per_s"] for w, k in zip(runs[base], runs["reckon"], strict=True)]
            assert ratio["steps_per_s"] == statistics.median(paired)
            limit = report["figures"][base][str(workers)]
            assert ratio["cpu_ms_per_step"] == reckon["cpu_ms_per_step"] / limit["cpu_ms_per_step"]

    goals = {g["goal"]: g for g in report["goals"]}
    assert len(goals) == 3
    for goal in goals.values():
        if goal["met"] is not None:
            assert goal["value"] > 0 and isinstance(goal["met"], bool)
    assert any(g["met"] is None and "8 workers" in g["goal"] for g in goals.values())  # not measured here

    table = out.getvalue()
    assert "steps/s" in table and "x raw" in table and "x shared" in table and "goal:" in table
    assert "all cpu" in table and ("srv cpu" in table) == postgres
    profile = tmp_path / "bench.profile.txt"
    assert report["profile"] == str(profile)
    assert "run_steps" in profile.read_text()
    timed = profile.read_text().split("CPU per step by function", 1)[1]
    for module, qualname, _importers in PHASES:  # every phase timed and shown
        assert f"{module}.{qualname} " in timed


def test_recovery_bench_kills_every_worker_mid_run_and_counts_no_duplicate(tmp_path, django_db_blocker):
    """``bench recovery`` small, the crashed phase alone: every worker SIGKILLed once half the side effects are
    counted, fresh workers and the scans (on their own queue) finish the work; the simulator counts every effect
    once. No time is asserted."""
    out = io.StringIO()
    with django_db_blocker.unblock():
        call_command(
            "bench",
            "recovery",
            recovery_tasks=RECOVERY_TASKS,
            recovery_workers=2,
            crashed_only=True,
            json=str(tmp_path / "bench.json"),
            stdout=out,
            stderr=io.StringIO(),
        )
    report = json.loads((tmp_path / "bench-recovery.json").read_text())
    assert report["vendor"] == connection.vendor
    [crashed] = report["phases"]
    expected = RECOVERY_TASKS * report["effects_per_task"]
    assert crashed["name"] == "crashed" and crashed["ok"], crashed["problems"]
    assert crashed["tasks"] == RECOVERY_TASKS
    assert crashed["effects_expected"] == crashed["effects_counted"] == expected
    assert crashed["duplicates"] == crashed["unknowns"] == crashed["skipped"] == crashed["wrong"] == 0
    assert crashed["kills"] == 2  # every worker, by SIGKILL
    assert 0 < crashed["killed_at_effects"] < expected  # mid-run: effects before the kill and after it
    assert report["ratio"] is None
    assert "duplicate side effects counted by the simulator: 0" in out.getvalue()


@pytest.fixture(scope="module")
def scan_report(tmp_path_factory, django_db_blocker):
    """``bench scan`` small, once for the module: its report and its printed table."""
    path, out = tmp_path_factory.mktemp("scan") / "bench.json", io.StringIO()
    with django_db_blocker.unblock():
        call_command(
            "bench",
            "scan",
            pending=SCAN_PENDING,
            small=SCAN_SMALL,
            large=SCAN_LARGE,
            repeat=1,
            json=str(path),
            stdout=out,
            stderr=io.StringIO(),
        )
    return json.loads(path.with_name("bench-scan.json").read_text()), out.getvalue()


def test_scan_bench_finds_every_pending_task_beside_the_finished_history(scan_report):
    """The finished rows are written by SQL with every constraint holding; the scan finds exactly the pending tasks
    beside few and more finished ones; the plans are printed and use the scan's indexes."""
    report, out = scan_report
    assert report["small"]["found"] == report["large"]["found"] == SCAN_PENDING
    assert report["rows"]["tasks_task"] == SCAN_PENDING + SCAN_LARGE
    for table in ("leases_lease", "tasks_taskwakeup", "tasks_tempresource", "tasks_operation"):
        assert report["rows"][table] == SCAN_LARGE, table
    plan = report["large"]["plans_no_seqscan"]["tasks_needing_work"]  # SQLite: the plan as it is
    assert "temp_resource_status_idx" in plan, plan
    if connection.vendor == "postgresql":  # with seq scans off, one is planned only where no index can serve
        assert "Index" in plan and "Seq Scan" not in plan, plan
    assert "plan of tasks_needing_work" in out and "ratio:" in out


def test_the_scan_reads_no_history_table_whole(scan_report):
    """With the planner free of sequential scans (PostgreSQL; SQLite's plan as it is), no node of the scan's plan
    reads a table that grows with finished tasks whole: not by a Seq Scan, not by an index walk that filters them
    all out (as the primary key's did under the OR with an EXISTS that workable() had before its UNION)."""
    report, _ = scan_report
    assert report["large"]["full_scans"] == [], report["large"]["plans"]


def _phase_functions() -> dict[str, object]:
    import importlib

    found = {}
    for module, qualname, importers in PHASES:
        owner: object = importlib.import_module(module)
        for part in qualname.split("."):
            owner = getattr(owner, part)
        found[f"{module}.{qualname}"] = owner
        for importer in importers:
            found[f"{importer}.{qualname}"] = getattr(importlib.import_module(importer), qualname)
    return found


def test_the_phase_timer_times_each_phase_and_puts_every_function_back() -> None:
    """The profile's per-function table wraps the step path's functions (and the names other modules imported them
    under) only within its block: afterwards every one is the original again."""
    before = _phase_functions()
    with PhaseTimer() as phases:
        during = _phase_functions()
        assert all(during[name] is not before[name] for name in before)  # each one timed, wherever it is called from
        assert during["tasks.engine.runner.record_outcome"] is during["tasks.engine.protocol.record_outcome"]
    assert _phase_functions() == before
    assert set(phases.calls) == {f"{module}.{qualname}" for module, qualname, _ in PHASES}
    assert "tasks.engine.protocol.record_outcome" in phases.table(1)


def test_the_cpu_readings_grow_with_the_cpu_spent() -> None:
    """The bench's machine and server CPU columns read /proc: the machine's busy time and a set of processes' own
    time both grow by at least most of what this process spends (the suite runs on Linux)."""
    import os
    import time

    # A name of this process's own for the time of the test: others of the same name (the other test processes of
    # a parallel run) may end between two readings and take their time out of the sum.
    with open("/proc/self/comm") as comm:
        name = comm.read().strip()
    mine = f"reckon-{os.getpid()}"[:15]
    with open("/proc/self/comm", "w") as comm:
        comm.write(mine)
    try:
        machine, me, other = (
            machine_cpu_seconds(),
            processes_cpu_seconds(lambda n: n == mine),
            processes_cpu_seconds(lambda n: n == "no such process name"),
        )
        assert machine is not None and me is not None and other == 0
        started = time.process_time()
        while time.process_time() - started < 0.3:
            sum(range(1000))
        spent = time.process_time() - started
        machine_after, me_after = machine_cpu_seconds(), processes_cpu_seconds(lambda n: n == mine)
    finally:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    assert machine_after is not None and me_after is not None
    assert me_after - me >= spent - 0.05  # ticks of 10 ms
    assert machine_after - machine >= spent - 0.05


def test_the_ab_bench_takes_the_variants_in_turns_and_switches_each_off_again(tmp_path, django_db_blocker):
    """``bench ab``: every variant measured in every batch, in turns (A, B, A, B, …), each switched on only for its
    own batches and off after them; figures per step for each, and each against the first (the baseline)."""
    from tests import ab_variants

    ab_variants.CALLS.clear()
    out = io.StringIO()
    with django_db_blocker.unblock():
        call_command(
            "bench",
            "ab",
            variants="tests.ab_variants",
            tasks=1,
            nodes=2,
            batches=3,
            json=str(tmp_path / "b.json"),
            stdout=out,
            stderr=io.StringIO(),
        )
    report = json.loads((tmp_path / "bench-ab.json").read_text())
    assert report["order"] == ["baseline", "recorded"] * 3
    assert ab_variants.CALLS == ["baseline", "on", "off"] * 4  # a warm-up, then 3 batches
    for name in ("baseline", "recorded"):
        assert len(report["batches"][name]) == 3
        cell = report["figures"][name]
        assert cell["cpu_ms_per_step"] > 0 and cell["wall_ms_per_step"] >= cell["cpu_ms_per_step"] * 0.5
        assert cell["cpu_ms_min"] <= cell["cpu_ms_per_step"]
        if connection.vendor == "postgresql":
            assert cell["server_cpu_ms_per_step"] is not None and cell["server_cpu_ms_per_step"] >= 0
        else:
            assert cell["server_cpu_ms_per_step"] is None
    assert report["against_baseline"]["baseline"]["cpu_ms_per_step"] == 1
    assert "recorded" in out.getvalue() and "x baseline" in out.getvalue()


def test_the_ab_bench_refuses_a_module_without_variants() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="VARIANTS"):
        call_command("bench", "ab", variants="tests.test_bench", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="--variants"):
        call_command("bench", "ab", stdout=io.StringIO(), stderr=io.StringIO())
