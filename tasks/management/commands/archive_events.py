from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks.engine.archive import archive_after, archive_ended


class Command(BaseCommand):
    help = (
        "Move the events of tasks that ended (completed, failed, stopped) and have not changed for "
        "RECKON_ARCHIVE_AFTER_SECONDS out of the hot event table into the archive; with anchoring on, only tasks "
        "whose head a checkpoint vouches for. Every read of a log (pages, verify_log, anchors) sees both tables."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--limit", type=int, help="move at most this many tasks")
        parser.add_argument(
            "--after-seconds",
            type=int,
            help="tasks unchanged this long (default RECKON_ARCHIVE_AFTER_SECONDS: "
            f"{archive_after().total_seconds():.0f})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        limit, after = options["limit"], options["after_seconds"]
        if limit is not None and limit < 1:
            raise CommandError("--limit must be at least 1")
        if after is not None and after < 0:
            raise CommandError("--after-seconds must not be negative")
        run = archive_ended(limit=limit, after=None if after is None else timedelta(seconds=after))
        self.stdout.write(f"archive_events: {run.sentence()}")
