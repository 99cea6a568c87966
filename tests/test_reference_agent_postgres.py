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
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from api.tokens import api_token_issue
from examples.migrate_agent import TABLE_KIND
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
        with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as admin:
            for name in names:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
