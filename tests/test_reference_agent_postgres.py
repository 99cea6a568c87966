"""The reference agent's PostgreSQL kind (examples/migrate_agent.py --postgres-source …): a table migrated from one
database of the run's own to another over Reckon's API, the agent SIGKILLed mid-run and started again.

Reckon is its own process (tests/test_agent_e2e.py's gunicorn), the agent its own, the two databases the machine's
PostgreSQL server's. "Once" is the target's own record: its rows (a primary key, so a second copy would be refused,
not hidden) and its ledger (one row per op key, written in the copy's transaction)."""

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from psycopg import sql
from reckon_client import Reckon
from reckon_client.connectors.postgres import PostgresConnector

from api.models import ApiToken
from api.tokens import api_token_issue
from examples.migrate_agent import TABLE_KIND, table_plan
from harness.ports import free_port
from reference.demo_logins import demo_logins_ensure
from reference.demo_postgres import AGENT, Databases, demo_databases_make
from reference.demo_postgres import BATCH as BATCH_DEMO
from reference.demo_postgres import ROWS as ROWS_DEMO
from tasks.core.lifecycle import TaskStatus
from tasks.engine.verification import find_problems
from tasks.models import Operation, Task
from tests.conftest import person
from tests.simulator_fixture import ROOT
from tests.test_agent_e2e import server  # noqa: F401 - the web process fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)

SERVER = "host=127.0.0.1 port=5432 user=postgres"
ROWS, BATCH = 2_000, 20  # 100 copies and a switch
COLUMNS = "id integer PRIMARY KEY, name text NOT NULL, amount numeric(10, 2) NOT NULL"


def drop_databases(*names: str) -> None:
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as admin:
        for name in names:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """A source database with ``items`` of ROWS rows and a target with the table empty, dropped afterwards."""
    suffix = secrets.token_hex(4)
    names = (f"reckon_ref_src_{suffix}", f"reckon_ref_dst_{suffix}")
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as admin:
        for name in names:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    source, target = (f"{SERVER} dbname={name}" for name in names)
    try:
        with psycopg.connect(source) as conn:
            conn.execute(f"CREATE TABLE items ({COLUMNS})")
            conn.execute("INSERT INTO items SELECT i, 'item ' || i, i * 1.25 FROM generate_series(1, %s) AS i", (ROWS,))
        with psycopg.connect(target) as conn:
            conn.execute(f"CREATE TABLE items ({COLUMNS})")
        yield source, target
    finally:
        drop_databases(*names)


@pytest.fixture
def live(server: tuple[str, Path, int]) -> tuple[str, str]:  # noqa: F811 - the imported fixture
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="mover", kinds=[TABLE_KIND], projects=[])
    return server[0], token


def agent(live: tuple[str, str], databases: tuple[str, str], *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(ROOT / "examples" / "migrate_agent.py"), "--url", live[0], "--token", live[1]]
    command += ["--postgres-source", databases[0], "--postgres-target", databases[1], "--key", "id"]
    command += ["--view", "items_current", "--batch", str(BATCH), "--lease-ttl", "5", "--lease-wait", "30", *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603


def one(conninfo: str, query: str) -> object:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        return row[0] if row else None


def ledger(target: str) -> int:
    try:
        return int(str(one(target, "SELECT count(*) FROM reckon_ledger WHERE state = 'committed'")))
    except psycopg.errors.UndefinedTable:
        return 0


def test_a_table_migrated_by_an_agent_killed_mid_run_lands_once_and_the_view_reads_it(
    live: tuple[str, str], databases: tuple[str, str]
) -> None:
    source, target = databases
    first = agent(live, databases, "--table", "items")
    deadline = time.monotonic() + 60
    while ledger(target) < 10 and first.poll() is None:
        assert time.monotonic() < deadline, "no copy landed"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(5)
    landed = ledger(target)
    assert 10 <= landed < 101, f"the kill was not mid-run: {landed} of 101 written"

    second = agent(live, databases, "--table", "items")
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 0, output
    assert output.rstrip().endswith("done"), output

    task = Task.objects.get(kind=TABLE_KIND)
    assert task.status == TaskStatus.COMPLETED and find_problems(task) == []
    ops = Operation.objects.filter(task=task, purpose="effect")
    assert ops.count() == 101 and ops.filter(dispatch_count__gt=1).count() <= 1  # at most the one in flight re-asked
    assert ledger(target) == 101  # one ledger row per op key: every copy and the switch, once
    with psycopg.connect(target, autocommit=True) as conn:
        keys = {row[0] for row in conn.execute("SELECT op_key FROM reckon_ledger WHERE state = 'committed'")}
        assert keys == {op.op_key for op in ops}
    assert one(target, "SELECT count(*) FROM items") == ROWS
    assert one(target, "SELECT count(*) FROM items_current") == ROWS  # the view reads the copy
    same = "SELECT md5(string_agg(items::text, ',' ORDER BY id)) FROM items"
    assert one(target, same) == one(source, same)


def test_a_table_that_does_not_exist_is_said_so_and_no_task_is_made(
    live: tuple[str, str], databases: tuple[str, str]
) -> None:
    process = agent(live, databases, "--table", "nosuch")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2, output
    assert "the source has no table nosuch" in output and "Traceback" not in output
    assert not Task.objects.filter(kind=TABLE_KIND).exists()


# ------------------------------------------------------------------------------------------------ the demo's run
# ./dev demo runs manage.py load_demo_postgres when RECKON_DEMO_POSTGRES names a server (reference/demo_postgres.py).


@pytest.fixture
def demo_databases() -> Iterator[Databases]:
    databases = Databases(server=f"{SERVER} dbname=postgres", prefix=f"reckon_demo_{secrets.token_hex(4)}")
    try:
        yield databases
    finally:
        drop_databases(*databases.names)


def load_demo_postgres(url: str, databases: Databases) -> str:
    out = StringIO()
    call_command("load_demo_postgres", url=url, server=databases.server, prefix=databases.prefix, stdout=out)
    return out.getvalue()


def test_the_demo_migrates_its_table_once_over_a_stale_target_and_its_token_dies_with_the_run(
    server: tuple[str, Path, int],  # noqa: F811 - the imported fixture
    demo_databases: Databases,
) -> None:
    demo_logins_ensure()
    # A target left by an earlier demo whose record was reset: the demo makes its databases afresh.
    with psycopg.connect(demo_databases.server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(demo_databases.names[1])))
    with psycopg.connect(demo_databases.target) as conn:
        conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES (1)")

    output = load_demo_postgres(server[0], demo_databases)

    task = Task.objects.get(kind=TABLE_KIND)
    assert f"task {task.pk}: done" in output, output
    assert task.status == TaskStatus.COMPLETED and find_problems(task) == []
    ops = Operation.objects.filter(task=task, purpose="effect")
    assert ops.count() == ROWS_DEMO // BATCH_DEMO + 1 == ledger(demo_databases.target)
    assert one(demo_databases.target, "SELECT count(*) FROM orders_current") == ROWS_DEMO
    same = "SELECT md5(string_agg(orders::text, ',' ORDER BY id)) FROM orders"
    assert one(demo_databases.target, same) == one(demo_databases.source, same)
    tokens = ApiToken.objects.filter(agent_id=AGENT)
    assert tokens.count() == 1 and tokens.filter(revoked_at__isnull=True).count() == 0  # it ran, it is revoked

    again = load_demo_postgres(server[0], demo_databases)
    assert f"already on record: #{task.pk}" in again
    assert Task.objects.filter(kind=TABLE_KIND).count() == 1 and tokens.count() == 1  # nothing run, nothing issued
    assert ledger(demo_databases.target) == ops.count()


def test_a_demo_migration_left_before_its_end_is_taken_up_on_the_databases_as_they_are(
    server: tuple[str, Path, int],  # noqa: F811 - the imported fixture
    demo_databases: Databases,
) -> None:
    """The agent created the task and was stopped (Ctrl-C on the demo, a crash) before it ended: the next demo
    start runs the agent on that task, and makes no database again."""
    demo_logins_ensure()
    demo_databases_make(demo_databases)
    with psycopg.connect(demo_databases.target) as conn:
        conn.execute("CREATE TABLE kept (note text)")  # gone if the databases were made again
    _, token = api_token_issue(actor=person("root", "admin"), agent_id=AGENT, kinds=[TABLE_KIND], projects=["orders"])
    version = PostgresConnector(source=demo_databases.source, target=demo_databases.target).current_version("orders")
    document = table_plan("orders", "orders", "id", (1, ROWS_DEMO), BATCH_DEMO, "orders_current", version)
    with Reckon(server[0], token) as reckon:
        left = reckon.create_task(TABLE_KIND, "Migrate table orders", document, project="orders")

    output = load_demo_postgres(server[0], demo_databases)

    assert "takes it up where it stopped" in output and f"task {left.id}: done" in output, output
    task = Task.objects.get(kind=TABLE_KIND)
    assert task.pk == left.id and task.status == TaskStatus.COMPLETED and find_problems(task) == []
    assert ledger(demo_databases.target) == ROWS_DEMO // BATCH_DEMO + 1
    assert one(demo_databases.target, "SELECT count(*) FROM kept") == 0  # the same database
    assert one(demo_databases.target, "SELECT count(*) FROM orders_current") == ROWS_DEMO


def test_the_demo_says_which_server_refused_and_makes_nothing(demo_databases: Databases) -> None:
    demo_logins_ensure()
    closed = Databases(server=f"host=127.0.0.1 port={free_port()} user=postgres dbname=postgres", prefix="x")
    with pytest.raises(CommandError, match=r"the PostgreSQL server .*port=\d+.* refused"):
        load_demo_postgres("http://127.0.0.1:9", closed)
    with pytest.raises(CommandError, match=r"the PostgreSQL server 'not a server' refused"):
        load_demo_postgres("http://127.0.0.1:9", Databases(server="not a server", prefix="x"))
    assert not Task.objects.filter(kind=TABLE_KIND).exists() and not ApiToken.objects.exists()

    User.objects.all().delete()
    with pytest.raises(CommandError, match="run load_demo first"):
        load_demo_postgres("http://127.0.0.1:9", demo_databases)
