"""./dev manage bench_http — the step over HTTP (gunicorn + reckon_client) beside the step in process, same run
(harness/bench_http.py)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from harness.bench_http import HttpBenchConfig, format_http_report, run_http_bench


class Command(BaseCommand):
    help = "Steps/s in process and over HTTP (a real gunicorn, the Python client), in one throw-away database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=20, help="tasks per agent and run (default 20)")
        parser.add_argument("--nodes", type=int, default=10, help="nodes per task, a chain (default 10)")
        parser.add_argument("--agents", default="1,4", help="agent thread counts over HTTP (default 1,4)")
        parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes (default 2)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            agents = tuple(int(part) for part in options["agents"].split(",") if part.strip())
            config = HttpBenchConfig(
                tasks=options["tasks"], nodes=options["nodes"], agents=agents, web_workers=options["web_workers"]
            )
            report = run_http_bench(config, log=lambda line: self.stderr.write(line))
        except (ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(format_http_report(report))
