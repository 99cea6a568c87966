import importlib
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from hypothesis import settings as hypothesis_settings

from audit import capture_sql
from audit.principals import Principal
from leases.clock import ControllableClock, use_clock
from leases.models import Lease
from leases.services import lease_acquire
from tasks.core.actions import register_action
from tasks.engine.plans import task_create
from tasks.models import Task
from tests.simulator_fixture import Simulator

# The Celery workers the tests start (about 200 in CI: the kill matrix, the partitions, the worker and browser tests)
# skip Django's system checks at start, which import the URLconf and with it every view and the API's schemas (0.2 s
# of CPU each); the suite runs the checks itself (`manage.py check`, `check --deploy` in .ci/run).
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

# The append-only and capture triggers on SQLite (tasks/migrations/0009 and 0022, audit/migrations/0002, 0003 and
# 0006): how to drop and re-make them, in migration order.
_TRIGGER_MIGRATIONS = [
    importlib.import_module(name)
    for name in (
        "tasks.migrations.0009_event_append_only",
        "tasks.migrations.0022_event_archive",
        "audit.migrations.0002_append_only_triggers",
        "audit.migrations.0003_truncate_and_head",
        "audit.migrations.0006_account_changes",
    )
]
_ROLES = importlib.import_module("tasks.migrations.0003_roles")
# The capture triggers on API tokens and scope grants (api/migrations/0003, tasks/migrations/0015): a flush's deletes
# must not be captured either, or a test after a transactional one finds changes nobody made.
_CAPTURED_TOO = [
    table
    for name in ("api.migrations.0003_token_changes_captured", "tasks.migrations.0015_scope_grant_changes_captured")
    for table in importlib.import_module(name).TABLES
]
_SQLITE_TRIGGER_DROPS: list[str] = [
    sql for m in _TRIGGER_MIGRATIONS for sql in m.SQLITE_DROP
] + capture_sql.drop_capture(_CAPTURED_TOO, "sqlite")
_SQLITE_TRIGGER_CREATES: list[str] = [
    sql for m in _TRIGGER_MIGRATIONS for sql in m.SQLITE
] + capture_sql.sqlite_capture(_CAPTURED_TOO)
# PostgreSQL: a superuser's way past every trigger, for the current transaction only.
_PAST_THE_TRIGGERS = "SET LOCAL session_replication_role = replica"


def as_a_tamperer() -> None:
    """What someone with DDL rights does first: get past the append-only triggers (PostgreSQL superuser; anyone who
    can write SQLite's file). The test's transaction rolls it back."""
    with connection.cursor() as cursor:
        for sql in [_PAST_THE_TRIGGERS] if connection.vendor == "postgresql" else _SQLITE_TRIGGER_DROPS:
            cursor.execute(sql)


def _flush_past_the_append_only_triggers() -> None:
    """Transactional tests empty every table afterwards. Events, audit rows and the audit head refuse that in the
    database, as they must in production; the test suite empties them as someone with DDL rights would: PostgreSQL
    skips the triggers for the flush's own transaction (superuser), SQLite drops them for the flush and makes them
    again.

    The flush leaves the database as its migrations made it: the role groups (tasks/migrations/0003_roles.py) are
    made again past the capture triggers, as the migration made them before those existed — so a test that runs
    after a transactional one (in another order, or on another xdist worker) finds the same rows as one before."""
    from django.db.backends.base.operations import BaseDatabaseOperations

    original = BaseDatabaseOperations.execute_sql_flush
    roles = ", ".join(f"('{name}')" for name in _ROLES.ROLES)
    make_roles = f"INSERT INTO auth_group (name) VALUES {roles}"  # noqa: S608 - the migration's own names

    def execute_sql_flush(self: BaseDatabaseOperations, sql_list: list[str]) -> None:
        again = [make_roles] if any('"auth_group"' in sql for sql in sql_list) else []
        if self.connection.vendor == "postgresql":
            sql_list = [_PAST_THE_TRIGGERS, *sql_list, *again]
        elif self.connection.vendor == "sqlite":
            sql_list = [*_SQLITE_TRIGGER_DROPS, *sql_list, *again, *_SQLITE_TRIGGER_CREATES]
        original(self, sql_list)

    BaseDatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign,assignment]


_flush_past_the_append_only_triggers()


# What CI runs on which backend (.ci/run: SQLite + filesystem broker, PostgreSQL + Redis, side by side on two cores):
# the lists and why, in tests/backends.py. Run by hand, every test runs on whichever database DATABASE_URL names.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests import backends

    backends.mark(items)


hypothesis_settings.register_profile("ci", deadline=None, print_blob=True)
hypothesis_settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _no_anchor_key(settings: Any) -> None:
    """A RECKON_ANCHOR_KEY in the developer's shell must not make the suite read a real anchor file: anchoring is
    off unless a test turns it on with its own file (tests/test_anchoring.py)."""
    settings.RECKON_ANCHOR_KEY = ""


@pytest.fixture
def clock() -> Iterator[ControllableClock]:
    """The database server's clock, under the test's control."""
    with use_clock(ControllableClock()) as controlled:
        assert isinstance(controlled, ControllableClock)
        yield controlled


# The tests' own effect: one bounded write that takes any input (it declares no input fields), so a test's plan says
# only what the test is about. Registered for the test run only: no server process knows it.
EFFECT = "test.write"
register_action(EFFECT, description="a test's effect: one write, any input")


def effect_node(key: str, **extra: Any) -> dict[str, Any]:
    node = {"key": key, "action": EFFECT, "evidence": {"remote_id": True}}
    node.update(extra)
    return node


def chain_plan(*keys: str, **extra: Any) -> dict[str, Any]:
    """A linear plan: each node depends on the one before."""
    nodes = []
    for index, key in enumerate(keys):
        node = effect_node(key, **extra)
        if index:
            node["depends_on"] = [keys[index - 1]]
        nodes.append(node)
    return {"nodes": nodes}


@pytest.fixture
def make_task(db: None) -> Callable[..., Task]:
    def make(plan: dict[str, Any] | None = None, **kwargs: Any) -> Task:
        kwargs.setdefault("kind", "test")
        kwargs.setdefault("title", "a test task")
        kwargs.setdefault("created_by", "agent:tester")
        return task_create(plan=plan or chain_plan("a", "b"), **kwargs)

    return make


@pytest.fixture
def agent_lease() -> Callable[..., Lease]:
    def acquire(task: Task, holder: str = "agent-1", ttl: timedelta | None = None) -> Lease:
        return lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=holder, ttl=ttl)

    return acquire


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every Reckon table, to assert that a refusal changed nothing."""
    tables = [
        t
        for t in connection.introspection.table_names()
        if t.split("_")[0] in ("tasks", "leases", "audit", "api", "hooks", "retention")
    ]
    result = {}
    with connection.cursor() as cursor:
        for table in sorted(tables):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)} ORDER BY 1")  # noqa: S608
            result[table] = [tuple(row) for row in cursor.fetchall()]
    return result


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[Simulator]:
    """The object store as its own process, on a free loopback port, persisting to a file in tmp_path."""
    sim = Simulator(tmp_path / "store.json").start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def store(simulator: Simulator) -> Simulator:
    """The simulator with the demo plan's source (reference/demo.py) registered at version 7."""
    simulator.set_source("projects/acme", "7", "sha256:" + "ab" * 32)
    return simulator


def person(name: str, *roles: str, superuser: bool = False, staff: bool = False) -> Principal:
    """A user in the given role groups, as a principal. The role groups come from a migration (made again after a
    transactional test's flush); any other group is made here."""
    # Set-up state, saved as a fixture is loaded (raw): not a superuser change under test
    # (tasks/access/account_audit.py).
    user = User(username=name, is_superuser=superuser, is_staff=staff)
    user.set_unusable_password()
    user.save_base(raw=True)
    for role in roles:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return Principal.of_user(user)


SOURCE_REF = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def copy_node(**extra: Any) -> dict[str, Any]:
    """Reads a versioned source; its receipt must show 100 objects, the source digest and the source version."""
    return effect_node(
        "copy",
        input={"source": {"ref": SOURCE_REF}, "limit": 100},
        evidence={
            "remote_id": True,
            "count": 100,
            "digest": {"input": "source", "field": "digest"},
            "remote_version": {"input": "source", "field": "version"},
        },
        **extra,
    )
