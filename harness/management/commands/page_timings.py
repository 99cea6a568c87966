"""./dev manage page_timings — server time of the console's pages on a large database.

In a scratch database (harness.bench.scratch_database: created, migrated and dropped) it loads ``--tasks`` tasks
(default 100,000) with 4 nodes each and ``--events`` events (default 1,000,000) by INSERT … SELECT (no ORM, no
Python loop per row), then renders each page ``--runs`` times with Django's test Client logged in as an admin and
prints p50/p95 of the server time and the queries each page ran. The work queue and the needs-attention queue are
timed on their first page, a filtered page and a deep page (a cursor half-way down); the task detail and the audit
log too when their url names resolve.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, reset_queries, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import NoReverseMatch, reverse

from harness.bench import scratch_database
from tasks.models import Task
from tasks.reads.queries import TaskFilter, attention_queue, cursor_of, task_queue

NODES_PER_TASK = 4
# i % 100 → status: most tasks have ended, as in a system that has run for a while; every status is present.
STATUS_BANDS = [
    (60, "completed"),
    (68, "running"),
    (71, "pending"),
    (74, "observing"),
    (77, "backing_off"),
    (83, "paused"),
    (86, "human"),
    (89, "stopped"),
    (92, "failed"),
    (94, "stopping"),
    (96, "stopped_pending"),
    (97, "quarantined"),
    (100, "running"),
]
PAUSE_REASONS = ["needs_replan", "permission_revoked", "input_changed", "budget_exhausted", "version_conflict"]
KINDS = ["migrate_project", "copy", "switch", "verify"]
PROJECTS = 40


@dataclass(frozen=True)
class Sql:
    """What differs between SQLite and PostgreSQL in the loader's statements."""

    numbers: str  # a CTE ``n(i)`` of 1..%s
    hex32: Callable[[str], str]
    hex64: Callable[[str], str]
    moment: Callable[[str], str]  # a timestamp ``expr`` seconds after the base
    uuid: Callable[[str], str]
    json: Callable[[str], str]


SQLITE = Sql(
    numbers="WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s)",
    hex32=lambda e: f"printf('%032x', {e})",
    hex64=lambda e: f"printf('%064x', {e})",
    moment=lambda e: f"datetime('2026-01-01 00:00:00', '+' || ({e}) || ' seconds')",
    uuid=lambda e: f"printf('%032x', {e})",
    json=lambda literal: f"'{literal}'",
)
POSTGRES = Sql(
    numbers="WITH n(i) AS (SELECT generate_series(1, %s))",
    hex32=lambda e: f"lpad(to_hex({e}), 32, '0')",
    hex64=lambda e: f"lpad(to_hex({e}), 64, '0')",
    moment=lambda e: f"(timestamptz '2026-01-01 00:00:00+00' + ({e}) * interval '1 second')",
    uuid=lambda e: f"lpad(to_hex({e}), 32, '0')::uuid",
    json=lambda literal: f"'{literal}'::jsonb",
)


def _case(expr: str, values: list[str]) -> str:
    whens = " ".join(f"WHEN {index} THEN '{value}'" for index, value in enumerate(values))
    return f"CASE {expr} {whens} END"


def _status(expr: str) -> str:
    whens = " ".join(f"WHEN {expr} < {bound} THEN '{status}'" for bound, status in STATUS_BANDS)
    return f"CASE {whens} END"


def load(tasks: int, events: int, log: Callable[[str], None]) -> None:
    """``tasks`` tasks, NODES_PER_TASK nodes each, ``events`` events spread over them: set-based inserts."""
    sql = POSTGRES if connection.vendor == "postgresql" else SQLITE
    per_task = max(1, events // tasks)
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        status = _status("(i % 100)")
        cursor.execute(
            f"""{sql.numbers % tasks}
            INSERT INTO tasks_task (id, uid, kind, title, project, status, status_reason, status_detail, version,
                log_head, plan_version, input_refs, attempt_budget, attempts_used, inputs_recheck_required,
                cancel_requested_at, cancel_requested_by, cancel_reason, created_by, created_at, updated_at)
            SELECT i, {sql.uuid("i")}, {_case(f"(i % {len(KINDS)})", KINDS)},
                'bench task ' || i || ' of project p' || (i % {PROJECTS}), 'p' || (i % {PROJECTS}), {status},
                CASE WHEN {status} = 'paused' THEN {_case(f"((i / 100) % {len(PAUSE_REASONS)})", PAUSE_REASONS)}
                    ELSE '' END,
                CASE WHEN {status} = 'quarantined' THEN 'bench: the log and the projection disagree' ELSE '' END,
                {per_task}, {sql.hex64("i")}, 1, {sql.json("{}")}, 20, 0, FALSE, NULL, '', '', 'agent:bench',
                {sql.moment("i")}, {sql.moment(f"(i * 7919) % {tasks * 10}")}
            FROM n"""  # noqa: S608 - a harness: every value is the loader's own (no parameters: printf's %)
        )
        log(f"page_timings: {tasks} tasks in {time.perf_counter() - started:.1f} s")
        cursor.execute(
            f"""INSERT INTO tasks_node (task_id, plan_version, key, position, action, depends_on, input, evidence,
                on_failure, irreversible, compensation, rerun, definition_digest, status, max_attempts, attempts,
                last_error_class, last_attempt_at, next_allowed_action, not_before, output)
            SELECT t.id, 1, 'n' || k.k, k.k, 'store.copy_batch', {sql.json("[]")}, {sql.json("{}")},
                {sql.json('{"remote_id": true}')}, {sql.json("{}")}, FALSE, '', '', 'sha256:' || {sql.hex64("k.k")},
                CASE WHEN t.status = 'completed' OR k.k <= t.id % {NODES_PER_TASK} THEN 'succeeded' ELSE 'pending' END,
                3, CASE WHEN t.status = 'completed' OR k.k <= t.id % {NODES_PER_TASK} THEN 1 ELSE 0 END,
                '', NULL, '', NULL, {sql.json("{}")}
            FROM tasks_task t
            CROSS JOIN (SELECT 1 AS k UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4) k"""  # noqa: S608
        )
        log(f"page_timings: {tasks * NODES_PER_TASK} nodes in {time.perf_counter() - started:.1f} s")
        cursor.execute(
            f"""{sql.numbers % per_task}
            INSERT INTO tasks_event (task_id, seq, type, payload, prev_digest, digest, created_at)
            SELECT t.id, n.i, CASE WHEN n.i = 1 THEN 'task_created' ELSE 'bench' END, {sql.json("{}")},
                {sql.hex64(f"t.id * {per_task + 1} + n.i - 1")}, {sql.hex64(f"t.id * {per_task + 1} + n.i")},
                t.created_at
            FROM tasks_task t CROSS JOIN n"""  # noqa: S608
        )
        log(f"page_timings: {tasks * per_task} events in {time.perf_counter() - started:.1f} s")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE")
            # Restart the sequences past the ids the loader chose.
            for table in ("tasks_task", "tasks_node", "tasks_event"):
                cursor.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"  # noqa: S608
                )
        else:
            cursor.execute("ANALYZE")
    log(f"page_timings: loaded in {time.perf_counter() - started:.1f} s")


@dataclass(frozen=True)
class Timing:
    page: str
    url: str
    status: int
    queries: int
    p50_ms: float
    p95_ms: float
    sql_ms: float  # of the captured render: the database's share
    # This process's CPU per render (p50): the server time a loaded machine would not inflate. On SQLite it includes
    # the database's work; on PostgreSQL that runs in the server's process.
    cpu_ms: float


def time_page(client: Client, name: str, url: str, runs: int) -> Timing:
    client.get(url)  # warm: template compilation, first connection, caches
    reset_queries()  # each request starts by emptying the log (django.db.reset_queries on request_started)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    sql_ms = sum(float(q["time"]) for q in queries.captured_queries) * 1000
    samples, cpu = [], []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, max(0, round(0.95 * len(samples)) - 1))]
    return Timing(
        name, url, response.status_code, len(queries), statistics.median(samples), p95, sql_ms, statistics.median(cpu)
    )


def pages(admin_task: Task | None) -> list[tuple[str, str]]:
    """(name, url) of every page to time; the deep pages' cursors sit half-way down their queue."""
    work_mid = task_queue(TaskFilter()).order_by("-pk").values_list("updated_at", "pk")
    attention_mid = attention_queue(TaskFilter()).order_by("updated_at", "pk").values_list("updated_at", "pk")
    work_count, attention_count = Task.objects.count(), attention_queue(TaskFilter()).count()
    found = [
        ("work queue, first page", reverse("task-list")),
        ("work queue, filtered", reverse("task-list") + "?state=running&state=paused&project=p7&exclude=completed"),
        ("work queue, text filter", reverse("task-list") + "?q=p12&holder=none"),
    ]
    if work_count > 1:
        updated_at, pk = work_mid[work_count // 2]
        found.append(("work queue, deep page", f"{reverse('task-list')}?after={cursor_of(updated_at, pk)}"))
    found += [
        ("needs attention, first page", reverse("attention")),
        ("needs attention, filtered", reverse("attention") + "?attention=paused&kind=copy"),
    ]
    if attention_count > 1:
        updated_at, pk = attention_mid[attention_count // 2]
        found.append(("needs attention, deep page", f"{reverse('attention')}?after={cursor_of(updated_at, pk)}"))
    for name, url_name, args in (
        ("task detail", "task-detail", [admin_task.pk] if admin_task else []),
        ("audit log", "audit-log", []),
    ):
        try:
            found.append((name, reverse(url_name, args=args)))
        except NoReverseMatch:
            found.append((name, ""))
    return found


class Command(BaseCommand):
    help = (
        "Server time (p50/p95) and queries of the console's pages with 100,000 tasks and 1,000,000 events, in a "
        "throw-away database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=100_000, help="tasks to load (default 100,000)")
        parser.add_argument("--events", type=int, default=1_000_000, help="events to load (default 1,000,000)")
        parser.add_argument("--runs", type=int, default=20, help="timed renders per page (default 20)")

    def handle(self, *args: Any, **options: Any) -> None:
        tasks, events, runs = options["tasks"], options["events"], options["runs"]
        if tasks < 1 or events < 0 or runs < 1:
            raise CommandError("--tasks and --runs need at least 1, --events at least 0")
        with scratch_database():
            load(tasks, events, log=lambda line: self.stderr.write(line))
            admin = User.objects.create_user("bench-admin")
            admin.groups.add(Group.objects.get_or_create(name="admin")[0])
            client = Client(HTTP_HOST="localhost")
            client.force_login(admin)
            sample_task = Task.objects.filter(status="paused").order_by("pk").first()
            self.stdout.write(
                f"{connection.vendor}: {tasks} tasks, {events} events, {runs} runs per page (server time, ms)"
            )
            self.stdout.write(
                f"{'page':32} {'status':>6} {'queries':>7} {'p50':>8} {'p95':>8} {'sql':>8} {'cpu':>8}  url"
            )
            for name, url in pages(sample_task):
                if not url:
                    self.stdout.write(
                        f"{name:32} {'-':>6} {'-':>7} {'-':>8} {'-':>8} {'-':>8} {'-':>8}  (no such page yet)"
                    )
                    continue
                t = time_page(client, name, url, runs)
                figures = (
                    f"{t.status:>6} {t.queries:>7} {t.p50_ms:>8.1f} {t.p95_ms:>8.1f} {t.sql_ms:>8.1f} {t.cpu_ms:>8.1f}"
                )
                self.stdout.write(f"{t.page:32} {figures}  {t.url[:70]}")
