"""The step's budget, pinned (as zulip pins its actions): at most 2 commits and 20 statements per node, BEGIN and
COMMIT counted, directive reads included — on both backends. A new statement on this path is a decision: raise the
figure here in the same commit, and say why.

Statements are captured inside the test's own transaction, where each of the step's transactions is a SAVEPOINT and
a RELEASE: exactly where BEGIN and COMMIT stand outside a test, so they count the same.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import leases.clock
from audit.principals import Principal
from leases.models import Lease
from tasks.core.outcomes import Committed, NotFound, Outcome
from tasks.engine.connectors import Connector
from tasks.engine.protocol import (
    inputs_confirm,
    next_directive,
    operation_start,
    record_outcome,
    snapshot_at,
)
from tasks.engine.runner import run_steps
from tasks.engine.snapshot import task_snapshot
from tasks.models import Task
from tasks.people.cancel import task_request_cancel
from tests.conftest import chain_plan

NODES = 10
STATEMENTS_PER_NODE = 20  # the budget, BEGIN and COMMIT counted
COMMITS_PER_NODE = 2


class Receipts(Connector):
    """Commits at once; the receipt satisfies {"remote_id": true}."""

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return Committed(remote_id=f"r-{op_key[-12:]}")

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self.submit(op_key, request)

    def lookup(self, op_key: str) -> Outcome:
        return NotFound()

    def current_version(self, locator: str) -> str:
        return "1"

    def delete(self, op_key: str, locator: str) -> Outcome:
        return Committed(remote_id=f"d-{op_key[-12:]}")


def commits(ctx: CaptureQueriesContext) -> int:
    return sum(1 for q in ctx.captured_queries if q["sql"].startswith("RELEASE SAVEPOINT"))


def chain_commits(nodes: int) -> int:
    """A chain of ``nodes`` run by one worker: the first node's start, then each receipt's commit, which starts the
    next node (tasks.engine.protocol.record_outcome's start_next) — at most 2 per node, the issue's budget."""
    return nodes + 1


def test_a_node_through_run_steps_costs_two_commits_and_at_most_the_budget(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan(*(f"n{i}" for i in range(NODES))))
    lease = agent_lease(task, ttl=timedelta(minutes=5))
    with CaptureQueriesContext(connection) as ctx:
        report = run_steps(task_id=task.pk, lease=lease, connector=Receipts())
    assert report.directive is not None and report.directive.kind == "done"
    assert Task.objects.get(pk=task.pk).status == "completed"
    statements = len(ctx.captured_queries)
    print(f"\n[budget] {NODES} nodes: {statements} statements, {commits(ctx)} commits ({statements / NODES:.1f}/node)")
    assert commits(ctx) == chain_commits(NODES) <= COMMITS_PER_NODE * NODES
    assert statements <= STATEMENTS_PER_NODE * NODES
    # Pinned exactly: three snapshot reads once, then NODES + 1 writes. Inside this test's transaction each is a
    # SAVEPOINT and a RELEASE around, on PostgreSQL, ONE statement checking the lease and writing task, nodes,
    # operations, receipt, events and the lease's extension; on SQLite the rows are written one statement each:
    # the first start 5 (lease, task, node, operation, event), each receipt that starts the next node 9 (lease,
    # task, two nodes, two operations, receipt, two events), the last receipt 6. The test clock reads no time.
    # + 1: the webhook outbox's read of the live subscriptions when the task completes
    if connection.vendor == "postgresql":
        assert statements == 3 + chain_commits(NODES) * 3 + 1
    else:
        assert statements == 3 + (5 + 2) + (NODES - 1) * (9 + 2) + (6 + 2) + 1


def test_a_node_outside_any_transaction_costs_two_commits_and_no_begin_on_postgresql(
    transactional_db: None, make_task, agent_lease, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a worker runs it (autocommit, the database's own clock): one statement per commit on PostgreSQL — no
    BEGIN, no COMMIT, no separate lease statement, no clock read (one reading, then estimated:
    leases.clock.write_time); on SQLite a transaction of one statement per row. Commits counted as the bench counts
    them (a transaction that wrote, or a write in autocommit)."""
    from harness.bench import StatementCounter

    task = make_task(chain_plan(*(f"n{i}" for i in range(NODES))))
    lease = agent_lease(task, ttl=timedelta(minutes=5))
    before = Lease.objects.get(pk=lease.pk).expires_at
    monkeypatch.setattr(leases.clock, "ANCHOR_SECONDS", 3600.0)  # one reading, however slow the machine
    connection.reckon_clock_anchor = None  # type: ignore[attr-defined]
    counter = StatementCounter(connection)
    with counter.installed():
        report = run_steps(task_id=task.pk, lease=lease, connector=Receipts())
    assert report.directive is not None and report.directive.kind == "done"
    assert Task.objects.get(pk=task.pk).status == "completed"
    assert Lease.objects.get(pk=lease.pk).expires_at > before  # every write extended the lease
    print(f"\n[budget, autocommit] {NODES} nodes: {counter.statements} statements, {counter.commits} commits")
    assert counter.commits == chain_commits(NODES)
    if connection.vendor == "postgresql":
        # 3 snapshot reads and 1 clock reading once; one write per commit; the last is a transaction (the webhook
        # outbox listens to the event that completes the task: its read of the live subscriptions)
        assert counter.transactions == 1
        assert counter.statements == 3 + 1 + chain_commits(NODES) + 1
    else:
        assert counter.transactions == chain_commits(NODES)
        assert counter.statements <= (STATEMENTS_PER_NODE - 2) * NODES  # BEGIN and COMMIT are not in this count


def test_the_step_path_runs_on_the_database_servers_own_clock(make_task, agent_lease) -> None:
    """No test clock: the snapshot's and the write's time come from the database, and every write extends the
    lease."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task, ttl=timedelta(minutes=5))
    before = Lease.objects.get(pk=lease.pk).expires_at
    report = run_steps(task_id=task.pk, lease=lease, connector=Receipts())
    assert report.directive is not None and report.directive.kind == "done"
    assert Lease.objects.get(pk=lease.pk).expires_at >= before  # every write was a heartbeat


@pytest.mark.parametrize("service", ["start", "settle"])
def test_each_step_write_on_a_snapshot_is_one_transaction_of_pinned_statements(
    make_task, agent_lease, clock, service: str
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    snap = task_snapshot(task_id=task.pk, lease=lease)
    op = None
    if service == "settle":
        begun = operation_start(snap, "a", lease=lease)
        op, snap = begun.operation, begun.snapshot
    with CaptureQueriesContext(connection) as ctx:
        if service == "start":
            operation_start(snap, "a", lease=lease)
        else:
            assert op is not None
            record_outcome(snap, op.op_key, Committed(remote_id="r-a"), lease=lease)
    assert commits(ctx) == 1
    # SAVEPOINT, then the lease and the rows (PostgreSQL: one statement; SQLite: lease, task, node, operation,
    # (receipt,) event), RELEASE
    expected = 3 if connection.vendor == "postgresql" else (7 if service == "start" else 8)
    assert len(ctx.captured_queries) == expected, [q["sql"][:60] for q in ctx.captured_queries]


@pytest.mark.parametrize(
    ("service", "reads"),
    [("next_directive", 3), ("operation_start", 3), ("record_outcome", 3)],
)
def test_each_service_on_a_snapshot_read_at_a_version_reads_no_more(
    make_task, agent_lease, clock, service: str, reads: int
) -> None:
    """A caller without a snapshot reads one at the version it decided on (snapshot_at: three queries); the
    service never reads again after it writes."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    call: Callable[[], object]
    writes = 0
    if connection.vendor == "postgresql":
        writes = 0  # set below: the same writes as one statement
    if service == "next_directive":
        call = lambda: next_directive(task_id=task.pk, lease=lease)  # noqa: E731
    elif service == "operation_start":

        def call() -> object:
            return operation_start(
                snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version), "a", lease=lease
            )

        writes = 3 if connection.vendor == "postgresql" else 7
    else:
        first = snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version)
        op = operation_start(first, "a", lease=lease).operation

        def call() -> object:
            snap = snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version + 1)
            return record_outcome(snap, op.op_key, Committed(remote_id="r-a"), lease=lease)

        writes = 3 if connection.vendor == "postgresql" else 8
    with CaptureQueriesContext(connection) as ctx:
        call()
    assert len(ctx.captured_queries) == reads + writes, [q["sql"][:60] for q in ctx.captured_queries]


def test_a_lease_passed_as_a_token_needs_no_row(make_task, agent_lease, clock) -> None:
    """Services take what a write needs of the lease (id, task, epoch, holder, ttl), not a model instance."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Token:
        pk: int
        task_id: int
        epoch: int
        holder_kind: str
        holder_id: str
        ttl: timedelta | None

    task = make_task(chain_plan("a"))
    row: Lease = agent_lease(task)
    token = Token(row.pk, row.task_id, row.epoch, row.holder_kind, row.holder_id, row.ttl)
    report = run_steps(task_id=task.pk, lease=token, connector=Receipts())  # type: ignore[arg-type]
    assert report.directive is not None and report.directive.kind == "done"


def test_confirming_inputs_and_cancelling_cost_pinned_statements(make_task, agent_lease, clock) -> None:
    """The other two protocol services: one snapshot, one transaction (the cancel's with its audit row)."""
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    Task.objects.filter(pk=task.pk).update(inputs_recheck_required=True)
    with CaptureQueriesContext(connection) as confirm:
        inputs_confirm(snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version), {}, lease=lease)
    with CaptureQueriesContext(connection) as cancel:
        task_request_cancel(actor=Principal.agent("tester"), task_id=task.pk, reason="no longer needed")
    pg = connection.vendor == "postgresql"
    # confirm: 3 reads, SAVEPOINT, the lease and the rows (PostgreSQL one statement; SQLite lease, task, event),
    # RELEASE
    assert len(confirm.captured_queries) == (6 if pg else 8), [q["sql"][:60] for q in confirm.captured_queries]
    assert commits(confirm) == 1 and commits(cancel) >= 1
    # cancel: 3 reads, the audited transaction (the clock, the rows, the audit chain's head and row); no read after
    # (the first audit row of a database also creates the audit chain's head: a SAVEPOINT, an INSERT and a RELEASE),
    # and the webhook outbox's read of the live subscriptions
    assert len(cancel.captured_queries) == (15 if pg else 16), [q["sql"][:70] for q in cancel.captured_queries]


def test_psycopg_parses_each_step_statement_once_on_postgresql(make_task, agent_lease, clock) -> None:
    """A chained write is one long statement (two changes): psycopg must keep its parse of it, as of every other
    statement of the step path, instead of parsing it again on every commit (leases.db._cache_long_statements)."""
    if connection.vendor != "postgresql":
        pytest.skip("psycopg's query cache: PostgreSQL only")
    import psycopg._queries

    first, second = (make_task(chain_plan("a", "b", "c")) for _ in range(2))
    run_steps(task_id=first.pk, lease=agent_lease(first), connector=Receipts())
    lease = agent_lease(second)
    before = psycopg._queries._query2pg.cache_info()
    report = run_steps(task_id=second.pk, lease=lease, connector=Receipts())
    after = psycopg._queries._query2pg.cache_info()

    assert report.directive is not None and report.directive.kind == "done"
    assert after.misses == before.misses
    assert after.hits - before.hits == 3 + chain_commits(3)  # the snapshot's reads, then every write


def test_the_step_cursor_is_kept_per_connection_and_nested_use_gets_its_own(make_task, agent_lease, clock) -> None:
    """leases.db.step_cursor keeps one cursor per database connection for the next step; a step cursor opened
    inside another is a different one (the outer's result stays readable)."""
    if connection.vendor != "postgresql":
        pytest.skip("the kept cursor: PostgreSQL only")
    from leases.db import step_cursor

    def raw(wrapper: Any) -> Any:
        return wrapper.cursor

    with step_cursor() as first:
        first.execute("SELECT 1")
        with step_cursor() as inner:
            inner.execute("SELECT 2")
            assert raw(inner) is not raw(first)
            assert inner.fetchone() == (2,)
        assert first.fetchone() == (1,)
        kept = raw(first)
    with step_cursor() as again:
        assert raw(again) is kept
    task = make_task(chain_plan("a", "b"))
    run_steps(task_id=task.pk, lease=agent_lease(task), connector=Receipts())
    with step_cursor() as after_steps:
        assert raw(after_steps) is kept


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_gets_a_new_step_cursor() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the kept cursor: PostgreSQL only")
    from leases.db import step_cursor

    with step_cursor() as first:
        kept = first.cursor
    connection.close()
    with step_cursor() as fresh:
        assert fresh.cursor is not kept
        fresh.execute("SELECT 3")
        assert fresh.fetchone() == (3,)
