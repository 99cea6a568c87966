from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.principals import Principal
from reference.demo_logins import FIRST_ADMIN
from reference.demo_postgres import BATCH, ROWS, TABLE, VIEW, Databases, DemoPostgresUnavailable, demo_postgres_run


class Command(BaseCommand):
    help = (
        "The demo's table migration (./dev demo runs it when RECKON_DEMO_POSTGRES names a server): make two "
        "databases on --server and run the reference agent's PostgreSQL kind against Reckon at --url; a migration "
        "on record is taken up where it stopped, or left alone once ended. After load_demo (its first admin issues "
        "the agent's token)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", required=True, help="Reckon's web process, e.g. http://127.0.0.1:8000")
        parser.add_argument("--server", required=True, help="a PostgreSQL server (libpq URL or connection string)")
        parser.add_argument("--prefix", default="reckon_demo", help="the databases: <prefix>_source, <prefix>_target")

    def handle(self, *args: Any, **options: Any) -> None:
        admin = User.objects.filter(username=FIRST_ADMIN, is_active=True).first()
        if admin is None:
            raise CommandError(f"no {FIRST_ADMIN!r} login: run load_demo first")
        databases = Databases(server=options["server"], prefix=options["prefix"])
        source, target = databases.names
        try:
            run = demo_postgres_run(actor=Principal.of_user(admin), url=options["url"], databases=databases)
        except DemoPostgresUnavailable as error:
            raise CommandError(str(error)) from error
        if not run.ran and run.task is not None:
            self.stdout.write(f"Table migration already on record: #{run.task.pk} {run.task.title} ({run.task.status})")
            return
        if run.resumed:
            self.stdout.write("Table migration on record, not ended: the agent takes it up where it stopped.")
        self.stdout.write(f"Table migration: {source}.{TABLE} ({ROWS:,} rows) → {target}.{TABLE}, {BATCH} rows a copy,")
        self.stdout.write(f"then the view {target}.{VIEW} switched to it. The agent said:")
        for line in run.output.splitlines():
            self.stdout.write(f"  {line}")
        if run.returncode != 0:
            raise CommandError(f"the agent ended with status {run.returncode}")
