"""The step benchmark: Reckon's step protocol against the raw limit of its two commits, in a throw-away database.

    ./dev manage bench                      # SQLite (the configured default)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/reckon ./dev manage bench --tasks 20 --rounds 3

A *step* is one node driven from ready to done: its intent registered, the call made, its receipt recorded.

- **Reckon**: tasks of ``nodes`` chained nodes (action ``bench.commit``, evidence ``remote_id`` and ``count``), each
  driven by ``tasks.engine.runner.run_steps`` with an in-process connector that answers every call with a ``Committed``
  receipt at once — so the figures are Reckon's own cost, not a remote's.
- **raw**: the least any design with the same guarantees must do per step, in plain psycopg (SQLite: the sqlite3
  module with the pragmas of ``console/settings.py``): commit 1 inserts an intent row; commit 2 inserts a receipt
  row and moves the task's version with ``UPDATE … SET version = version + 1 WHERE id = … AND version = …``.

Both run with 1 worker and with N concurrent workers on different tasks (processes started with ``spawn``, each
with its own connection; on SQLite the writers serialise on the file lock, as they do in production). Rounds
interleave raw and Reckon so that the machine's noise hits both, and every figure is the median over rounds.

The worker processes are started once and kept; each run hands them their tasks (created beforehand, with their
leases, by the parent: not measured) and they start together on a barrier. Measured per run:

- steps/s: steps / (last worker's end - first worker's start), on the shared monotonic clock;
- client CPU: ``time.process_time`` of each worker over its run, summed, per step;
- statements: every statement the worker sent (Reckon: counted by a ``connection.execute_wrapper``; raw: by
  construction, 3), BEGIN excluded; transactions: explicit ones (Reckon: ``commit``/``rollback`` calls on the
  connection; raw: 2); round trips (PostgreSQL) = statements + BEGIN + COMMIT of each explicit transaction;
  commits: transactions that wrote, plus writes in autocommit (client side; raw: 2);
- PostgreSQL, from the server's statistics (each worker forces its backend to flush them with
  ``pg_stat_force_next_flush()`` before it reports; that one read-only transaction per worker is subtracted):
  ``pg_stat_database.xact_commit`` of the bench database (every transaction, read-only ones included),
  ``tup_inserted + tup_updated`` (rows written), and ``pg_stat_wal`` (``wal_sync``, ``wal_records``, ``wal_fpi``,
  ``wal_bytes``). pg_stat_wal is cluster-wide: commits seen in other databases during a window are reported.
- SQLite: rows written = ``total_changes`` of the workers' connections (inserts, updates and deletes).
- With 1 worker, the time a Reckon step waits (wall time less client CPU: the database, the commit's fsync, the
  kernel) against the raw loop's whole step: the ratio Reckon would reach with no client CPU at all.
- The machine's speed at plain Python (``python_reference_us``): Reckon's client CPU per step moves with it and the
  raw loop's hardly, so the same code reads a lower ratio on a slower day; compare runs by it first.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import queue
import sqlite3
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections

from tasks.core.actions import register_action
from tasks.core.outcomes import Committed, NotFound, Outcome

if TYPE_CHECKING:
    from multiprocessing.synchronize import Barrier

    from leases.models import Lease

# Safe before Django is set up: the worker processes import this module to find their entry point.
ACTION = "bench.commit"
register_action(ACTION, description="benchmark: an effect an in-process connector commits at once")

_SHARED_RAW_SQL = (
    "INSERT INTO bench_raw_intent (task_id, node, op_key) VALUES (%s, %s, %s) RETURNING id",
    "INSERT INTO bench_raw_receipt (intent_id, remote_id) VALUES (%s, %s)",
    "UPDATE bench_raw_task SET version = version + 1 WHERE id = %s AND version = %s",
)
# The raw limit of the goals (two commits per step); the same loop sharing commits along a chain, as Reckon's worker
# does; Reckon. Interleaved in every round, in this order.
RAW_MODES = ("raw", "shared")
MODES = (*RAW_MODES, "reckon")
GOALS = (
    # (figure, workers, comparison, target, text)
    ("ratio", 1, ">=", 0.5, "Reckon >= 0.5 x raw steps/s with 1 worker"),
    ("ratio", 8, ">=", 0.4, "Reckon >= 0.4 x raw steps/s with 8 workers"),
    ("cpu_ms_per_step", 1, "<=", 2.0, "Reckon client CPU <= 2 ms per step (1 worker)"),
)
# Every figure of a (mode, workers) cell; None where the backend has no such figure.
FIGURES = (
    "steps",
    "wall_s",
    "steps_per_s",
    "cpu_ms_per_step",
    "cpu_reference_loops_per_step",
    "server_cpu_ms_per_step",
    "machine_cpu_ms_per_step",
    "statements_per_step",
    "transactions_per_step",
    "round_trips_per_step",
    "commits_per_step",
    "xact_commit_per_step",
    "wal_syncs_per_step",
    "wal_records_per_step",
    "wal_fpi_per_step",
    "wal_bytes_per_step",
    "rows_written_per_step",
    "loop_iterations_per_step",
    "other_db_commits",
)
PG_ONLY = frozenset(
    {
        "server_cpu_ms_per_step",
        "round_trips_per_step",
        "xact_commit_per_step",
        "wal_syncs_per_step",
        "wal_records_per_step",
        "wal_fpi_per_step",
        "wal_bytes_per_step",
        "other_db_commits",
    }
)
PG_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "wal_level",
    "commit_delay",
    "shared_buffers",
    "max_wal_size",
)
BARRIER_TIMEOUT = 300.0


class BenchError(RuntimeError):
    """The bench could not measure (a worker failed, a task did not complete, the server is not durable)."""


@dataclass(frozen=True)
class BenchConfig:
    tasks: int = 20  # per worker
    nodes: int = 10
    rounds: int = 3
    workers: tuple[int, ...] = (1, 8)
    json_path: Path | None = None
    profile: bool = False
    allow_nondurable: bool = False

    def check(self) -> None:
        if self.tasks < 1 or self.nodes < 1 or self.rounds < 1:
            raise ValueError("tasks, nodes and rounds must be at least 1")
        if not self.workers or min(self.workers) < 1:
            raise ValueError("worker counts must be at least 1")
        if self.nodes > 100:
            raise ValueError("a plan has at most 100 nodes (tasks.core.plan.MAX_NODES)")


def chain_plan(nodes: int) -> dict[str, Any]:
    """A chain of ``nodes`` effects, each needing a receipt with a remote id and a count of 1."""
    return {
        "nodes": [
            {
                "key": f"n{i}",
                "action": ACTION,
                "depends_on": [f"n{i - 1}"] if i else [],
                "evidence": {"remote_id": True, "count": 1},
                "on_failure": {"invalid_params": "fail_task"},
                "rerun": "idempotent by op key",
            }
            for i in range(nodes)
        ]
    }


class BenchConnector:
    """An in-process remote that commits every write at once and remembers it by op key."""

    def __init__(self) -> None:
        self.committed: dict[str, Committed] = {}

    def _commit(self, op_key: str) -> Committed:
        return self.committed.setdefault(op_key, Committed(remote_id=f"bench:{op_key}", count=1))

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self._commit(op_key)

    def lookup(self, op_key: str) -> Outcome:
        return self.committed.get(op_key) or NotFound()

    def current_version(self, locator: str) -> str:
        return "1"

    def delete(self, op_key: str, locator: str) -> Outcome:
        return Committed(remote_id=locator, count=0)

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self._commit(op_key)


def bench_tasks(count: int, nodes: int, *, label: str, holder: str) -> list[tuple[int, Lease]]:
    """``count`` tasks of a ``nodes``-node chain, each with an agent lease of ``holder``: (task id, lease)."""
    from leases.services import lease_acquire
    from tasks.engine.plans import task_create

    plan = chain_plan(nodes)
    made = []
    for t in range(count):
        task = task_create(kind="bench", title=f"bench {label}.{t}", plan=plan, created_by="bench")
        lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=holder, ttl=timedelta(hours=1))
        made.append((task.pk, lease))
    return made


# ---------------------------------------------------------------------------------------------------------------
# The scratch database and the raw tables


@contextmanager
def scratch_database() -> Iterator[str]:
    """Create, migrate and finally drop a database beside the configured one; the default connection points at it
    meanwhile. PostgreSQL: ``bench_<name>_<pid>`` on the same server; SQLite: ``bench-<pid>.sqlite3`` in DATA_DIR."""
    conn = connections["default"]
    old_name = conn.settings_dict["NAME"]
    old_test = dict(conn.settings_dict.get("TEST") or {})
    if conn.vendor == "postgresql":
        name = f"bench_{old_name or 'reckon'}_{os.getpid()}"[:63]
    else:
        name = str(Path(settings.DATA_DIR) / f"bench-{os.getpid()}.sqlite3")
    conn.settings_dict["TEST"] = {**old_test, "NAME": name}
    try:
        created = conn.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
        try:
            yield created
        finally:
            conn.creation.destroy_test_db(old_name, verbosity=0)
            if conn.vendor == "sqlite":
                for suffix in ("-wal", "-shm"):
                    Path(created + suffix).unlink(missing_ok=True)
    finally:
        conn.settings_dict["TEST"] = old_test


RAW_TABLES = {
    "postgresql": (
        "CREATE TABLE bench_raw_task (id bigserial PRIMARY KEY, version bigint NOT NULL DEFAULT 0)",
        "CREATE TABLE bench_raw_intent (id bigserial PRIMARY KEY, task_id bigint NOT NULL REFERENCES bench_raw_task,"
        " node integer NOT NULL, op_key text NOT NULL UNIQUE, created_at timestamptz NOT NULL DEFAULT now())",
        "CREATE TABLE bench_raw_receipt (id bigserial PRIMARY KEY, intent_id bigint NOT NULL UNIQUE"
        " REFERENCES bench_raw_intent, remote_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    ),
    "sqlite": (
        "CREATE TABLE bench_raw_task (id integer PRIMARY KEY AUTOINCREMENT, version integer NOT NULL DEFAULT 0)",
        "CREATE TABLE bench_raw_intent (id integer PRIMARY KEY AUTOINCREMENT,"
        " task_id integer NOT NULL REFERENCES bench_raw_task, node integer NOT NULL, op_key text NOT NULL UNIQUE,"
        " created_at text NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        "CREATE TABLE bench_raw_receipt (id integer PRIMARY KEY AUTOINCREMENT,"
        " intent_id integer NOT NULL UNIQUE REFERENCES bench_raw_intent, remote_id text NOT NULL,"
        " created_at text NOT NULL DEFAULT CURRENT_TIMESTAMP)",
    ),
}


def _pg_params(settings_dict: dict[str, Any], dbname: str) -> dict[str, Any]:
    params: dict[str, Any] = {"dbname": dbname}
    for key, param in (("HOST", "host"), ("PORT", "port"), ("USER", "user"), ("PASSWORD", "password")):
        if settings_dict.get(key):
            params[param] = settings_dict[key]
    options = settings_dict.get("OPTIONS") or {}
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "options", "passfile", "service"):
        if key in options:
            params[key] = options[key]
    return params


# ---------------------------------------------------------------------------------------------------------------
# The worker processes


def _worker_main(
    index: int, db_name: str, inbox: Any, results: Any, barriers: dict[int, Barrier]
) -> None:  # pragma: no cover - runs in a spawned process (exercised by tests/test_bench.py)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    settings.DEBUG = False  # as in production: no query log (CursorDebugWrapper) on the measured path
    settings.DATABASES["default"]["NAME"] = db_name
    connections["default"].settings_dict["NAME"] = db_name
    try:
        worker = _Worker(index, db_name)
    except Exception:
        results.put({"worker": index, "error": traceback.format_exc()})
        return
    results.put({"worker": index, "ready": True})
    while True:
        job = inbox.get()
        if job is None:
            break
        mode, size, payload = job
        barrier = barriers[size]
        try:
            barrier.wait(BARRIER_TIMEOUT)
            if mode == "reckon":
                result = worker.run_reckon(payload)
            else:
                result = worker.run_raw(payload, shared=mode == "shared")
        except Exception:
            result = {"error": traceback.format_exc()}
        result["worker"] = index
        results.put(result)
    worker.close()


class _Worker:
    def __init__(self, index: int, db_name: str) -> None:
        from django.db import connection

        self.index = index
        self.django = connection
        self.vendor = connection.vendor
        connection.ensure_connection()
        settings_dict = connection.settings_dict
        self.raw: Any
        if self.vendor == "postgresql":
            import psycopg

            self.raw = psycopg.connect(**_pg_params(settings_dict, db_name), autocommit=True)
        else:
            options = settings_dict.get("OPTIONS") or {}
            self.raw = sqlite3.connect(db_name, timeout=float(options.get("timeout", 5)), isolation_level=None)
            self.raw.execute("PRAGMA foreign_keys = ON")  # as Django's connections do
            for command in str(options.get("init_command", "")).split(";"):
                if command.strip():
                    self.raw.execute(command.strip())
            self.begin = f"BEGIN {options.get('transaction_mode') or ''}".strip()
        self._flush_stats()

    def _flush_stats(self, raw: bool = True, django: bool = True) -> None:
        """Make this process's backends publish their pending statistics now (PostgreSQL buffers them); after a
        run, only the connection the run used has any: one read-only transaction, which the parent subtracts."""
        if self.vendor != "postgresql":
            return
        if raw:
            self.raw.execute("SELECT pg_stat_force_next_flush()")
        if django:
            with self.django.cursor() as cursor:
                cursor.execute("SELECT pg_stat_force_next_flush()")

    def close(self) -> None:
        self.raw.close()
        self.django.close()

    def _changes(self) -> int:
        if self.vendor == "sqlite":
            return int(self.raw.total_changes) + int(self.django.connection.total_changes)
        return 0

    def run_raw(self, payload: dict[str, Any], *, shared: bool = False) -> dict[str, Any]:
        """The raw limit: per step, commit 1 inserts an intent, commit 2 a receipt and moves the version. ``shared``:
        the same rows, with commit 2 of one step also inserting the next step's intent, as Reckon's worker shares
        commits along a chain (n + 1 commits for n steps)."""
        if shared:
            return self._run_raw_shared(payload)
        nodes: int = payload["nodes"]
        changes = self._changes()
        statements = transactions = 0
        cpu, started = time.process_time(), time.monotonic()
        if self.vendor == "postgresql":
            cur = self.raw.cursor()
            for task_id in payload["tasks"]:
                for node in range(nodes):
                    with self.raw.transaction():  # commit 1: the intent
                        cur.execute(
                            "INSERT INTO bench_raw_intent (task_id, node, op_key) VALUES (%s, %s, %s) RETURNING id",
                            (task_id, node, f"{task_id}:{node}"),
                        )
                        intent_id = cur.fetchone()[0]
                    with self.raw.transaction():  # commit 2: the receipt and the version
                        cur.execute(
                            "INSERT INTO bench_raw_receipt (intent_id, remote_id) VALUES (%s, %s)",
                            (intent_id, f"bench:{task_id}:{node}"),
                        )
                        cur.execute(
                            "UPDATE bench_raw_task SET version = version + 1 WHERE id = %s AND version = %s",
                            (task_id, node),
                        )
                        if cur.rowcount != 1:
                            raise BenchError(f"raw task {task_id}: version {node} moved under the writer")
                    statements += 3
                    transactions += 2
        else:
            db = self.raw
            for task_id in payload["tasks"]:
                for node in range(nodes):
                    db.execute(self.begin)  # commit 1: the intent
                    intent_id = db.execute(
                        "INSERT INTO bench_raw_intent (task_id, node, op_key) VALUES (?, ?, ?) RETURNING id",
                        (task_id, node, f"{task_id}:{node}"),
                    ).fetchone()[0]
                    db.execute("COMMIT")
                    db.execute(self.begin)  # commit 2: the receipt and the version
                    db.execute(
                        "INSERT INTO bench_raw_receipt (intent_id, remote_id) VALUES (?, ?)",
                        (intent_id, f"bench:{task_id}:{node}"),
                    )
                    moved = db.execute(
                        "UPDATE bench_raw_task SET version = version + 1 WHERE id = ? AND version = ?", (task_id, node)
                    ).rowcount
                    if moved != 1:
                        db.execute("ROLLBACK")
                        raise BenchError(f"raw task {task_id}: version {node} moved under the writer")
                    db.execute("COMMIT")
                    statements += 3
                    transactions += 2
        return self._raw_result(payload, started, cpu, statements, transactions, changes)

    def _run_raw_shared(self, payload: dict[str, Any]) -> dict[str, Any]:
        nodes: int = payload["nodes"]
        changes = self._changes()
        statements = transactions = 0
        intent_sql, receipt_sql, version_sql = (
            sql if self.vendor == "postgresql" else sql.replace("%s", "?") for sql in _SHARED_RAW_SQL
        )
        cur = self.raw.cursor()
        cpu, started = time.process_time(), time.monotonic()
        for task_id in payload["tasks"]:
            with self._raw_transaction(cur):  # the first step's intent
                cur.execute(intent_sql, (task_id, 0, f"{task_id}:0"))
                intent_id = cur.fetchone()[0]
            statements, transactions = statements + 1, transactions + 1
            for node in range(nodes):
                with self._raw_transaction(cur):  # this step's receipt and version, and the next step's intent
                    cur.execute(receipt_sql, (intent_id, f"bench:{task_id}:{node}"))
                    cur.execute(version_sql, (task_id, node))
                    if cur.rowcount != 1:
                        raise BenchError(f"raw task {task_id}: version {node} moved under the writer")
                    statements += 2
                    if node + 1 < nodes:
                        cur.execute(intent_sql, (task_id, node + 1, f"{task_id}:{node + 1}"))
                        intent_id = cur.fetchone()[0]
                        statements += 1
                transactions += 1
        return self._raw_result(payload, started, cpu, statements, transactions, changes)

    def _raw_result(
        self, payload: dict[str, Any], started: float, cpu: float, statements: int, transactions: int, changes: int
    ) -> dict[str, Any]:
        """A raw run's figures, taken once its loop ended (``cpu``: process time at its start)."""
        ended, cpu = time.monotonic(), time.process_time() - cpu
        steps = len(payload["tasks"]) * payload["nodes"]
        self._flush_stats(django=False)
        return {
            "started": started,
            "ended": ended,
            "cpu": cpu,
            "steps": steps,
            "statements": statements,
            "transactions": transactions,
            "commits": transactions,  # every raw transaction writes
            "iterations": steps,
            "rows": self._changes() - changes,
        }

    @contextmanager
    def _raw_transaction(self, cur: Any) -> Iterator[None]:
        if self.vendor == "postgresql":
            with self.raw.transaction():
                yield
            return
        cur.execute(self.begin)
        try:
            yield
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def run_reckon(self, payload: dict[str, Any]) -> dict[str, Any]:
        from tasks.engine.runner import run_steps

        connector = BenchConnector()
        counter = StatementCounter(self.django)
        nodes: int = payload["nodes"]
        failures: list[str] = []
        iterations = 0
        changes = self._changes()
        cpu, started = time.process_time(), time.monotonic()
        with counter.installed():
            for task_id, lease in payload["tasks"]:
                report = run_steps(task_id=task_id, lease=lease, connector=connector, max_steps=4 * nodes + 20)
                iterations += report.steps
                kind = report.directive.kind if report.directive else "none"
                if kind != "done" or report.stopped_by:
                    reason = report.directive.reason if report.directive else ""
                    failures.append(f"task {task_id}: {kind} {reason} {report.stopped_by}".strip())
        ended, cpu = time.monotonic(), time.process_time() - cpu
        rows = self._changes() - changes
        self._flush_stats(raw=False)
        if failures:
            raise BenchError("run_steps did not complete every task: " + "; ".join(failures[:5]))
        return {
            "started": started,
            "ended": ended,
            "cpu": cpu,
            "steps": len(payload["tasks"]) * nodes,
            "statements": counter.statements,
            "transactions": counter.transactions,
            "commits": counter.commits,
            "iterations": iterations,
            "rows": rows,
        }


class StatementCounter:
    """Counts what the Django connection sends: statements (BEGIN aside), explicit transactions, and commits that
    wrote something (a transaction with a write, or a write in autocommit — a compare-and-set's batch, ``WITH …``
    data-modifying CTEs, included)."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements = self.transactions = self.commits = 0
        self._dirty = False

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        head = sql.lstrip()[:7].upper()
        if head.startswith("BEGIN"):  # SQLite's explicit BEGIN; on PostgreSQL the driver sends it, unseen
            return execute(sql, params, many, context)
        self.statements += 1
        if head.startswith(self.WRITES) or (head.startswith("WITH") and any(w in sql for w in self.WRITES)):
            if self.conn.in_atomic_block or not self.conn.get_autocommit():
                self._dirty = True
            else:
                self.commits += 1
        return execute(sql, params, many, context)

    @contextmanager
    def installed(self) -> Iterator[None]:
        commit, rollback = self.conn.commit, self.conn.rollback

        def counted_commit() -> None:
            self.transactions += 1
            self.commits += 1 if self._dirty else 0
            self._dirty = False
            commit()

        def counted_rollback() -> None:
            self.transactions += 1
            self._dirty = False
            rollback()

        self.conn.commit, self.conn.rollback = counted_commit, counted_rollback
        try:
            with self.conn.execute_wrapper(self):
                yield
        finally:
            del self.conn.commit, self.conn.rollback  # the class's methods again


class _Pool:
    """Worker processes, started once (spawn: each sets Django up and opens its own connections)."""

    def __init__(self, size: int, worker_counts: Sequence[int], db_name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.barriers = {w: ctx.Barrier(w + 1) for w in set(worker_counts)}
        self.results: Any = ctx.Queue()
        self.inboxes: list[Any] = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(
                target=_worker_main,
                args=(i, db_name, self.inboxes[i], self.results, self.barriers),
                name=f"reckon-bench-{i}",
                daemon=True,
            )
            for i in range(size)
        ]
        for proc in self.procs:
            proc.start()
        try:
            self._collect(size, timeout=BARRIER_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def _collect(self, count: int, timeout: float) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            try:
                got.append(self.results.get(timeout=1.0))
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise BenchError(f"bench worker(s) died: {', '.join(dead)}") from None
                if time.monotonic() > deadline:
                    raise BenchError(f"bench workers did not answer within {timeout:.0f}s") from None
        errors = [r["error"] for r in got if "error" in r]
        if errors:
            raise BenchError("a bench worker failed:\n" + errors[0])
        return got

    def run(self, mode: str, payloads: list[dict[str, Any]], before_start: Callable[[], None]) -> list[dict[str, Any]]:
        """Hand the workers their payloads; ``before_start`` runs once they are all waiting; then start them."""
        size = len(payloads)
        for inbox, payload in zip(self.inboxes, payloads, strict=False):
            inbox.put((mode, size, payload))
        before_start()
        try:
            self.barriers[size].wait(BARRIER_TIMEOUT)
        except threading.BrokenBarrierError as exc:
            raise BenchError("the bench workers did not all start") from exc
        return self._collect(size, timeout=24 * 3600)

    def close(self) -> None:
        for inbox, proc in zip(self.inboxes, self.procs, strict=True):
            if proc.is_alive():
                inbox.put(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)


# ---------------------------------------------------------------------------------------------------------------
# CPU on this machine (Linux /proc): with more workers than cores the steps compete for the same CPU, clients and
# server together, and the throughput ratio follows the whole machine's CPU per step, not the client's alone.


def machine_cpu_seconds() -> float | None:
    """The CPU time this machine has spent busy since boot (user, nice, system, irq, softirq: all cores), or None
    without /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (fields + [0] * 7)[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def processes_cpu_seconds(named: Callable[[str], bool]) -> float | None:
    """The CPU time (user and system) of the running processes whose name ``named`` accepts, or None without
    /proc. A process that ends between two readings takes its time with it: read around work whose processes live
    through it (the server's)."""
    if not Path("/proc/self/stat").exists():
        return None
    total = 0.0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (found := process_cpu(entry.name)) is not None and named(found[0]):
            total += found[1]
    return total


def process_cpu(pid: int | str) -> tuple[str, float] | None:
    """Process ``pid``'s name and CPU time (user and system, seconds) from /proc, or None (no such process here)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:  # ended, or another machine's
        return None
    name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
    return name, (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15 of proc(5)


def _local_server(settings_dict: dict[str, Any]) -> bool:
    """Whether the database server runs on this machine (its processes' CPU can be read)."""
    host = str(settings_dict.get("HOST") or "")
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


def _is_postgres(name: str) -> bool:
    return name.startswith(("postgres", "postmaster"))


# ---------------------------------------------------------------------------------------------------------------
# Server statistics (PostgreSQL)


class _PgStats:
    """Reads pg_stat_database and pg_stat_wal from a connection to the ``postgres`` database (not the bench's)."""

    SNAPSHOT = (
        "SELECT (SELECT json_object_agg(datname, json_build_array(xact_commit, tup_inserted, tup_updated))"
        " FROM pg_stat_database WHERE datname IS NOT NULL),"
        " w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_sync, pg_stat_force_next_flush() FROM pg_stat_wal w"
    )

    def __init__(self, settings_dict: dict[str, Any], bench_db: str) -> None:
        import psycopg

        self.bench_db = bench_db
        self.conn = psycopg.connect(**_pg_params(settings_dict, "postgres"), autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def snapshot(self) -> dict[str, Any]:
        row = self.conn.execute(self.SNAPSHOT).fetchone()
        assert row is not None  # noqa: S101 - pg_stat_wal has one row
        dbs, records, fpi, wal_bytes, syncs, _ = row
        return {"dbs": dbs, "wal_records": records, "wal_fpi": fpi, "wal_bytes": int(wal_bytes), "wal_sync": syncs}

    def settings(self) -> dict[str, str]:
        rows = self.conn.execute(
            "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name = ANY(%s)", (list(PG_SETTINGS),)
        ).fetchall()
        return dict(sorted(rows))

    def version(self) -> str:
        row = self.conn.execute("SELECT version()").fetchone()
        return str(row[0]) if row else "?"

    def delta(self, before: dict[str, Any], after: dict[str, Any], flushes: int) -> dict[str, float]:
        """What the bench database did between two snapshots; ``flushes``: the workers' read-only flush calls."""
        b, a = before["dbs"].get(self.bench_db, [0, 0, 0]), after["dbs"][self.bench_db]
        others = sum(v[0] - before["dbs"].get(k, [0])[0] for k, v in after["dbs"].items() if k != self.bench_db)
        return {
            "xact_commit": a[0] - b[0] - flushes,
            "rows": (a[1] - b[1]) + (a[2] - b[2]),
            "wal_records": after["wal_records"] - before["wal_records"],
            "wal_fpi": after["wal_fpi"] - before["wal_fpi"],
            "wal_bytes": after["wal_bytes"] - before["wal_bytes"],
            "wal_sync": after["wal_sync"] - before["wal_sync"],
            "other_db_commits": max(others - 1, 0),  # the first snapshot's own transaction, in "postgres"
        }


# ---------------------------------------------------------------------------------------------------------------
# The bench


def raw_payloads(workers: int, tasks: int, nodes: int) -> list[dict[str, Any]]:
    """Each worker's rows of the raw loops' task table (RAW_TABLES), made by this process in one transaction."""
    from django.db import connection, transaction

    payloads = []
    with transaction.atomic(), connection.cursor() as cursor:
        for _ in range(workers):
            mine = []
            for _ in range(tasks):
                cursor.execute("INSERT INTO bench_raw_task (version) VALUES (0) RETURNING id")
                mine.append(int(cursor.fetchone()[0]))
            payloads.append({"nodes": nodes, "tasks": mine})
    return payloads


@dataclass
class _Bench:
    config: BenchConfig
    db_name: str
    vendor: str
    pool: _Pool
    stats: _PgStats | None
    log: Callable[[str], None]
    local_server: bool = False  # the database server's processes run on this machine (their CPU is read)
    runs: list[dict[str, Any]] = field(default_factory=list)
    batch: int = 0

    def _flush_parent(self) -> None:
        from django.db import connection

        if self.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_force_next_flush()")

    def _reckon_payloads(self, workers: int, tasks: int) -> tuple[list[dict[str, Any]], list[int]]:
        self.batch += 1
        payloads, ids = [], []
        for w in range(workers):
            mine = bench_tasks(tasks, self.config.nodes, label=f"{self.batch}.{w}", holder=f"bench-{w}")
            ids += [task_id for task_id, _lease in mine]
            payloads.append({"nodes": self.config.nodes, "tasks": mine})
        return payloads, ids

    def _raw_payloads(self, workers: int, tasks: int) -> list[dict[str, Any]]:
        return raw_payloads(workers, tasks, self.config.nodes)

    def run_once(self, mode: str, workers: int, tasks: int) -> dict[str, Any]:
        ids: list[int] = []
        if mode in RAW_MODES:
            payloads = self._raw_payloads(workers, tasks)
        else:
            payloads, ids = self._reckon_payloads(workers, tasks)
        self._flush_parent()
        before: dict[str, Any] = {}

        def snapshot() -> None:
            if self.stats:
                before.update(self.stats.snapshot())
            before["cpu"] = self._cpu()

        results = self.pool.run(mode, payloads, snapshot)
        cpu = [None if b is None or a is None else a - b for b, a in zip(before.pop("cpu"), self._cpu(), strict=True)]
        server = self.stats.delta(before, self.stats.snapshot(), flushes=workers) if self.stats else None
        if ids:
            self._check_completed(ids)
        return self._figures(mode, workers, results, server, cpu)

    def _cpu(self) -> tuple[float | None, float | None]:
        """(the machine's busy CPU seconds, the local PostgreSQL server's) now; None where it cannot be read."""
        server = processes_cpu_seconds(_is_postgres) if self.stats and self.local_server else None
        return machine_cpu_seconds(), server

    def _check_completed(self, ids: list[int]) -> None:
        from tasks.core.lifecycle import TaskStatus
        from tasks.models import Task

        left = list(Task.objects.filter(pk__in=ids).exclude(status=TaskStatus.COMPLETED).values_list("pk", "status"))
        if left:
            raise BenchError(f"{len(left)} bench task(s) did not complete: {left[:5]}")

    def _figures(
        self,
        mode: str,
        workers: int,
        results: list[dict[str, Any]],
        server: dict[str, float] | None,
        cpu: list[float | None],
    ) -> dict[str, Any]:
        steps = sum(r["steps"] for r in results)
        wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
        statements = sum(r["statements"] for r in results)
        transactions = sum(r["transactions"] for r in results)
        pg = server is not None
        figures: dict[str, Any] = {
            "mode": mode,
            "workers": workers,
            "steps": steps,
            "wall_s": wall,
            "steps_per_s": steps / wall,
            "cpu_ms_per_step": 1000 * sum(r["cpu"] for r in results) / steps,
            "machine_cpu_ms_per_step": None if cpu[0] is None else 1000 * cpu[0] / steps,
            "server_cpu_ms_per_step": None if cpu[1] is None else 1000 * cpu[1] / steps,
            "statements_per_step": statements / steps,
            "transactions_per_step": transactions / steps,
            "round_trips_per_step": (statements + 2 * transactions) / steps if pg else None,
            "commits_per_step": sum(r["commits"] for r in results) / steps,
            "loop_iterations_per_step": sum(r["iterations"] for r in results) / steps,
        }
        if server is not None:
            figures.update(
                xact_commit_per_step=server["xact_commit"] / steps,
                wal_syncs_per_step=server["wal_sync"] / steps,
                wal_records_per_step=server["wal_records"] / steps,
                wal_fpi_per_step=server["wal_fpi"] / steps,
                wal_bytes_per_step=server["wal_bytes"] / steps,
                rows_written_per_step=server["rows"] / steps,
                other_db_commits=server["other_db_commits"],
            )
        else:
            figures.update(dict.fromkeys(PG_ONLY))
            figures["rows_written_per_step"] = sum(r["rows"] for r in results) / steps
        return figures

    def profile(self, path: Path) -> None:
        from pyinstrument import Profiler

        from tasks.engine.runner import run_steps

        payloads, ids = self._reckon_payloads(1, self.config.tasks)
        connector = BenchConnector()
        profiler = Profiler(interval=0.0005)
        debug, settings.DEBUG = settings.DEBUG, False  # as the workers run
        try:
            profiler.start()
            for task_id, lease in payloads[0]["tasks"]:
                run_steps(task_id=task_id, lease=lease, connector=connector, max_steps=4 * self.config.nodes + 20)
            profiler.stop()
            payloads, more = self._reckon_payloads(1, self.config.tasks)
            with PhaseTimer() as phases:
                for task_id, lease in payloads[0]["tasks"]:
                    run_steps(task_id=task_id, lease=lease, connector=connector, max_steps=4 * self.config.nodes + 20)
        finally:
            settings.DEBUG = debug
        self._check_completed(ids + more)
        steps = len(ids) * self.config.nodes
        header = (
            f"Reckon step path, 1 worker in-process: {len(ids)} tasks x {self.config.nodes} nodes = {steps} steps\n"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            header
            + profiler.output_text(unicode=True, color=False)
            + "\n"
            + phases.table(len(more) * self.config.nodes)
        )


# The step path's functions that the profile's second table times (module, function, modules that import it by
# name). Timed by their own CPU (time.process_time_ns), inclusive, with one wrapper each: a sampling or tracing
# profiler inflates code of many small calls (pyinstrument put the webhook outbox's ORM read at ~8 % of a step,
# timed on its own it was ~5 %).
PHASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("tasks.engine.protocol", "record_outcome", ("tasks.engine.runner",)),
    ("tasks.engine.protocol", "operation_start", ("tasks.engine.runner",)),
    ("tasks.engine.snapshot", "task_snapshot", ("tasks.engine.runner", "tasks.engine.protocol")),
    ("tasks.engine.cas", "compare_and_set", ("tasks.engine.protocol",)),
    ("tasks.engine.sql", "Batch.run", ()),
    ("tasks.engine.events", "chain_event", ("tasks.engine.cas",)),
    ("tasks.decide.decisions", "settle", ()),
    ("tasks.decide.decisions", "next_start", ()),
    ("tasks.engine.cas", "project", ("tasks.engine.protocol",)),
    ("tasks.engine.snapshot", "after_write", ("tasks.engine.cas",)),
    ("tasks.engine.events", "event_appended", ("tasks.engine.cas",)),
    ("tasks.engine.events", "event_written", ("tasks.engine.cas",)),
)


class PhaseTimer:
    """Within its block, each function of PHASES (and the names other modules imported it under) is wrapped to add
    its calls' CPU and wall time; on leaving, every original is put back."""

    def __init__(self, phases: Sequence[tuple[str, str, tuple[str, ...]]] = PHASES) -> None:
        self.phases = phases
        self.cpu: dict[str, int] = {}
        self.wall: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.cpu_total = self.wall_total = 0
        self._restore: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> PhaseTimer:
        import importlib

        for module_name, qualname, importers in self.phases:
            owner: Any = importlib.import_module(module_name)
            *outer, name = qualname.split(".")
            for part in outer:
                owner = getattr(owner, part)
            original = getattr(owner, name)  # a phase that no longer exists fails here: keep PHASES with the code
            wrapped = self._wrap(f"{module_name}.{qualname}", original)
            self._patch(owner, name, wrapped)
            for importer in importers:
                module = importlib.import_module(importer)
                if getattr(module, name, None) is original:
                    self._patch(module, name, wrapped)
        self._started = (time.process_time_ns(), time.perf_counter_ns())
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_total = time.process_time_ns() - self._started[0]
        self.wall_total = time.perf_counter_ns() - self._started[1]
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _wrap(self, label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        self.cpu[label] = self.wall[label] = self.calls[label] = 0

        def timed(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.process_time_ns(), time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                self.cpu[label] += time.process_time_ns() - cpu
                self.wall[label] += time.perf_counter_ns() - wall
                self.calls[label] += 1

        return timed

    def table(self, steps: int) -> str:
        lines = [
            f"CPU per step by function, inclusive (1 worker in process, {steps} steps;"
            f" all: {self.cpu_total / steps / 1e6:.3f} ms CPU, {self.wall_total / steps / 1e6:.3f} ms wall)",
            f"{'function':45} {'calls':>7} {'cpu ms':>8} {'wall ms':>8}",
        ]
        for label in sorted(self.cpu, key=lambda k: -self.cpu[k]):
            lines.append(
                f"{label:45} {self.calls[label] / steps:7.2f} {self.cpu[label] / steps / 1e6:8.3f}"
                f" {self.wall[label] / steps / 1e6:8.3f}"
            )
        return "\n".join(lines) + "\n"


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def python_reference_us(rounds: int = 5, loops: int = 2000) -> float:
    """The machine's speed at plain Python, in µs per loop of a fixed workload like the step's own (build a payload,
    write it as canonical JSON, hash it, read it back, walk it): the median of ``rounds``. Reckon's client CPU per
    step moves with it, the raw loop's (mostly libpq and the kernel) hardly, so a ratio read on a slower machine is
    lower for the same code: compare runs of different days by this figure first."""
    import hashlib

    def workload(i: int) -> int:
        payload = {
            "task": {"status": "running", "attempts_used": i},
            "nodes": {f"p1/n{n}": {"status": "succeeded", "attempts": 1, "output": {"count": 1}} for n in range(4)},
            "data": {"op_key": f"rk-{i:032x}-p1-n1-0", "by": "agent:bench"},
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()
        back = json.loads(text)
        return len(digest) + sum(len(str(v)) for node in back["nodes"].values() for v in node.values())

    times = []
    for _ in range(rounds):
        started = time.process_time()
        for i in range(loops):
            workload(i)
        times.append((time.process_time() - started) / loops * 1e6)
    return statistics.median(times)


def _environment(vendor: str, stats: _PgStats | None) -> dict[str, Any]:
    import django

    env: dict[str, Any] = {
        "vendor": vendor,
        "python": platform.python_version(),
        "django": django.get_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "django_debug": False,  # the workers and the profile run with DEBUG off, as in production
        "python_reference_us": python_reference_us(),
    }
    if stats is not None:
        import psycopg

        env["psycopg"] = psycopg.__version__
        env["database"] = stats.version()
        env["settings"] = stats.settings()
    else:
        from django.db import connection

        with connection.cursor() as cursor:
            pragmas = {}
            for pragma in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys"):
                cursor.execute(f"PRAGMA {pragma}")
                pragmas[pragma] = str(cursor.fetchone()[0])
        env["database"] = f"SQLite {sqlite3.sqlite_version}"
        env["settings"] = pragmas
    return env


def _durability_warnings(env: dict[str, Any]) -> list[str]:
    s = env["settings"]
    if env["vendor"] == "postgresql":
        return [
            f"{name} is {s.get(name)}: commits are not durable"
            for name in ("fsync", "synchronous_commit")
            if s.get(name) == "off"
        ]
    if s.get("synchronous") in ("0", "1"):  # OFF, NORMAL: WAL mode syncs at checkpoints, not at commit
        return [
            f"SQLite synchronous={s['synchronous']} (journal_mode={s.get('journal_mode')}): commits are not fsynced "
            "(safe across a process crash, not a power loss), for raw and Reckon alike"
        ]
    return []


def run_bench(config: BenchConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the bench in a scratch database and return its report (also written to ``config.json_path``)."""
    config.check()
    vendor = connections["default"].vendor
    if vendor not in RAW_TABLES:
        raise BenchError(f"no raw limit for the {vendor} backend")
    settings_dict = dict(connections["default"].settings_dict)
    if vendor == "postgresql":  # refuse before creating anything
        probe = _PgStats(settings_dict, "")
        try:
            pg_settings = probe.settings()
        finally:
            probe.close()
        nondurable = [n for n in ("fsync", "synchronous_commit") if pg_settings.get(n) == "off"]
        if nondurable and not config.allow_nondurable:
            raise BenchError(
                f"{' and '.join(nondurable)} off on this server: commits are not durable, so the figures"
                " would not be Reckon's; pass --allow-nondurable to measure anyway (flagged)"
            )
    started_at = datetime.now(UTC)
    with scratch_database() as db_name:
        from django.db import connection

        with connection.cursor() as cursor:
            for ddl in RAW_TABLES[vendor]:
                cursor.execute(ddl)
        stats = _PgStats(settings_dict, db_name) if vendor == "postgresql" else None
        try:
            env = _environment(vendor, stats)
            log(f"bench: {env['database']}; starting {max(config.workers)} worker processes")
            pool = _Pool(max(config.workers), config.workers, db_name)
            try:
                bench = _Bench(config, db_name, vendor, pool, stats, log, _local_server(settings_dict))
                for mode in MODES:  # warm-up: imports, caches, prepared statements; not recorded
                    bench.run_once(mode, max(config.workers), 1)
                for r in range(config.rounds):
                    # The machine's speed now: a shared machine's moves within minutes (cpu refs, below).
                    reference = python_reference_us(rounds=3, loops=1000)
                    for workers in config.workers:
                        for mode in MODES:
                            run = bench.run_once(mode, workers, config.tasks)
                            run["round"] = r + 1
                            run["reference_us"] = reference
                            run["cpu_reference_loops_per_step"] = 1000 * run["cpu_ms_per_step"] / reference
                            bench.runs.append(run)
                            log(f"  round {r + 1} {mode:6} {workers} worker(s): {run['steps_per_s']:8.1f} steps/s")
                profile_path = None
                if config.profile:
                    json_path = config.json_path or Path(settings.DATA_DIR) / "bench.json"
                    profile_path = json_path.with_name(json_path.stem + ".profile.txt")
                    bench.profile(profile_path)
            finally:
                pool.close()
        finally:
            if stats:
                stats.close()
    report = _report(config, env, bench.runs, started_at, profile_path)
    if config.json_path:
        config.json_path.parent.mkdir(parents=True, exist_ok=True)
        config.json_path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return report


def _report(
    config: BenchConfig, env: dict[str, Any], runs: list[dict[str, Any]], started_at: datetime, profile: Path | None
) -> dict[str, Any]:
    figures: dict[str, dict[str, dict[str, Any]]] = {mode: {} for mode in MODES}
    ratios: dict[str, dict[str, Any]] = {}
    ratios_shared: dict[str, dict[str, Any]] = {}
    for workers in config.workers:
        cell = {m: [r for r in runs if r["mode"] == m and r["workers"] == workers] for m in MODES}
        for mode, mine in cell.items():
            figures[mode][str(workers)] = {f: _median([r[f] for r in mine]) for f in FIGURES}
        for base, into in (("raw", ratios), ("shared", ratios_shared)):
            # Throughput: the median of each round's ratio (they ran back to back); the rest: ratio of medians.
            paired = [k["steps_per_s"] / w["steps_per_s"] for w, k in zip(cell[base], cell["reckon"], strict=True)]
            limit, reckon = figures[base][str(workers)], figures["reckon"][str(workers)]
            into[str(workers)] = {
                f: (reckon[f] / limit[f] if reckon[f] is not None and limit[f] else None)
                for f in FIGURES
                if f not in ("steps", "wall_s", "other_db_commits")
            } | {"steps_per_s": statistics.median(paired)}
    goals = []
    for figure, workers, comparison, target, text in GOALS:
        if workers not in config.workers:
            goals.append({"goal": text, "target": target, "value": None, "met": None})
            continue
        value = ratios[str(workers)]["steps_per_s"] if figure == "ratio" else figures["reckon"][str(workers)][figure]
        met = value >= target if comparison == ">=" else value <= target
        goals.append({"goal": text, "target": target, "value": value, "met": met})
    waiting = None
    if 1 in config.workers:  # one worker runs its steps one after another: a step's wall time is CPU or waiting
        reckon, raw = figures["reckon"]["1"], figures["raw"]["1"]
        wait_ms = 1000 / reckon["steps_per_s"] - reckon["cpu_ms_per_step"]
        raw_ms = 1000 / raw["steps_per_s"]
        waiting = {
            "reckon_wait_ms_per_step": wait_ms,  # on the database and the kernel: not the client's CPU
            "raw_ms_per_step": raw_ms,
            "ratio_with_no_client_cpu": raw_ms / wait_ms if wait_ms > 0 else None,
        }
    warnings = _durability_warnings(env)
    if config.rounds < 3:
        warnings.append(f"only {config.rounds} round(s): the figures are not medians of 3 or more")
    others = max((r["other_db_commits"] or 0 for r in runs), default=0)
    if others:
        warnings.append(
            f"up to {others} commits in other databases during a measured window: the WAL figures"
            " (cluster-wide) include their writes, and the machine was not idle"
        )
    return {
        "schema": 1,
        "started_at": started_at.isoformat(),
        "step": "one node driven from ready to done: intent registered, call made, receipt recorded",
        "config": {
            "tasks_per_worker": config.tasks,
            "nodes": config.nodes,
            "rounds": config.rounds,
            "workers": list(config.workers),
        },
        "environment": env,
        "durable": not any("not durable" in w for w in warnings),
        "warnings": warnings,
        "figures": figures,
        "ratios": ratios,  # against the raw limit of the goals: two commits per step
        "ratios_shared": ratios_shared,  # against the raw loop that shares commits along a chain as Reckon does
        "goals": goals,
        "reference_us_rounds": _median([r.get("reference_us") for r in runs]),  # the machine during the rounds
        "one_worker_waiting": waiting,
        "runs": runs,
        "profile": str(profile) if profile else None,
    }


# ---------------------------------------------------------------------------------------------------------------
# The table

COLUMNS = (
    # (figure, header, format)
    ("steps_per_s", "steps/s", "{:.1f}"),
    ("cpu_ms_per_step", "cpu ms", "{:.3f}"),
    ("cpu_reference_loops_per_step", "cpu refs", "{:.1f}"),
    ("server_cpu_ms_per_step", "srv cpu", "{:.3f}"),
    ("machine_cpu_ms_per_step", "all cpu", "{:.3f}"),
    ("statements_per_step", "stmts", "{:.1f}"),
    ("round_trips_per_step", "trips", "{:.1f}"),
    ("transactions_per_step", "txns", "{:.2f}"),
    ("commits_per_step", "commits", "{:.2f}"),
    ("xact_commit_per_step", "xact", "{:.2f}"),
    ("wal_syncs_per_step", "wal syncs", "{:.2f}"),
    ("wal_records_per_step", "wal recs", "{:.1f}"),
    ("wal_bytes_per_step", "wal bytes", "{:.0f}"),
    ("rows_written_per_step", "rows", "{:.1f}"),
)


def format_report(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["config"]
    lines = [
        f"Reckon bench — {env['database']}",
        f"Python {env['python']}, Django {env['django']}"
        + (f", psycopg {env['psycopg']}" if "psycopg" in env else "")
        + f", {env['cpus']} CPUs, {env['platform']}",
        f"machine: {env['python_reference_us']:.1f} µs per Python reference loop (harness.bench.python_reference_us;"
        " Reckon's client CPU moves with it, the raw loop's hardly: compare days by it)",
        "settings: " + ", ".join(f"{k}={v}" for k, v in env["settings"].items()),
        f"{cfg['tasks_per_worker']} tasks per worker x {cfg['nodes']} nodes, {cfg['rounds']} rounds interleaved "
        "(raw, shared, Reckon, …), medians; a step = one node (start, call, receipt); figures per step",
    ]
    for warning in report["warnings"]:
        lines.append(f"!!! {warning}")
    vendor_pg = env["vendor"] == "postgresql"
    columns = [c for c in COLUMNS if vendor_pg or c[0] not in PG_ONLY]
    header = f"{'workers':>7}  {'':8}" + "".join(f"{h:>11}" for _, h, _ in columns)
    lines += ["", header, "-" * len(header)]
    for workers in cfg["workers"]:
        for mode in MODES:
            cell = report["figures"][mode][str(workers)]
            lines.append(f"{workers:>7}  {mode:8}" + "".join(f"{_fmt(fmt, cell[f]):>11}" for f, _, fmt in columns))
        for label, key in (("x raw", "ratios"), ("x shared", "ratios_shared")):
            ratio = report[key][str(workers)]
            lines.append(f"{'':>7}  {label:8}" + "".join(f"{_fmt('{:.2f}', ratio.get(f)):>11}" for f, _, _ in columns))
    lines.append("")
    lines.append(
        "shared: the raw loop with one step's receipt and the next step's intent in one commit, as Reckon's worker"
    )
    lines.append("steps/s x raw, x shared: median of the rounds' ratios; other x: ratio of the medians")
    lines.append("stmts, txns (explicit), commits (transactions that wrote): counted in the workers")
    lines.append(
        "cpu ms: the workers' own CPU; cpu refs: the same in Python reference loops timed before each round (the"
        " code's cost with the machine's speed taken out); all cpu: the whole machine's busy CPU over the run"
        " (/proc/stat: clients, server and the rest)"
        + ("; srv cpu: the PostgreSQL server's processes on this machine" if vendor_pg else "")
    )
    if vendor_pg:
        lines.append(
            "trips: stmts + BEGIN/COMMIT; xact: pg_stat_database.xact_commit incl. read-only; rows: tup_inserted +"
            " tup_updated; wal: pg_stat_wal (cluster-wide)"
        )
    else:
        lines.append("rows: total_changes of the workers' connections (inserts, updates, deletes)")
    waiting = report.get("one_worker_waiting")
    if waiting and waiting["ratio_with_no_client_cpu"] is not None:
        lines.append(
            f"1 worker: Reckon waits {waiting['reckon_wait_ms_per_step']:.3f} ms per step (wall - client CPU) against"
            f" the raw loop's {waiting['raw_ms_per_step']:.3f} ms step: with no client CPU at all the ratio would be"
            f" {waiting['ratio_with_no_client_cpu']:.2f}"
        )
    for goal in report["goals"]:
        if goal["met"] is None:
            lines.append(f"goal: {goal['goal']}: not measured")
        else:
            lines.append(f"goal: {goal['goal']}: {goal['value']:.2f} — {'met' if goal['met'] else 'NOT met'}")
    reference = report.get("reference_us_rounds")
    one = report["figures"]["reckon"].get("1", {}).get("cpu_reference_loops_per_step")
    if reference and one is not None:
        lines.append(
            f"machine during the rounds: {reference:.1f} µs per reference loop (median); Reckon's step cost"
            f" {one:.1f} loops of client CPU (1 worker), and the CPU goal's 2 ms is {2000 / reference:.1f} loops"
            " on this machine: a slower machine asks the same code for less"
        )
    if report["profile"]:
        lines.append(f"profile: {report['profile']}")
    return "\n".join(lines)


def _fmt(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: ./dev manage bench")
