"""``./dev manage bench history`` — many tasks, long history: the hot tables, the recovery scan, the work queue and the
task page at 100,000 and at 10,000,000 events (goal: each within 1.5 x), with the archive step moving ended tasks'
events out as it does in production.

In a scratch database: ``live`` tasks still at work (pending, ``live_events`` events each) and two real tasks driven
through the step protocol — one completed long ago, whose log the archive moves and whose page is then read from the
archive, verify_log included; one still running. History then grows in cycles, as it would between two runs of the
beat's archive step: ``chunk`` finished tasks of ``per_task`` events each (nodes, events with payloads of a real
step's size) are written by INSERT … SELECT, ``archive_ended`` (the production service, not a copy of it) moves every
ended task's events, and the hot table is vacuumed as autovacuum would. At ``small`` and at ``large`` events in all
the run measures: each table's rows and bytes (PostgreSQL: table and indexes; SQLite: dbstat where compiled in), the
recovery scan's reads (harness/bench_recovery.py), the work queue's first page, the task page of the live task and
of the archived one (server time through Django's test client, logged in as an admin; each the median of ``runs``),
and verify_log of the archived task. Its figures: the ratio of each at ``large`` to ``small``.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import connection, transaction

from harness.bench import BenchConnector, chain_plan, scratch_database
from harness.bench_recovery import _series, _time_scan, analyze, insert_tasks

TABLES = ("tasks_event", "tasks_archivedevent", "tasks_task", "tasks_node")
# A step's event as the engine writes it, about this size (a registered operation or a settled one): the history's
# bytes are those of real events, not of empty ones.
PAYLOAD = (
    '{"task": {"version": 0, "status": "running"}, "operations": {"copy-batch-1:a1": {"status": "committed", '
    '"remote_id": "store-object-000000", "settled_at": "2026-01-01T00:00:00+00:00"}}, "nodes": {"p1/copy-batch-1": '
    '{"status": "succeeded", "attempts": 1}}, "data": {"op_key": "copy-batch-1:a1", "receipt": {"count": 100}}}'
)
EVENT_TYPES = ("operation_registered", "operation_dispatched", "node_succeeded", "lease_acquired")


@dataclass(frozen=True)
class HistoryConfig:
    small: int = 100_000
    large: int = 10_000_000
    per_task: int = 100  # events of each finished task
    chunk: int = 1_000  # finished tasks written between two archive runs
    live: int = 1_000
    live_events: int = 20
    runs: int = 15

    def check(self) -> None:
        if min(self.small, self.per_task, self.chunk, self.live, self.live_events, self.runs) < 1:
            raise ValueError("every count must be at least 1")
        if self.large <= self.small:
            raise ValueError("--history-large must be more than --history-small")


def _moment(days_ago: int) -> Any:
    from leases import clock

    return connection.ops.adapt_datetimefield_value(clock.now() - timedelta(days=days_ago))


def _with_events(tag: str, per_task: int) -> None:
    """``per_task`` events for each task titled ``<tag> …``: seq 1..n, step-sized payloads, chained digests."""

    def hex64(expr: str) -> str:
        if connection.vendor == "postgresql":
            return f"lpad(to_hex({expr}), 64, '0')"
        return f"printf('%%064x', {expr})"  # %%: the statement has parameters

    types = " ".join(f"WHEN {i} THEN '{name}'" for i, name in enumerate(EVENT_TYPES))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_event (task_id, seq, type, payload, prev_digest, digest, created_at)"  # noqa: S608 - our own text
            f" SELECT t.id, s.i, CASE WHEN s.i = 1 THEN 'task_created' ELSE CASE s.i %% {len(EVENT_TYPES)} {types} END"
            f" END, %s, {hex64(f't.id * {per_task + 1} + s.i - 1')}, {hex64(f't.id * {per_task + 1} + s.i')},"
            f" t.created_at FROM tasks_task t CROSS JOIN {_series(per_task)} WHERE t.title LIKE %s",
            [PAYLOAD, f"{tag} %"],
        )
        cursor.execute(
            f"UPDATE tasks_task SET version = {int(per_task)} WHERE title LIKE %s",  # noqa: S608
            [f"{tag} %"],
        )
        cursor.execute(
            "INSERT INTO tasks_node (plan_version, key, position, action, depends_on, input, evidence, on_failure,"  # noqa: S608 - our own text
            " irreversible, compensation, rerun, definition_digest, status, max_attempts, attempts,"
            " last_error_class, last_attempt_at, next_allowed_action, not_before, output, approval_digest,"
            " approval_proposed_digest, approval_requests, approved_by, task_id)"
            " SELECT 1, 'copy-batch-' || CAST(s.i AS TEXT), s.i, 'store.copy_batch', '[]', '{}', '{}', '{}', %s, '',"
            " '', %s, CASE WHEN t.status = 'completed' THEN 'succeeded' ELSE 'pending' END, 3, 1, '', NULL, '',"
            f" NULL, '{{}}', '', '', '{{}}', '', t.id FROM tasks_task t CROSS JOIN {_series(4)} WHERE t.title LIKE %s",
            [False, "sha256:" + "0" * 64, f"{tag} %"],
        )


def _stamp(tag: str, days_ago: int) -> None:
    moment = _moment(days_ago)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET created_at = %s, updated_at = %s WHERE title LIKE %s", [moment, moment, f"{tag} %"]
        )


def _grow(tasks: int, per_task: int, cycle: int) -> None:
    tag = f"history-{cycle}"
    with transaction.atomic():
        insert_tasks(tasks, status="completed", tag=tag)
        _stamp(tag, days_ago=60)
        _with_events(tag, per_task)


def _vacuum() -> None:
    """What autovacuum does after the archive's deletes: the space is reused by the next appends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM tasks_event")


def _sizes() -> dict[str, dict[str, int | None]]:
    sizes: dict[str, dict[str, int | None]] = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"SELECT COUNT(*) FROM {table}")  # noqa: S608 - our own table names
            row: dict[str, int | None] = {"rows": int(cursor.fetchone()[0]), "table_bytes": None, "index_bytes": None}
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_table_size(%s), pg_indexes_size(%s)", [table, table])
                row["table_bytes"], row["index_bytes"] = (int(v) for v in cursor.fetchone())
            else:
                cursor.execute("SELECT COUNT(*) FROM pragma_module_list WHERE name = 'dbstat'")
                if cursor.fetchone()[0]:  # dbstat is a compile-time option of SQLite: without it, sizes unknown
                    cursor.execute(
                        "SELECT SUM(CASE WHEN name = %s THEN pgsize ELSE 0 END),"
                        " SUM(CASE WHEN name <> %s THEN pgsize ELSE 0 END) FROM dbstat WHERE name = %s"
                        " OR name IN (SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = %s)",
                        [table, table, table, table],
                    )
                    row["table_bytes"], row["index_bytes"] = (int(v or 0) for v in cursor.fetchone())
            sizes[table] = row
    return sizes


def _median_ms(work: Callable[[], object], runs: int) -> float:
    work()  # warm
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _real_tasks(log: Callable[[str], None]) -> tuple[int, int]:
    """One task completed through the step protocol, long ago (its log is archived), and one running."""
    from leases.services import lease_acquire, lease_release
    from tasks.engine.plans import task_create
    from tasks.engine.runner import run_steps

    ended = task_create(kind="bench", title="archived bench task", plan=chain_plan(10), created_by="agent:bench")
    lease = lease_acquire(task_id=ended.pk, holder_kind="agent", holder_id="bench")
    lease_release(lease=run_steps(task_id=ended.pk, lease=lease, connector=BenchConnector()).lease)
    live = task_create(kind="bench", title="live bench task", plan=chain_plan(10), created_by="agent:bench")
    lease = lease_acquire(task_id=live.pk, holder_kind="agent", holder_id="bench")
    lease_release(lease=run_steps(task_id=live.pk, lease=lease, connector=BenchConnector(), max_steps=5).lease)
    with connection.cursor() as cursor:
        moment = _moment(60)
        cursor.execute("UPDATE tasks_task SET updated_at = %s WHERE id = %s", [moment, ended.pk])
    log(f"  real tasks: {ended.pk} completed (archived), {live.pk} running")
    return ended.pk, live.pk


def _measure(events: int, ended: int, live: int, runs: int, log: Callable[[str], None]) -> dict[str, Any]:
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from django.urls import reverse

    from tasks.engine.verification import task_verify_log

    analyze()
    admin = User.objects.filter(username="bench-admin").first()
    if admin is None:
        admin = User.objects.create_user("bench-admin")
        admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    client = Client(HTTP_HOST="localhost")
    client.force_login(admin)
    pages = {
        "work queue": reverse("task-list"),
        "task page, live": reverse("task-detail", args=[live]),
        "task page, archived": reverse("task-detail", args=[ended]),
    }
    statuses = {name: client.get(url).status_code for name, url in pages.items()}
    if set(statuses.values()) != {200}:
        raise RuntimeError(f"a page did not render: {statuses}")
    verdict = task_verify_log(task_id=ended, quarantine=False)
    if verdict.problem:
        raise RuntimeError(f"verify_log of the archived task: {verdict.problem}")
    ms = {"recovery scan": _median_ms(_time_scan, runs)}
    for name, url in pages.items():
        ms[name] = _median_ms(partial(client.get, url), runs)
    ms["verify_log, archived task"] = _median_ms(partial(task_verify_log, task_id=ended, quarantine=False), runs)
    sizes = _sizes()
    log(
        f"  at {events:>12,} events: hot table {sizes['tasks_event']['rows']:,} rows; "
        + ", ".join(f"{name} {value:.1f} ms" for name, value in ms.items())
    )
    return {"events": events, "sizes": sizes, "ms": ms}


def run_history(config: HistoryConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    from tasks.engine.archive import archive_ended

    config.check()
    archive = {"seconds": 0.0, "events": 0, "tasks": 0, "anchored": False}
    fill_seconds = 0.0
    with scratch_database():
        vendor = connection.vendor
        log(f"history bench: {vendor}; {config.live:,} live tasks of {config.live_events} events")
        with transaction.atomic():
            insert_tasks(config.live, status="pending", tag="live")
            _with_events("live", config.live_events)
        ended, live = _real_tasks(log)
        total = config.live * config.live_events

        def grow_to(target: int) -> None:
            nonlocal total, fill_seconds
            cycle = 0
            while total < target:
                tasks = max(1, min(config.chunk, (target - total) // config.per_task))
                started = time.perf_counter()
                _grow(tasks, config.per_task, cycle=total)
                fill_seconds += time.perf_counter() - started
                started = time.perf_counter()
                run = archive_ended()
                archive["seconds"] += time.perf_counter() - started
                archive["events"] += run.events
                archive["tasks"] += run.tasks
                archive["anchored"] = run.anchored
                _vacuum()
                total += tasks * config.per_task
                cycle += 1
                if cycle % 10 == 0:
                    log(f"  {total:,} events written, {archive['events']:,} archived")

        grow_to(config.small)
        small = _measure(total, ended, live, config.runs, log)
        grow_to(config.large)
        large = _measure(total, ended, live, config.runs, log)
    ratios = {name: large["ms"][name] / small["ms"][name] for name in small["ms"]}
    hot_bytes = {
        point: (p["sizes"]["tasks_event"]["table_bytes"] or 0) + (p["sizes"]["tasks_event"]["index_bytes"] or 0)
        for point, p in (("small", small), ("large", large))
    }
    return {
        "vendor": vendor,
        "config": config.__dict__,
        "fill_seconds": fill_seconds,
        "archive": archive | {"events_per_s": archive["events"] / archive["seconds"] if archive["seconds"] else 0.0},
        "small": small,
        "large": large,
        "ratios": ratios,
        "hot_bytes_ratio": hot_bytes["large"] / hot_bytes["small"] if hot_bytes["small"] else None,
        "goal": {
            "text": "the recovery scan, the work queue and the task pages within 1.5 x",
            "met": all(ratio <= 1.5 for name, ratio in ratios.items() if not name.startswith("verify_log")),
        },
    }


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def format_history(report: dict[str, Any]) -> str:
    cfg, small, large = report["config"], report["small"], report["large"]
    lines = [
        f"Many tasks, long history — {report['vendor']}; {cfg['live']:,} live tasks, finished ones of "
        f"{cfg['per_task']} events, archived every {cfg['chunk']:,} (median of {cfg['runs']} runs)",
        "",
        f"{'table':22} {'rows @ small':>14} {'MB (+index)':>16} {'rows @ large':>14} {'MB (+index)':>16}",
    ]
    for table in TABLES:
        s, b = small["sizes"][table], large["sizes"][table]
        lines.append(
            f"{table:22} {s['rows']:>14,} {_mb(s['table_bytes']):>7} (+{_mb(s['index_bytes']):>6})"
            f" {b['rows']:>14,} {_mb(b['table_bytes']):>7} (+{_mb(b['index_bytes']):>6})"
        )
    lines += ["", f"{'':28} {small['events']:>12,} ev {large['events']:>12,} ev {'ratio':>7}"]
    for name, ratio in report["ratios"].items():
        lines.append(f"{name:28} {small['ms'][name]:>12.2f} ms {large['ms'][name]:>12.2f} ms {ratio:>6.2f}x")
    archive = report["archive"]
    lines += [
        "",
        f"archive step: {archive['events']:,} events of {archive['tasks']:,} tasks in {archive['seconds']:.0f} s "
        f"({archive['events_per_s']:,.0f} events/s); heads anchored: {archive['anchored']}; "
        f"history written in {report['fill_seconds']:.0f} s",
        f"hot table (table + indexes) at large / at small: {report['hot_bytes_ratio'] or 0:.2f}",
        f"goal ({report['goal']['text']}): {'met' if report['goal']['met'] else 'NOT met'}",
    ]
    return "\n".join(lines)
