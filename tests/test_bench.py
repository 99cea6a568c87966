"""The bench at tiny sizes, on the backend the suite runs on: every figure there, positive and consistent.

No timing thresholds: only what holds by construction (the raw limit's 2 commits and 3 statements per step) and
what the counts must satisfy whatever the speed.
"""

import io
import json
import statistics

from django.core.management import call_command
from django.db import connection

from harness.bench import FIGURES, PG_ONLY

TASKS, NODES, WORKERS = 1, 2, (1, 2)
# Figures that may be 0 in a short window: commits elsewhere on the server, full-page images.
ZERO_OK = {"other_db_commits", "wal_fpi_per_step"}


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
    if postgres:
        assert {"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"} <= set(env["settings"])
        assert report["durable"]
    assert report["config"] == {"tasks_per_worker": TASKS, "nodes": NODES, "rounds": 3, "workers": list(WORKERS)}
    assert len(report["runs"]) == 3 * len(WORKERS) * 2  # rounds x worker counts x (raw, reckon)

    for mode in ("raw", "reckon"):
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

            raw = report["figures"]["raw"][str(workers)]
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
            else:
                assert cell["statements_per_step"] > 0
                assert cell["commits_per_step"] >= 1
                assert cell["rows_written_per_step"] >= 2  # at least an intent and a receipt
                if postgres:
                    # Every commit the client made is a server commit; read-only autocommit reads add more.
                    assert cell["xact_commit_per_step"] >= cell["commits_per_step"] - 1e-9
                    assert cell["round_trips_per_step"] > cell["statements_per_step"]

        ratio = report["ratios"][str(workers)]
        runs = {m: [r for r in report["runs"] if r["mode"] == m and r["workers"] == workers] for m in ("raw", "reckon")}
        paired = [k["steps_per_s"] / w["steps_per_s"] for w, k in zip(runs["raw"], runs["reckon"], strict=True)]
        assert ratio["steps_per_s"] == statistics.median(paired)
        reckon = report["figures"]["reckon"][str(workers)]
        assert ratio["cpu_ms_per_step"] == reckon["cpu_ms_per_step"] / raw["cpu_ms_per_step"]

    goals = {g["goal"]: g for g in report["goals"]}
    assert len(goals) == 3
    for goal in goals.values():
        if goal["met"] is not None:
            assert goal["value"] > 0 and isinstance(goal["met"], bool)
    assert any(g["met"] is None and "8 workers" in g["goal"] for g in goals.values())  # not measured here

    table = out.getvalue()
    assert "steps/s" in table and "x raw" in table and "goal:" in table
    profile = tmp_path / "bench.profile.txt"
    assert report["profile"] == str(profile)
    assert "run_steps" in profile.read_text()
