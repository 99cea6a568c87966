"""``bench peers`` without the peers installed: the refusal naming the command that installs them (before any other
part runs), the thread runner the peers' processes use (with a stand-in peer), and the report — medians of the rounds,
Reckon against the fastest and the leanest peer, the durability warnings — from given runs. The measuring itself
needs the uv group peers and PostgreSQL: ``RECKON_UV_GROUPS=peers ./dev manage bench peers``."""

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from harness import bench_peers
from harness.bench_peers import (
    RUN_COMMAND,
    PeersConfig,
    PeersError,
    _pg_url,
    _run_threads,
    format_peers,
    missing_peers,
    one_process_ceilings,
    peers_report,
)

ABSENT = "reckon-no-such-peer-distribution"


def test_missing_peers_names_only_the_absent_distributions(monkeypatch):
    monkeypatch.setattr(bench_peers, "PEER_DISTRIBUTIONS", ("django", ABSENT, "psycopg"))
    assert missing_peers() == [ABSENT]


def test_the_part_refuses_without_the_group_naming_the_command(monkeypatch):
    monkeypatch.setattr(bench_peers, "PEER_DISTRIBUTIONS", (ABSENT,))
    with pytest.raises(CommandError) as refused:
        call_command("bench", "peers")
    message = str(refused.value)
    assert ABSENT in message
    assert RUN_COMMAND in message
    # With another part first, the refusal still comes before it: size would need the database, which this test
    # may not use (pytest-django would raise a RuntimeError, not this CommandError).
    with pytest.raises(CommandError, match="optional uv dependency group 'peers'"):
        call_command("bench", "size", "peers")


def test_run_peers_refuses_without_the_group_too(monkeypatch):
    monkeypatch.setattr(bench_peers, "PEER_DISTRIBUTIONS", (ABSENT,))
    with pytest.raises(PeersError, match=ABSENT):
        bench_peers.run_peers(PeersConfig())


@pytest.mark.parametrize(
    "config",
    [
        PeersConfig(tasks=0),
        PeersConfig(nodes=0),
        PeersConfig(rounds=0),
        PeersConfig(workers=()),
        PeersConfig(nodes=101),
    ],
)
def test_the_config_refuses_what_cannot_be_measured(config):
    with pytest.raises(ValueError):
        config.check()


def test_the_dbos_url_quotes_and_carries_the_parameters():
    params = {"dbname": "bench x", "host": "127.0.0.1", "port": 5432, "user": "postgres", "password": "p@ss/w"}
    assert _pg_url(params) == "postgresql://postgres:p%40ss%2Fw@127.0.0.1:5432/bench%20x"
    socket = {"dbname": "b", "host": "/var/run/postgresql", "user": "me", "sslmode": "disable"}
    assert _pg_url(socket) == "postgresql://me@/b?sslmode=disable&host=%2Fvar%2Frun%2Fpostgresql"


class StandInPeer:
    """Records the workflows it is asked to run; ``fail`` makes one of them raise."""

    nodes = 3

    def __init__(self, fail: str = "") -> None:
        self.ran: list[tuple[int, str]] = []
        self.fail = fail

    def run(self, worker: int, label: str) -> None:
        if label == self.fail:
            raise RuntimeError(f"stand-in failure at {label}")
        self.ran.append((worker, label))

    def flush_stats(self, workers: int) -> int:
        return 2 * workers

    def session(self) -> dict[str, str]:
        return {"synchronous_commit": "on"}

    def close(self) -> None:
        pass


def test_the_thread_runner_runs_every_workflow_once_and_reports_the_run():
    peer = StandInPeer()
    ran_before_start: list[int] = []
    result = _run_threads(
        peer, workers=4, tasks=5, label="b1", before_start=lambda: ran_before_start.append(len(peer.ran))
    )
    assert ran_before_start == [0]  # called once, every worker still waiting
    assert sorted(peer.ran) == sorted((w, f"b1.{w}.{t}") for w in range(4) for t in range(5))
    assert result["steps"] == 4 * 5 * StandInPeer.nodes
    assert result["flushes"] == 8
    assert result["started"] <= result["ended"]
    assert result["cpu"] >= 0


def test_the_thread_runner_raises_a_worker_failure():
    with pytest.raises(PeersError, match=re.escape("stand-in failure at b2.1.2")):
        _run_threads(StandInPeer(fail="b2.1.2"), workers=2, tasks=3, label="b2")


# steps/s and CPU ms per step of each (system, workers) in rounds 1, 2, 3.
ROUNDS = {
    ("reckon", 1): ([100, 120, 110], [1.0, 1.2, 1.1]),
    ("dbos", 1): ([50, 60, 55], [4.0, 5.0, 6.0]),
    ("langgraph", 1): ([70, 90, 80], [2.0, 3.0, 2.5]),
    ("reckon", 8): ([400, 380, 420], [1.5, 1.4, 1.6]),
    ("dbos", 8): ([200, 210, 190], [5.0, 5.5, 4.5]),
    ("langgraph", 8): ([150, 160, 170], [1.0, 1.2, 1.1]),
}


def given_runs() -> list[dict[str, Any]]:
    runs = []
    for (system, workers), (speeds, cpus) in ROUNDS.items():
        for r, (speed, cpu) in enumerate(zip(speeds, cpus, strict=True)):
            steps = workers * 20 * 10
            runs.append(
                {
                    "system": system,
                    "workers": workers,
                    "round": r + 1,
                    "steps": steps,
                    "wall_s": steps / speed,
                    "steps_per_s": speed,
                    "cpu_ms_per_step": cpu,
                    "xact_commit_per_step": 2.0,
                    "rows_written_per_step": 3.0,
                    "wal_syncs_per_step": 1.0,
                    "wal_bytes_per_step": 500.0,
                    "other_db_commits": 0,
                    "create_ms_per_step": 0.5 if system == "reckon" else None,
                }
            )
    return runs


def environment(server_sync: str = "on", dbos_sync: str = "on") -> dict[str, Any]:
    return {
        "python": "3.12.1",
        "platform": "Linux",
        "cpus": 2,
        "database": "PostgreSQL 15",
        "settings": {"fsync": "on", "synchronous_commit": server_sync},
        "sessions": {s: {"synchronous_commit": dbos_sync if s == "dbos" else "on"} for s in bench_peers.SYSTEMS},
        "versions": {"dbos": "3.4.0", "langgraph": "1.2.24", "langgraph-checkpoint-postgres": "3.2.0"},
    }


def test_the_report_takes_medians_and_sets_reckon_against_the_best_peer():
    committed = {"dbos": {"workflows": 3}, "langgraph": {"workflows": 3}}
    report = peers_report(PeersConfig(), environment(), given_runs(), datetime.now(UTC), committed)
    assert report["figures"]["reckon"]["1"]["steps_per_s"] == 110
    assert report["figures"]["dbos"]["8"]["cpu_ms_per_step"] == 5.0
    one, eight = report["ratios"]["1"], report["ratios"]["8"]
    assert (one["steps_per_s_peer"], one["cpu_ms_per_step_peer"]) == ("langgraph", "langgraph")
    assert one["steps_per_s"] == pytest.approx(110 / 80)
    assert one["cpu_ms_per_step"] == pytest.approx(1.1 / 2.5)
    assert (eight["steps_per_s_peer"], eight["cpu_ms_per_step_peer"]) == ("dbos", "langgraph")
    assert eight["steps_per_s"] == pytest.approx(400 / 200)
    assert eight["cpu_ms_per_step"] == pytest.approx(1.5 / 1.1)
    assert report["durable"] is True
    assert report["warnings"] == []
    assert report["run_as"] == {"reckon": "process", "dbos": "thread", "langgraph": "thread"}

    text = format_peers(report)
    assert "1.38 x the steps/s of langgraph, 0.44 x the CPU per step of langgraph" in text
    assert "2.00 x the steps/s of dbos, 1.36 x the CPU per step of langgraph" in text
    assert "8 processes" in text and "8 threads" in text and "1 process " in text
    assert "server fsync=on, synchronous_commit=on" in text
    assert "reckon on, dbos on, langgraph on" in text
    assert report["figures"]["dbos"]["1"]["create_ms_per_step"] is None
    assert "0.500 ms per step (1 worker), 0.500 ms per step (8 workers) of wall time" in text
    # With 8 workers each peer's threads share one process: one core allows 1000 / its CPU ms per step.
    assert one_process_ceilings(report) == pytest.approx({"dbos": 1000 / 5.0, "langgraph": 1000 / 1.1})
    assert "dbos 200, langgraph 909 steps/s at 8 workers" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["1", "dbos"])
    assert row.split()[4:6] == ["55.0", "5.000"]


def test_the_report_flags_a_nondurable_session_and_too_few_rounds():
    runs = [r for r in given_runs() if r["round"] == 1]
    config = PeersConfig(rounds=1)
    report = peers_report(config, environment(dbos_sync="off"), runs, datetime.now(UTC), {})
    assert report["durable"] is False
    assert any("dbos's connections run with synchronous_commit=off" in w for w in report["warnings"])
    assert any("only 1 round(s)" in w for w in report["warnings"])
    assert report["figures"]["langgraph"]["8"]["steps_per_s"] == 150
    assert "!!! only 1 round(s)" in format_peers(report)


def test_the_loops_are_the_floor_reckon_and_the_best_peer_are_set_against():
    loops = {
        ("raw", 1): [300, 320, 310],
        ("shared", 1): [400, 440, 420],
        ("raw", 8): [900] * 3,
        ("shared", 8): [800] * 3,
    }
    runs = given_runs()
    for (system, workers), speeds in loops.items():
        for r, speed in enumerate(speeds):
            runs.append(runs[0] | {"system": system, "workers": workers, "round": r + 1, "steps_per_s": speed})
    report = peers_report(PeersConfig(), environment(), runs, datetime.now(UTC), {})
    one = report["ratios"]["1"]
    assert one["steps_per_s_peer"] == "langgraph"  # a loop is never the best peer, though faster than every one
    assert one["reckon_over_shared"] == pytest.approx(110 / 420)
    assert one["peer_over_shared"] == pytest.approx(80 / 420)
    assert report["run_as"]["shared"] == "process"
    text = format_peers(report)
    assert "against the shared loop: Reckon 0.26 x, langgraph 0.19 x — twice that peer would be 0.38 x" in text
    assert (
        "against the shared loop: Reckon 0.50 x, dbos 0.25 x — twice that peer would be 0.50 x, three times 0.75 x"
        in (text)
    )
