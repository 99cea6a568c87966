"""manage.py verify_matrix — the kill matrix (harness/killmatrix.py) on a throw-away database of its own."""

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from harness import failover, killmatrix, partitions


class Command(BaseCommand):
    help = (
        "SIGKILL real worker processes at every named failpoint (and run the other failure scenarios) against the "
        "simulator; print scenario, tasks, side effects expected vs counted, duplicates, unknowns left, skipped "
        "steps and wrong final states; exit non-zero on any failure. Runs on a throw-away database of the "
        "configured kind (SQLite file or PostgreSQL database), dropped afterwards."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=50, help="tasks per scenario (default 50)")
        parser.add_argument(
            "--scenario",
            action="append",
            default=[],
            help="run only this scenario (repeatable): " + ", ".join(s.key for s in killmatrix.SCENARIOS),
        )
        parser.add_argument(
            "--partitions",
            action="store_true",
            help="run the partition scenarios (harness/partitions.py; --scenario then names one of "
            + ", ".join(p.name.replace(" ", "_") for p in partitions.PARTITIONS)
            + "; or db_restarted, only when named: it restarts the server it runs on, "
            + f"whose data directory {partitions.PGDATA_ENV} names) instead of the kill matrix",
        )
        parser.add_argument(
            "--lanes", type=int, default=3, help="with --partitions: workers behind a fault proxy at once (default 3)"
        )
        parser.add_argument("--timeout", type=float, default=0, help="seconds per scenario (default 90 + 3 per task)")
        parser.add_argument(
            "--objects",
            type=int,
            default=killmatrix.OBJECTS,
            help=f"kill matrix: objects each task migrates in batches of {killmatrix.MAX_BATCH} (default "
            f"{killmatrix.OBJECTS}; 100000: tasks of 10,003 nodes)",
        )
        parser.add_argument("--here", action="store_true", help="use the configured database as it is (internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["partitions"]:
                chosen = partitions.choose(options["scenario"])
            else:
                scenarios = killmatrix.choose(options["scenario"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["tasks"] < 1:
            raise CommandError("--tasks must be at least 1")
        if options["objects"] < 1:
            raise CommandError("--objects must be at least 1")
        if not options["here"]:
            self._in_throwaway_database(sys.argv[1:])
            return
        call_command("migrate", verbosity=0, interactive=False)
        tasks = options["tasks"]
        timeout = options["timeout"] or 90 + 3 * tasks
        broker = settings.CELERY_BROKER_URL.split("://")[0]
        if options["partitions"]:
            if options["lanes"] < 1:
                raise CommandError("--lanes must be at least 1")
            # Rows with lanes take --lanes; rows without (direct workers only) keep none.
            chosen = [dataclasses.replace(p, lanes=options["lanes"]) if p.lanes else p for p in chosen]
            self._partitions(chosen, tasks, timeout, broker)
            return
        self.stdout.write(
            f"kill matrix: {len(scenarios)} scenarios x {tasks} tasks, {connection.vendor}, broker {broker}"
        )
        self.stdout.write(killmatrix.HEADER)
        started = time.monotonic()
        rows = [
            killmatrix.run_scenario(s, tasks, timeout=timeout, log=self.stdout.write, objects=options["objects"])
            for s in scenarios
        ]
        for row in rows:
            for problem in row.problems[:10]:
                self.stderr.write(f"  {row.scenario}: {problem}")
        failed = [row.scenario for row in rows if not row.ok]
        self.stdout.write(
            f"{len(rows) - len(failed)}/{len(rows)} scenarios clean in {time.monotonic() - started:.0f} s"
        )
        if failed:
            raise CommandError(f"kill matrix failed: {', '.join(failed)}")

    def _partitions(self, chosen: list[partitions.Partition], tasks: int, timeout: float, broker: str) -> None:
        self.stdout.write(f"partitions: {len(chosen)} scenarios x {tasks} tasks, {connection.vendor}, broker {broker}")
        self.stdout.write(killmatrix.HEADER)
        started = time.monotonic()
        try:
            rows = [partitions.run_partition(p, tasks, timeout=timeout, log=self.stdout.write) for p in chosen]
        except (
            partitions.NeedsPostgres,
            partitions.NeedsFaketime,
            partitions.NeedsRedis,
            failover.NeedsPostgresBinaries,
        ) as exc:
            raise CommandError(str(exc)) from exc
        for row in rows:
            for problem in row.problems[:10]:
                self.stderr.write(f"  {row.scenario}: {problem}")
        failed = [row.scenario for row in rows if not row.ok]
        self.stdout.write(
            f"{len(rows) - len(failed)}/{len(rows)} scenarios clean in {time.monotonic() - started:.0f} s"
        )
        if failed:
            raise CommandError(f"partitions failed: {', '.join(failed)}")

    def _in_throwaway_database(self, argv: list[str]) -> None:
        """Run this command again in a child process whose DATABASE_URL names a fresh database; drop it after."""
        name = f"reckon_matrix_{uuid.uuid4().hex[:8]}"
        drop = None
        if connection.vendor == "sqlite":
            url = killmatrix.database_url(str(Path(tempfile.mkdtemp(prefix="reckon-matrix-db-")) / f"{name}.sqlite3"))
        else:
            url = killmatrix.database_url(name)
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
            drop = name
        argv = [a for a in argv if a != "--here"]
        try:
            child = subprocess.run(  # noqa: S603 - ourselves, with our own arguments
                [sys.executable, "manage.py", *argv, "--here"],
                cwd=settings.BASE_DIR,
                env=os.environ | {"DATABASE_URL": url},
                check=False,
            )
        finally:
            if drop is not None:
                connection.close()
                with connection.cursor() as cursor:
                    cursor.execute(f'DROP DATABASE IF EXISTS "{drop}" WITH (FORCE)')
        if child.returncode != 0:
            raise CommandError(f"kill matrix failed (exit {child.returncode})")
