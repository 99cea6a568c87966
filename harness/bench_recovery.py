"""The recovery and scan benchmarks: what a crash of every worker costs, and what the recovery scan costs
beside a large history.

    ./dev manage bench recovery               # 1,000 reference tasks, every worker SIGKILLed mid-run
    ./dev manage bench scan                   # the scan with 1,000 pending tasks beside 1,000 and 1,000,000 finished

**Recovery** (``run_recovery``): in a scratch database, with the simulator and Celery solo workers of
harness/killmatrix.py, ``tasks`` reference tasks (``migrate_project``) run twice in the same run: *uncrashed* — woken
once each, with a recovery scan every 2 s on its own queue, as beat sends it — and *crashed* — the same, but once
half of their side effects are counted by the simulator every worker is SIGKILLed and fresh ones are started. Each
figure is the seconds from the first wake-up to every task done; the ratio crashed / uncrashed is the recovery's
cost (goal ≤ 2). The simulator's counts are then judged as the kill matrix judges them (duplicates, unknowns,
skipped steps, wrong final states): any of them fails the run.

**Scan** (``run_scan``): the reads of one recovery scan (``tasks.jobs.recovery_scan``: tasks_needing_work() of the
registered kinds, and bulk_runs_stalled()) timed with ``pending`` waiting tasks beside ``small`` finished tasks, then
beside ``large`` (goal: within 1.5x), each the median of ``repeat`` runs after a warm one. The finished tasks are
written by INSERT … SELECT over a generated series, as a real finished task leaves them: the task (completed), its
released lease, its wake-up row, and a temp resource deleted by a committed cleanup operation with its receipt (node,
operation, receipt, resource) — every constraint and foreign key holds; no event is written (the scan reads none,
and the event log's triggers refuse only updates and deletes). The query plans are printed (PostgreSQL: EXPLAIN
ANALYZE; SQLite: EXPLAIN QUERY PLAN) with the tables each reads whole ("full scans"), which must be none of the
large ones.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction

FILL_BATCH = 100_000
MAX_BATCH = 10  # objects per copy batch, as the kill matrix
# Tables that grow with the finished history: a plan that reads one of them whole does not scale.
HISTORY_TABLES = (
    "tasks_task",
    "leases_lease",
    "tasks_taskwakeup",
    "tasks_tempresource",
    "tasks_operation",
    "tasks_receipt",
    "tasks_node",
)


class RecoveryBenchError(RuntimeError):
    """The benchmark could not measure, or what it measured broke an invariant (a duplicate, a task not done)."""


# ---------------------------------------------------------------------------------------------------------------
# Filling the history fast


def _series(n: int) -> str:
    """A relation ``s(i)`` of 1..n on this backend."""
    if connection.vendor == "postgresql":
        return f"generate_series(1, {int(n)}) AS s(i)"
    recursive = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < %d) SELECT i FROM r"
    return f"({recursive % int(n)}) AS s"


def _uid() -> str:
    return "gen_random_uuid()" if connection.vendor == "postgresql" else "lower(hex(randomblob(16)))"


def insert_tasks(n: int, *, status: str, tag: str, kind: str = "migrate_project") -> None:
    """``n`` task rows of ``status`` in one INSERT … SELECT, titled ``<tag> <i>`` (no plan: the scan reads none)."""
    now = connection.ops.adapt_datetimefield_value(_now())
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_task (uid, kind, title, project, status, status_reason, status_detail, version,"  # noqa: S608
            " log_head, plan_version, input_refs, attempt_budget, attempts_used, inputs_recheck_required,"
            " cancel_requested_at, cancel_requested_by, cancel_reason, created_by, created_at, updated_at)"
            f" SELECT {_uid()}, %s, %s || ' ' || CAST(i AS TEXT), '', %s, '', '', 1, %s, 1, '{{}}', 10, 0,"
            f" %s, NULL, '', '', 'bench', %s, %s FROM {_series(n)}",
            [kind, tag, status, "0" * 64, False, now, now],
        )


def fill_finished(n: int, *, log: Callable[[str], None] = print) -> float:
    """Add ``n`` finished tasks with what a real one leaves that the scan could read (see the module's doc), in
    transactions of FILL_BATCH tasks; return the seconds it took."""
    started = time.monotonic()
    done = 0
    while done < n:
        size = min(FILL_BATCH, n - done)
        tag = f"finished-{uuid.uuid4().hex[:8]}"
        with transaction.atomic():
            _fill_batch(size, tag)
        done += size
        if n > FILL_BATCH:
            log(f"  filled {done:,} of {n:,} finished tasks ({time.monotonic() - started:.0f} s)")
    return time.monotonic() - started


def _fill_batch(n: int, tag: str) -> None:
    now = connection.ops.adapt_datetimefield_value(_now())
    later = connection.ops.adapt_datetimefield_value(_now() + timedelta(seconds=30))
    insert_tasks(n, status="completed", tag=tag)
    mine = "SELECT id FROM tasks_task WHERE title LIKE %s"
    like = [f"{tag} %"]
    statements: list[tuple[str, list[Any]]] = [
        (
            "INSERT INTO leases_lease (holder_kind, holder_id, task_version_at_grant, granted_at, expires_at,"  # noqa: S608 - fixed text and our own subquery
            " renewal_seq, epoch, released_at, release_reason, task_id, ttl)"
            f" SELECT 'agent', 'bench', 1, %s, %s, 0, 1, %s, 'released', t.id, NULL FROM tasks_task t"
            f" WHERE t.id IN ({mine})",
            [now, later, now, *like],
        ),
        (
            "INSERT INTO tasks_taskwakeup (task_id, queued_version, queued_until, remote_down_tries,"  # noqa: S608 - fixed text and our own subquery
            " remote_down_since, remote_next_ask_at, queued_count, deduplicated_count)"
            f" SELECT t.id, NULL, NULL, 0, NULL, NULL, 1, 0 FROM tasks_task t WHERE t.id IN ({mine})",
            like,
        ),
        (
            "INSERT INTO tasks_node (plan_version, key, position, action, depends_on, input, evidence, on_failure,"  # noqa: S608 - fixed text and our own subquery
            " irreversible, compensation, rerun, definition_digest, status, max_attempts, attempts,"
            " last_error_class, last_attempt_at, next_allowed_action, not_before, output, approval_digest,"
            " approval_proposed_digest, approval_requests, approved_by, task_id)"
            " SELECT 1, 'stage', 0, 'store.copy_batch', '[]', '{}', '{}', '{}', %s, '', '', %s, 'succeeded', 3, 1,"
            f" '', %s, '', NULL, '{{}}', '', '', '{{}}', '', t.id FROM tasks_task t WHERE t.id IN ({mine})",
            [False, "sha256:" + "0" * 64, now, *like],
        ),
        (
            "INSERT INTO tasks_operation (op_key, action, target, request, request_digest, status, failure_class,"  # noqa: S608 - fixed text and our own subquery
            " failure_detail, remote_id, dispatch_count, registered_at, settled_at, compensates_id, node_id,"
            " task_id, settled_by, purpose)"
            " SELECT 'bench-fill:' || CAST(n.id AS TEXT), 'store.delete', '', '{}', %s, 'committed', '', '',"
            " 'deleted:' || CAST(n.id AS TEXT), 1, %s, %s, NULL, n.id, n.task_id, '', 'cleanup'"
            f" FROM tasks_node n WHERE n.task_id IN ({mine})",
            ["sha256:" + "0" * 64, now, now, *like],
        ),
        (
            "INSERT INTO tasks_receipt (remote_id, remote_version, count, digest, data, received_at,"  # noqa: S608 - fixed text and our own subquery
            " committed_after_cancel_request, operation_id)"
            " SELECT o.remote_id, '', 0, '', '{}', %s, %s, o.id FROM tasks_operation o"
            f" WHERE o.task_id IN ({mine})",
            [now, False, *like],
        ),
        (
            "INSERT INTO tasks_tempresource (locator, status, created_at, retention_until, cleanup_operation_id,"  # noqa: S608 - fixed text and our own subquery
            " cleanup_receipt_id, node_id, task_id)"
            " SELECT 'staging/' || CAST(o.task_id AS TEXT), 'deleted', %s, %s, o.id, r.id, o.node_id, o.task_id"
            f" FROM tasks_operation o JOIN tasks_receipt r ON r.operation_id = o.id WHERE o.task_id IN ({mine})",
            [now, later, *like],
        ),
    ]
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)


def _now() -> Any:
    from leases import clock

    return clock.now()


def analyze() -> None:
    """Refresh the planner's statistics, as autovacuum (PostgreSQL) or ``PRAGMA optimize`` (SQLite) would."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


# ---------------------------------------------------------------------------------------------------------------
# The scan benchmark


@dataclass(frozen=True)
class ScanConfig:
    pending: int = 1_000
    small: int = 1_000
    large: int = 1_000_000
    repeat: int = 7

    def check(self) -> None:
        if self.pending < 1 or self.small < 0 or self.repeat < 1:
            raise ValueError("--pending and --repeat must be at least 1, --small at least 0")
        if self.large <= self.small:
            raise ValueError("--large must be more than --small")


@dataclass
class ScanPoint:
    finished: int
    seconds: list[float]
    found: int
    plans: dict[str, str]
    full_scans: list[str]
    plans_no_seqscan: dict[str, str]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def scan_reads() -> tuple[Any, Any]:
    """The querysets the scan job evaluates (tasks.jobs.recovery_scan), unevaluated."""
    from leases import clock
    from tasks.engine.recovery import tasks_needing_work
    from tasks.engine.registry import known_kinds
    from tasks.models import BulkRun, BulkRunStatus
    from tasks.people.bulk import STALLED_AFTER_SECONDS

    now = clock.now()
    needing = tasks_needing_work(now).filter(kind__in=known_kinds()).values_list("pk", "version")
    cutoff = now - timedelta(seconds=STALLED_AFTER_SECONDS)  # as tasks.people.bulk.bulk_runs_stalled reads
    unfinished = [BulkRunStatus.PENDING, BulkRunStatus.RUNNING]
    stalled = BulkRun.objects.filter(status__in=unfinished, created_at__lt=cutoff).values_list("pk", flat=True)
    return needing, stalled


def _time_scan() -> tuple[float, int]:
    from leases import clock
    from tasks.engine.recovery import tasks_needing_work
    from tasks.engine.registry import known_kinds
    from tasks.people.bulk import bulk_runs_stalled

    started = time.perf_counter()
    seen = list(tasks_needing_work().filter(kind__in=known_kinds()).values_list("pk", "version"))
    bulk_runs_stalled(clock.now())
    return time.perf_counter() - started, len(seen)


def explain_scan(*, no_seqscan: bool = False) -> dict[str, str]:
    """The plans of the scan's reads: PostgreSQL EXPLAIN (ANALYZE, BUFFERS), SQLite EXPLAIN QUERY PLAN.

    ``no_seqscan`` (PostgreSQL): with ``enable_seqscan`` off, as the planner would choose with a large history —
    on small tables a sequential scan is cheapest and says nothing about whether an index can serve the query."""
    plans = {}
    with transaction.atomic():
        if no_seqscan and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL enable_seqscan = off")
        for name, qs in zip(("tasks_needing_work", "bulk_runs_stalled"), scan_reads(), strict=True):
            if connection.vendor == "postgresql":
                plans[name] = qs.explain(analyze=True, buffers=True)
            else:
                plans[name] = qs.explain()
    return plans


def full_reads(plan: str, finished: int) -> list[str]:
    """The history tables a plan reads whole: ``Seq Scan on t`` (PostgreSQL), ``SCAN t`` without an index (SQLite),
    or a node on ``t`` whose filter removed at least ``finished`` rows (PostgreSQL EXPLAIN ANALYZE: an index scan
    that walks the whole table and filters, as the primary key's under an OR it cannot use)."""
    found = set()
    node_table = ""
    for line in plan.splitlines():
        if match := re.search(r"\bon (\w+)(?: \S+)?\s+\(cost=", line):
            node_table = match.group(1)
            if "Seq Scan" in line and node_table in HISTORY_TABLES:
                found.add(node_table)
        elif (match := re.search(r"Rows Removed by Filter: (\d+)", line)) and node_table in HISTORY_TABLES:
            found |= {node_table} if finished and int(match.group(1)) >= finished else set()
        for table in HISTORY_TABLES:
            if re.search(rf"\bSCAN {table}\b(?! USING)", line):
                found.add(table)
    return sorted(found)


def _measure(finished: int, repeat: int, log: Callable[[str], None]) -> ScanPoint:
    analyze()
    _time_scan()  # warm: caches, the first query's compilation
    runs = [_time_scan() for _ in range(repeat)]
    plans = explain_scan()
    forced = explain_scan(no_seqscan=True) if connection.vendor == "postgresql" else plans
    reads = sorted({t for plan in forced.values() for t in full_reads(plan, finished)})
    point = ScanPoint(finished, [s for s, _ in runs], runs[0][1], plans, reads, forced)
    log(f"  beside {finished:>9,} finished: {1000 * point.median:8.2f} ms (median of {repeat}), {point.found} found")
    return point


def run_scan(config: ScanConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure the scan beside ``small`` then ``large`` finished tasks in a scratch database; return the report."""
    from harness.bench import scratch_database

    config.check()
    with scratch_database():
        vendor = connection.vendor
        log(f"scan bench: {vendor}; {config.pending:,} pending tasks")
        insert_tasks(config.pending, status="pending", tag="pending")
        fill_seconds = fill_finished(config.small, log=log)
        small = _measure(config.small, config.repeat, log)
        log(f"  filling to {config.large:,} finished tasks")
        fill_seconds += fill_finished(config.large - config.small, log=log)
        large = _measure(config.large, config.repeat, log)
        counts = _counts()
    if small.found != config.pending or large.found != config.pending:
        raise RecoveryBenchError(f"the scan found {small.found} and {large.found} tasks, not {config.pending}")
    return {
        "vendor": vendor,
        "config": config.__dict__,
        "fill_seconds": fill_seconds,
        "rows": counts,
        "small": _point(small),
        "large": _point(large),
        "ratio": large.median / small.median,
        "goal": {"text": "scan beside large within 1.5 x beside small", "met": large.median / small.median <= 1.5},
    }


def _counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in ("tasks_task", "leases_lease", "tasks_taskwakeup", "tasks_tempresource", "tasks_operation"):
            cursor.execute(f"SELECT COUNT(*) FROM {table}")  # noqa: S608 - our own table names
            counts[table] = int(cursor.fetchone()[0])
    return counts


def _point(point: ScanPoint) -> dict[str, Any]:
    return {
        "finished": point.finished,
        "median_s": point.median,
        "runs_s": point.seconds,
        "found": point.found,
        "plans": point.plans,
        "full_scans": point.full_scans,
        "plans_no_seqscan": point.plans_no_seqscan,
    }


def format_scan(report: dict[str, Any]) -> str:
    cfg, small, large = report["config"], report["small"], report["large"]
    lines = [
        f"Recovery scan — {report['vendor']}, {cfg['pending']:,} pending tasks, median of {cfg['repeat']} runs",
        f"  beside {small['finished']:>9,} finished: {1000 * small['median_s']:9.2f} ms",
        f"  beside {large['finished']:>9,} finished: {1000 * large['median_s']:9.2f} ms",
        f"  ratio: {report['ratio']:.2f} x (goal <= 1.5: {'met' if report['goal']['met'] else 'NOT met'})",
        f"  rows at the end: {', '.join(f'{t} {n:,}' for t, n in report['rows'].items())}",
    ]
    for point in (small, large):
        whole = ", ".join(point["full_scans"]) or "none"
        lines.append(f"  history tables read whole beside {point['finished']:,} (planner free of seq scans): {whole}")
    for name, plan in large["plans"].items():
        lines.append(f"  plan of {name} beside {large['finished']:,}:")
        lines += ["    " + line for line in plan.splitlines()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The recovery benchmark


@dataclass(frozen=True)
class RecoveryConfig:
    tasks: int = 1_000
    workers: int = 4
    lease_ttl: int = 3
    lease_grace: int = 1
    objects: int = 10  # per task: one copy batch
    kill_at: float = 0.5  # of the side effects counted by the simulator
    timeout: float = 1800.0
    uncrashed: bool = True  # False: the crashed phase alone (its invariants, no ratio: the test suite's run)

    def check(self) -> None:
        if self.tasks < 1 or self.workers < 1:
            raise ValueError("--tasks and --workers must be at least 1")
        if self.objects < 1:
            raise ValueError("--objects must be at least 1")
        if not 0 < self.kill_at < 1:
            raise ValueError("--kill-at is a fraction of the side effects, between 0 and 1")


@dataclass
class Phase:
    name: str
    tasks: int
    seconds: float = 0.0
    kills: int = 0
    killed_at_effects: int = 0
    row: Any = None
    problems: list[str] = field(default_factory=list)


@contextmanager
def _environment(config: RecoveryConfig, workdir: Path) -> Iterator[tuple[Any, Any, str]]:
    """A phase's own simulator (its state in memory, starting empty: the store costs the same in both phases; it
    is never restarted here, so it need not rewrite a state file at every write) and its own workers, on a queue of
    their own and its scan queue."""
    from harness import killmatrix

    workdir.mkdir(parents=True, exist_ok=True)
    store = killmatrix.StoreProcess(workdir / "store.json", persist=False)
    queue = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    env = os.environ | {
        "DATABASE_URL": killmatrix.database_url(),
        "RECKON_OBJECTSTORE_URL": store.url,
        "RECKON_FAILPOINTS": "",
        "RECKON_LEASE_TTL_SECONDS": str(config.lease_ttl),
        "RECKON_LEASE_GRACE_SECONDS": str(config.lease_grace),
        "RECKON_LOG_LEVEL": "WARNING",
    }
    workers = None
    try:
        workers = killmatrix.Workers(config.workers, queue, env, workdir / "workers.log")
        yield store, workers, queue
    finally:
        if workers is not None:
            workers.stop()
        store.stop()


def _create(store: Any, n: int, tag: str, objects: int) -> list[int]:
    from reference.objectstore import ObjectStoreConnector

    connector = ObjectStoreConnector(store.url)
    ids = []
    quiet = logging.getLogger("reckon")  # a line per task created and accepted says nothing here
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        for i in range(n):
            ids.append(_create_one(store, connector, f"{tag}-{i}", objects))
    finally:
        quiet.setLevel(level)
    return ids


def _create_one(store: Any, connector: Any, project: str, objects: int) -> int:
    from harness import killmatrix
    from reference import migrate_project

    source = killmatrix._source(project)
    store.call("/_sources", {"locator": source["locator"], "version": "1", "digest": source["digest"]})
    task = migrate_project.start(
        project=project, objects=objects, source=source, store=connector, max_batch=MAX_BATCH, created_by="bench"
    )
    return int(task.pk)


def _effects(store: Any) -> int:
    """Side effects the simulator counted (all of this phase's: it has a simulator of its own)."""
    return int(store.call("/_stats")["side_effects"])


def _run_phase(
    phase: Phase,
    store: Any,
    workers: Any,
    queue: str,
    ids: list[int],
    *,
    effects_per_task: int,
    kill_at: int | None,
    timeout: float,
) -> None:
    """Wake every task, scan every SCAN_EVERY s (on the scan queue), SIGKILL every worker once the simulator has
    counted ``kill_at`` side effects (then start fresh ones), until all are done; judge the simulator's counts."""
    from harness import killmatrix
    from tasks.jobs import drive_task

    scenario = killmatrix.Scenario(phase.name, phase.name, workers=len(workers.processes))
    workers.kills = 0
    started = time.monotonic()
    for task_id in ids:
        drive_task.apply_async((task_id,), queue=queue)
    killmatrix.send_scan(queue)
    last_scan = time.monotonic()
    deadline = started + timeout
    killed = kill_at is None
    base = _effects(store) if kill_at is not None else 0  # the warm-up's effects: not this phase's
    while not killmatrix._finished(ids, scenario):
        if time.monotonic() > deadline:
            phase.problems.append(f"not done within {timeout:.0f} s")
            break
        if kill_at is not None and not killed and (counted := _effects(store)) >= kill_at:
            for process in workers.processes:
                process.kill()  # SIGKILL, mid-call or mid-commit: wherever each one is
            for process in workers.processes:
                process.wait(10)
            phase.killed_at_effects = counted - base  # of this phase's
            workers.replace_dead()  # fresh workers, as a supervisor would start them
            killed = True
        if time.monotonic() - last_scan >= killmatrix.SCAN_EVERY:
            killmatrix.send_scan(queue)
            last_scan = time.monotonic()
        time.sleep(0.25 if killed else 0.01)  # before the kill, watch closely: a chain's commits go fast
    phase.seconds = time.monotonic() - started
    phase.kills = workers.kills
    row = killmatrix.Row(phase.name, len(ids))
    killmatrix._judge(row, scenario, ids, store.call("/_stats"))
    row.expected = len(ids) * effects_per_task  # the matrix's own figure assumes its 30 objects a task
    phase.row = row
    phase.problems += row.problems[:10]


def run_recovery(config: RecoveryConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Uncrashed, then crashed, in one scratch database, each phase with a simulator and workers of its own; return
    the report."""
    from django.conf import settings

    from harness import killmatrix
    from harness.bench import scratch_database

    config.check()
    effects_per_task = 3 + 2 * len(_batches(config.objects))
    with tempfile.TemporaryDirectory(prefix="reckon-bench-recovery-") as tmp, scratch_database():
        vendor = connection.vendor
        broker = settings.CELERY_BROKER_URL.split("://")[0]
        log(
            f"recovery bench: {vendor}, broker {broker}; {config.tasks} tasks, {config.workers} workers, leases "
            f"{config.lease_ttl} s + {config.lease_grace} s grace, a scan every {killmatrix.SCAN_EVERY:.0f} s"
        )
        phases = []
        for name, kill in (("uncrashed", False), ("crashed", True))[0 if config.uncrashed else 1 :]:
            with _environment(config, Path(tmp) / name) as (store, workers, queue):
                warm_ids = _create(store, config.workers, f"warm-{name}", config.objects)
                warm = Phase("warm-up", len(warm_ids))
                _run_phase(
                    warm, store, workers, queue, warm_ids, effects_per_task=effects_per_task, kill_at=None, timeout=120
                )
                if warm.problems:
                    raise RecoveryBenchError(f"the warm-up did not finish: {warm.problems[:3]}")
                ids = _create(store, config.tasks, f"{name}-{uuid.uuid4().hex[:6]}", config.objects)
                phase = Phase(name, len(ids))
                kill_at = _effects(store) + int(config.kill_at * effects_per_task * len(ids)) if kill else None
                _run_phase(
                    phase,
                    store,
                    workers,
                    queue,
                    ids,
                    effects_per_task=effects_per_task,
                    kill_at=kill_at,
                    timeout=config.timeout,
                )
            log(f"  {name:9}: {phase.seconds:8.1f} s, {phase.row.duplicates} duplicates, kills {phase.kills}")
            phases.append(phase)
    by_name = {p.name: p for p in phases}
    crashed, uncrashed = by_name["crashed"], by_name.get("uncrashed")
    ratio = crashed.seconds / uncrashed.seconds if uncrashed else None
    return {
        "vendor": vendor,
        "broker": broker,
        "config": config.__dict__,
        "effects_per_task": effects_per_task,
        "phases": [_phase(p) for p in phases],
        "ratio": ratio,
        "goal": {"text": "crashed within 2 x uncrashed", "met": ratio <= 2.0 if ratio is not None else None},
    }


def _batches(objects: int) -> list[Any]:
    from reference import migrate_project

    return list(migrate_project.batches(objects, MAX_BATCH))


def _phase(phase: Phase) -> dict[str, Any]:
    row = phase.row
    return {
        "name": phase.name,
        "tasks": phase.tasks,
        "seconds": phase.seconds,
        "kills": phase.kills,
        "killed_at_effects": phase.killed_at_effects,
        "effects_expected": row.expected,
        "effects_counted": row.counted,
        "duplicates": row.duplicates,
        "unknowns": row.unknowns,
        "skipped": row.skipped,
        "wrong": row.wrong,
        "ok": row.ok and not phase.problems,
        "problems": phase.problems,
    }


def recovery_failures(report: dict[str, Any]) -> list[str]:
    """What makes the run fail: a duplicate side effect, an unknown left, a skipped step, a task not done."""
    failures = []
    for p in report["phases"]:
        if p["duplicates"]:
            failures.append(f"{p['name']}: {p['duplicates']} duplicate side effects counted by the simulator")
        if not p["ok"]:
            failures.append(f"{p['name']}: {'; '.join(p['problems'][:3]) or 'not clean'}")
    crashed = next(p for p in report["phases"] if p["name"] == "crashed")
    if crashed["kills"] < report["config"]["workers"]:
        failures.append(f"crashed: {crashed['kills']} workers SIGKILLed, not {report['config']['workers']}")
    return failures


def format_recovery(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"Recovery after SIGKILL of every worker — {report['vendor']}, broker {report['broker']}",
        f"{cfg['tasks']} migrate_project tasks per phase ({report['effects_per_task']} side effects each),"
        f" {cfg['workers']} solo workers, leases {cfg['lease_ttl']} s + {cfg['lease_grace']} s grace,"
        " a recovery scan every 2 s on its own queue",
        f"{'phase':<10} {'seconds':>8} {'kills':>6} {'killed at':>10} {'effects exp':>11} {'counted':>8}"
        f" {'dups':>5} {'unknown':>8} {'skipped':>8} {'wrong':>6}",
    ]
    for p in report["phases"]:
        at = f"{p['killed_at_effects']}" if p["kills"] else "-"
        lines.append(
            f"{p['name']:<10} {p['seconds']:>8.1f} {p['kills']:>6} {at:>10} {p['effects_expected']:>11}"
            f" {p['effects_counted']:>8} {p['duplicates']:>5} {p['unknowns']:>8} {p['skipped']:>8} {p['wrong']:>6}"
        )
    if report["ratio"] is None:
        lines.append("crashed / uncrashed: not measured (the crashed phase alone)")
    else:
        met = "met" if report["goal"]["met"] else "NOT met"
        lines.append(f"crashed / uncrashed: {report['ratio']:.2f} x (goal <= 2: {met})")
    dups = sum(p["duplicates"] for p in report["phases"])
    lines.append(f"duplicate side effects counted by the simulator: {dups}")
    return "\n".join(lines)
