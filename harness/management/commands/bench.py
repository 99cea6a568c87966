"""./dev manage bench — Reckon's step protocol against the raw limit of its two commits (harness/bench.py)."""

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from harness.bench import BenchConfig, BenchError, format_report, run_bench


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
        "Steps/s, client CPU, statements, commits, WAL and rows per step of the step protocol against the raw limit "
        "of its two commits, with 1 and 8 workers, on the configured backend (in a throw-away database)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
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

    def handle(self, *args: Any, **options: Any) -> None:
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
