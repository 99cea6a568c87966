from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from retention.services import DEFAULT_SWEEP_LIMIT, retention_sweep


class Command(BaseCommand):
    help = "Purge expired retained objects, finish purges a crash left half-way, remove orphan files."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--limit", type=int, default=DEFAULT_SWEEP_LIMIT, help="objects (and orphans) per pass")
        parser.add_argument("--all", action="store_true", help="repeat until nothing is left to do")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be positive")
        while True:
            report = retention_sweep(limit=options["limit"])
            self.stdout.write(str(report))
            if report.failed:
                raise CommandError(f"{len(report.failed)} file(s) could not be removed; they are retried next sweep")
            if not (options["all"] and report.more):
                return
