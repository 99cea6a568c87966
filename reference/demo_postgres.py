"""The demo's table migration (``RECKON_DEMO_POSTGRES=… ./dev demo``, ``manage.py load_demo_postgres``): the
reference agent's PostgreSQL kind — examples/migrate_agent.py ``--postgres-source …``, its own process, over the
demo's API — run against two databases it makes on the named server, so the console shows a table migrated beside
the object-store tasks.

The databases are the demo's own (``<prefix>_source``, ``<prefix>_target``): made afresh (dropped first) whenever
Reckon's record holds no such migration, so a reset demo never meets a target its earlier run filled; left alone
once a migration of them is on record, which the next run takes up where it stopped until it has ended. The agent's
token is scoped to the kind, issued for each run and revoked when the run ends: it is never printed.
"""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from api.tokens import api_token_issue, api_token_revoke
from audit.principals import Principal
from reference.migrate_table import KIND
from tasks.core.lifecycle import task_ended
from tasks.models import Task

AGENT = "demo-postgres-agent"
TABLE, VIEW, KEY = "orders", "orders_current", "id"
ROWS, BATCH = 1_000, 100  # ten copies and a view switch
COLUMNS = "id integer PRIMARY KEY, customer text NOT NULL, total numeric(10, 2) NOT NULL, placed date NOT NULL"
AGENT_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "migrate_agent.py"


class DemoPostgresUnavailable(RuntimeError):
    """The named PostgreSQL server refused the connection or the demo's databases."""


@dataclass(frozen=True)
class Databases:
    server: str  # a libpq connection string or URL, as given
    prefix: str

    @property
    def names(self) -> tuple[str, str]:
        return f"{self.prefix}_source", f"{self.prefix}_target"

    def conninfo(self, name: str) -> str:
        return make_conninfo(self.server, dbname=name)

    @property
    def source(self) -> str:
        return self.conninfo(self.names[0])

    @property
    def target(self) -> str:
        return self.conninfo(self.names[1])


def demo_postgres_task() -> Task | None:
    """The demo's migration on record, if any: the agent creates it with the table as its project."""
    return Task.objects.filter(kind=KIND, created_by=str(Principal.agent(AGENT)), project=TABLE).order_by("-pk").first()


def demo_databases_make(databases: Databases) -> None:
    """Drop and make both databases: the source with ROWS orders, the target with the table empty."""
    try:
        with psycopg.connect(databases.server, autocommit=True, connect_timeout=5) as admin:
            for name in databases.names:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        with psycopg.connect(databases.source, connect_timeout=5) as conn:
            conn.execute(f"CREATE TABLE {TABLE} ({COLUMNS})")
            conn.execute(
                f"INSERT INTO {TABLE} SELECT i, 'customer ' || (i %% 97), (i %% 500) * 1.25 + 0.99,"  # noqa: S608
                " DATE '2026-01-01' + (i %% 300) FROM generate_series(1, %s) AS i",
                (ROWS,),
            )
        with psycopg.connect(databases.target, connect_timeout=5) as conn:
            conn.execute(f"CREATE TABLE {TABLE} ({COLUMNS})")
    except psycopg.Error as error:
        raise DemoPostgresUnavailable(f"the PostgreSQL server {databases.server!r} refused: {error}") from error


@dataclass(frozen=True)
class Run:
    task: Task | None  # the migration on record after the run (None: the agent made none)
    output: str  # what the agent printed
    returncode: int  # the agent's exit status; 0 when the migration on record had ended
    ran: bool  # False: the migration on record had ended, nothing was run
    resumed: bool = False  # True: the agent took up the migration on record, on the databases as they were


def demo_postgres_run(*, actor: Principal, url: str, databases: Databases, timeout: float = 300) -> Run:
    """Run the reference agent's PostgreSQL kind against Reckon at ``url`` (its web process must answer): a new
    migration on databases made afresh when none is on record; the one on record taken up again where a run left it
    (its agent stopped mid-run: Ctrl-C, a crash), on the databases as they are; nothing once it has ended.
    ``actor``: the admin who issues the agent's token."""
    task = demo_postgres_task()
    if task is not None and task_ended(task.status):
        return Run(task=task, output="", returncode=0, ran=False)
    if task is None:
        demo_databases_make(databases)
    token, plaintext = api_token_issue(
        actor=actor, agent_id=AGENT, kinds=[KIND], projects=[TABLE], name="the demo's table migration (one run)"
    )
    command = [sys.executable, str(AGENT_SCRIPT), "--url", url, "--token", plaintext]
    command += ["--postgres-source", databases.source, "--postgres-target", databases.target, "--table", TABLE]
    command += ["--key", KEY, "--view", VIEW, "--batch", str(BATCH)]
    command += ["--task", str(task.pk)] if task is not None else []
    try:
        done = subprocess.run(  # noqa: S603 - our own agent script, our arguments
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
        output, returncode = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, returncode = f"the agent did not finish in {expired.timeout:.0f} s: stopped", 124
    finally:
        api_token_revoke(actor=actor, token_id=token.pk, reason="the demo's table migration ran: its token is done")
    return Run(task=demo_postgres_task(), output=output.strip(), returncode=returncode, ran=True, resumed=bool(task))
