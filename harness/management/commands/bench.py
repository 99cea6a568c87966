"""./dev manage bench — Reckon's step protocol against the raw limit of its two commits (harness/bench.py); ``bench
recovery`` and ``bench scan`` — a crash of every worker, and the recovery scan beside a large history
(harness/bench_recovery.py); ``bench ab --variants MODULE`` — variants of the step path measured batch by batch,
interleaved, in one process (harness/bench_ab.py); ``bench size`` — a step's cost at 10, 1,000 and 10,000 nodes per
task (harness/bench_size.py); ``bench history`` — the hot tables, the scan, the work queue and the task page at 100,000
and 10,000,000 events, the archive step running (harness/bench_history.py); ``bench peers`` — Reckon's step against
DBOS Transact and LangGraph's Postgres checkpointer, side by side (harness/bench_peers.py; the optional uv group
peers)."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from harness.bench import BenchConfig, BenchError, format_report, run_bench
from harness.bench_ab import AbConfig, AbError, format_ab, run_ab
from harness.bench_history import HistoryConfig, format_history, run_history
from harness.bench_peers import PeersConfig, PeersError, format_peers, missing_peers, peers_missing_message, run_peers
from harness.bench_recovery import (
    RecoveryBenchError,
    RecoveryConfig,
    ScanConfig,
    format_recovery,
    format_scan,
    recovery_failures,
    run_recovery,
    run_scan,
)
from harness.bench_size import SizeConfig, format_size, run_size

PARTS = ("steps", "recovery", "scan", "ab", "size", "history", "peers")


def _workers(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError as exc:
        raise CommandError(f"--workers takes worker counts separated by commas, not {text!r}") from exc
    if not counts or min(counts) < 1:
        raise CommandError("--workers needs counts of at least 1")
    return counts


class Command(BaseCommand):
    help = (
        "steps (default): steps/s, client CPU, statements, commits, WAL and rows per step of the step protocol "
        "against the raw limit of its two commits, with 1 and 8 workers. recovery: seconds until every reference "
        "task is done after every worker was SIGKILLed mid-run, against the same work uncrashed (and duplicate side "
        "effects counted by the simulator: the run fails on any). scan: the recovery scan's time with pending tasks "
        "beside few and many finished ones, and its plans. ab: variants of the step path (--variants MODULE), batch "
        "by batch, interleaved, in one process. size: steps/s and CPU per step at 10, 1,000 and 10,000 nodes per "
        "task. history: table sizes, the scan, the work queue and the task page at 100,000 and 10,000,000 events, "
        "the archive step running. peers (PostgreSQL; the uv group peers: RECKON_UV_GROUPS=peers ./dev manage "
        "bench peers): steps/s and client CPU per step of Reckon, DBOS Transact and LangGraph's PostgresSaver "
        "(durability sync), 10-step workflows, with 1 and 8 workers, each in its own database. On the configured "
        "backend, in a throw-away database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("parts", nargs="*", metavar="part", help=f"one or more of {', '.join(PARTS)} (steps)")
        parser.add_argument("--tasks", type=int, default=20, help="tasks per worker and run (default 20)")
        parser.add_argument("--nodes", type=int, default=10, help="nodes per task, a chain (default 10)")
        parser.add_argument("--rounds", type=int, default=3, help="rounds; every figure is their median (default 3)")
        parser.add_argument("--workers", default="1,8", help="worker counts, comma-separated (default 1,8)")
        parser.add_argument("--json", default="", help="where to write the report (default DATA_DIR/bench.json)")
        parser.add_argument(
            "--profile", action="store_true", help="profile the Reckon step path (pyinstrument), beside the JSON"
        )
        parser.add_argument(
            "--allow-nondurable", action="store_true", help="measure even with fsync or synchronous_commit off"
        )
        recovery = parser.add_argument_group("recovery")
        recovery.add_argument("--recovery-tasks", type=int, default=1000, help="tasks per phase (default 1000)")
        recovery.add_argument("--recovery-workers", type=int, default=4, help="Celery solo workers (default 4)")
        recovery.add_argument("--objects", type=int, default=10, help="objects each task copies (default 10)")
        recovery.add_argument(
            "--crashed-only", action="store_true", help="the crashed phase alone: its invariants, no ratio (tests)"
        )
        ab = parser.add_argument_group("ab (uses --tasks per batch and --nodes)")
        ab.add_argument(
            "--variants", default="", help="a module defining VARIANTS = {name: (on, off)}; first: baseline"
        )
        ab.add_argument("--batches", type=int, default=15, help="batches per variant (default 15)")
        size = parser.add_argument_group("size")
        size.add_argument("--sizes", default="10,1000,10000", help="nodes per task (default 10,1000,10000)")
        size.add_argument("--size-steps", type=int, default=2000, help="steps per size and round (default 2000)")
        history = parser.add_argument_group("history")
        history.add_argument("--history-small", type=int, default=100_000, help="events, first (default 100000)")
        history.add_argument("--history-large", type=int, default=10_000_000, help="events, then (default 10000000)")
        history.add_argument("--per-task", type=int, default=100, help="events per finished task (default 100)")
        history.add_argument("--chunk", type=int, default=1000, help="finished tasks per archive run (default 1000)")
        history.add_argument("--live", type=int, default=1000, help="tasks at work (default 1000)")
        scan = parser.add_argument_group("scan")
        scan.add_argument("--pending", type=int, default=1000, help="pending tasks (default 1000)")
        scan.add_argument("--small", type=int, default=1000, help="finished tasks, first (default 1000)")
        scan.add_argument("--large", type=int, default=1_000_000, help="finished tasks, then (default 1000000)")
        scan.add_argument("--repeat", type=int, default=7, help="scans timed at each size; the median (default 7)")

    def handle(self, *args: Any, **options: Any) -> None:
        parts = options["parts"] or ["steps"]
        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise CommandError(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
        if "peers" in parts and (missing := missing_peers()):  # before any other part runs
            raise CommandError(peers_missing_message(missing))
        json_dir = Path(options["json"]).parent if options["json"] else Path(settings.DATA_DIR)
        if "steps" in parts:
            self._steps(options)
        if "recovery" in parts:
            self._recovery(options, json_dir / "bench-recovery.json")
        if "scan" in parts:
            self._scan(options, json_dir / "bench-scan.json")
        if "ab" in parts:
            self._ab(options, json_dir / "bench-ab.json")
        if "size" in parts:
            self._size(options, json_dir / "bench-size.json")
        if "history" in parts:
            self._history(options, json_dir / "bench-history.json")
        if "peers" in parts:
            self._peers(options, json_dir / "bench-peers.json")

    def _history(self, options: dict[str, Any], path: Path) -> None:
        config = HistoryConfig(
            small=options["history_small"],
            large=options["history_large"],
            per_task=options["per_task"],
            chunk=options["chunk"],
            live=options["live"],
        )
        self._part(lambda log: run_history(config, log=log), (ValueError, RuntimeError), format_history, path)

    def _peers(self, options: dict[str, Any], path: Path) -> None:
        config = PeersConfig(
            tasks=options["tasks"],
            nodes=options["nodes"],
            rounds=options["rounds"],
            workers=_workers(options["workers"]),
            allow_nondurable=options["allow_nondurable"],
        )
        self._part(lambda log: run_peers(config, log=log), (PeersError, ValueError), format_peers, path)

    def _size(self, options: dict[str, Any], path: Path) -> None:
        try:
            sizes = tuple(int(part) for part in options["sizes"].split(",") if part.strip())
        except ValueError as exc:
            raise CommandError(f"--sizes takes node counts separated by commas, not {options['sizes']!r}") from exc
        config = SizeConfig(sizes=sizes, steps=options["size_steps"], rounds=options["rounds"])
        self._part(lambda log: run_size(config, log=log), (ValueError,), format_size, path)

    def _ab(self, options: dict[str, Any], path: Path) -> None:
        if not options["variants"]:
            raise CommandError("bench ab needs --variants MODULE (a module defining VARIANTS)")
        config = AbConfig(
            variants=options["variants"], tasks=options["tasks"], nodes=options["nodes"], batches=options["batches"]
        )
        self._part(lambda log: run_ab(config, log=log), (AbError, ValueError), format_ab, path)

    def _recovery(self, options: dict[str, Any], path: Path) -> None:
        config = RecoveryConfig(
            tasks=options["recovery_tasks"],
            workers=options["recovery_workers"],
            objects=options["objects"],
            uncrashed=not options["crashed_only"],
        )
        report = self._part(
            lambda log: run_recovery(config, log=log), (RecoveryBenchError, ValueError), format_recovery, path
        )
        if failures := recovery_failures(report):
            raise CommandError("recovery bench: " + "; ".join(failures))

    def _scan(self, options: dict[str, Any], path: Path) -> None:
        config = ScanConfig(
            pending=options["pending"], small=options["small"], large=options["large"], repeat=options["repeat"]
        )
        self._part(lambda log: run_scan(config, log=log), (RecoveryBenchError, ValueError), format_scan, path)

    def _part(
        self,
        run: Callable[[Callable[[str], None]], dict[str, Any]],
        errors: tuple[type[Exception], ...],
        fmt: Callable[[dict[str, Any]], str],
        path: Path,
    ) -> dict[str, Any]:
        """Run one part (its progress on stderr), write its JSON report to ``path`` and print its table."""
        try:
            report = run(lambda line: self.stderr.write(line))
        except errors as exc:
            raise CommandError(str(exc)) from exc
        _write(path, report)
        self.stdout.write(fmt(report))
        self.stdout.write(f"report: {path}")
        return report

    def _steps(self, options: dict[str, Any]) -> None:
        json_path = Path(options["json"]) if options["json"] else Path(settings.DATA_DIR) / "bench.json"
        config = BenchConfig(
            tasks=options["tasks"],
            nodes=options["nodes"],
            rounds=options["rounds"],
            workers=_workers(options["workers"]),
            json_path=json_path,
            profile=options["profile"],
            allow_nondurable=options["allow_nondurable"],
        )
        try:
            config.check()
            report = run_bench(config, log=lambda line: self.stderr.write(line))
        except (BenchError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(format_report(report))
        self.stdout.write(f"report: {json_path}")


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
