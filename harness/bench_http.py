"""The step over HTTP beside the step in process, in the same run and the same throw-away database.

    ./dev manage bench_http                                   # SQLite (the configured default)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/reckon ./dev manage bench_http --tasks 20 --agents 1,4

A *step* is one node driven from ready to done (the bench's unit, harness/bench.py): its intent registered, the
call made (to an in-process remote that commits at once), its receipt recorded.

- **in process**: ``tasks.engine.runner.run_steps`` in this process, one task after another — a Celery worker's path.
- **over HTTP**: a real web server (gunicorn with console/gunicorn.conf.py, ``--web-workers`` processes) on the
  same database, driven by ``reckon_client.Reckon.run`` — an agent's path: per node in steady state one request,
  the outcome POST whose answer carries the next node's operation, already started (and per task one lease
  acquire, directive read, intent and release), each a real HTTP request on a kept-alive connection. With 1 agent,
  then with N agent threads on different tasks.

Figures: steps/s over the wall time of each run (tasks created and leases taken beforehand are not measured for the
in-process run; over HTTP the lease is part of each run, as it is for an agent). Every figure is one run's: the
point is the ratio of the two paths measured together, not a tuned throughput. Per node, each run also counts the
requests, the statements its database connections sent (Django's per-request connection health check included)
and the commits that wrote: in process on the bench's connection, over HTTP in the web server's processes
(harness/counting_gunicorn.py: Reckon's gunicorn configuration plus the counters) — and the CPU time per node of
each side: the agent's process (this one), the web server's workers, and PostgreSQL's backends for the run's
database (read from /proc: PostgreSQL on this machine; "-" otherwise, and on SQLite, whose work is the processes').

The **floor** rows are what any request costs on the same client and server: ``GET /healthz`` (Django's whole
middleware, no database), by 1 and by N agent threads. A step over HTTP does what the step in process does (decide,
write, commit, call the remote) plus at least one request, so with one agent its steps/s cannot pass
``1 / (1 / in-process steps/s + 1 / floor requests/s)`` — printed as the ceiling; with N agents on a machine whose
cores are all busy, the CPU columns say where the time goes.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from django.db import connections
from django.test import override_settings

from api.models import ApiToken
from api.tokens import TOKEN_PREFIX, token_hash
from harness.bench import BenchConnector, StatementCounter, chain_plan, scratch_database
from harness.ports import free_port
from leases import clock
from leases.services import lease_acquire
from tasks.engine.plans import task_create
from tasks.engine.runner import run_steps

ROOT = Path(__file__).resolve().parent.parent
KIND = "bench_http"
# An action every server knows (the reference agent's, registered at start-up): the web server validates plans
# against its own registry, and the remote here is the agent's in-process one anyway.
HTTP_ACTION = "store.prepare_target"


def http_plan(nodes: int) -> dict[str, Any]:
    plan = chain_plan(nodes)
    for node in plan["nodes"]:
        node["action"], node["input"] = HTTP_ACTION, {"project": node["key"]}
    return plan


@dataclass(frozen=True)
class HttpBenchConfig:
    tasks: int = 20
    nodes: int = 10
    agents: tuple[int, ...] = (1, 4)
    web_workers: int = 2

    def check(self) -> None:
        if self.tasks < 1 or not 1 <= self.nodes <= 100 or self.web_workers < 1:
            raise ValueError("tasks >= 1, 1 <= nodes <= 100, web workers >= 1")
        if not self.agents or min(self.agents) < 1:
            raise ValueError("agent counts must be at least 1")


class InstantRemote:
    """The client-side connector: every write commits at once, remembered by op key (as BenchConnector)."""

    def __init__(self) -> None:
        self.committed: dict[str, Any] = {}

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Any:
        from reckon_client import Committed

        return self.committed.setdefault(op_key, Committed(remote_id=f"bench:{op_key}", count=1))

    def lookup(self, op_key: str) -> Any:
        from reckon_client import NotFound

        return self.committed.get(op_key) or NotFound()

    def current_version(self, locator: str) -> str:
        return "1"


def run_http_bench(config: HttpBenchConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    config.check()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    with scratch_database() as name:
        vendor = connections["default"].vendor
        report: dict[str, Any] = {"vendor": vendor, "tasks": config.tasks, "nodes": config.nodes, "runs": []}
        steps = config.tasks * config.nodes
        log(f"in process: {config.tasks} tasks x {config.nodes} nodes")
        report["runs"].append({"path": "in process", "agents": 1, **_in_process(config, steps)})
        token = _token()
        with _web_server(_database_url(name), config.web_workers) as server:
            for agents in config.agents:
                log(f"over HTTP: {agents} agent(s) x {config.tasks} tasks x {config.nodes} nodes")
                run = _over_http(config, server, token, agents, name)
                report["runs"].append({"path": "over HTTP", "agents": agents, **run})
            report["floor"] = [{"agents": agents, **_floor(server, agents, steps)} for agents in config.agents]
        base = report["runs"][0]["steps_per_s"]
        for run in report["runs"]:
            run["ratio"] = run["steps_per_s"] / base if base else 0.0
        one = next((f for f in report["floor"] if f["agents"] == 1), None)
        if one is not None and base:
            ceiling = 1 / (1 / base + 1 / one["requests_per_s"])
            report["ceiling_1_agent"] = {"steps_per_s": ceiling, "ratio": ceiling / base}
        return report


@override_settings(DEBUG=False)  # as the web server runs (and production): no query log
def _in_process(config: HttpBenchConfig, steps: int) -> dict[str, float | None]:
    plan = chain_plan(config.nodes)
    leases = []
    for i in range(config.tasks):
        task = task_create(kind=KIND, title=f"bench {i}", plan=plan, created_by="bench")
        leases.append(lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="bench-in-process"))
    connector = BenchConnector()
    counter = StatementCounter(connections["default"])
    name = str(connections["default"].settings_dict["NAME"])
    cpu = _Cpu(name)
    start = time.perf_counter()
    with counter.installed():
        for lease in leases:
            report = run_steps(task_id=lease.task_id, lease=lease, connector=connector)
            if report.directive is None or report.directive.kind != "done":
                raise RuntimeError(f"task {lease.task_id} did not complete in process: {report}")
    wall = time.perf_counter() - start
    counts = {"requests": 0, "statements": counter.statements, "commits": counter.commits}
    return {"steps": steps, "wall_s": wall, "steps_per_s": steps / wall, **_per_node(counts, steps), **cpu.per(steps)}


def _over_http(
    config: HttpBenchConfig, server: _web_server, token: str, agents: int, name: str
) -> dict[str, float | None]:
    from reckon_client import Reckon

    url = server.url
    plan = http_plan(config.nodes)
    with Reckon(url, token) as setup:
        ids = [setup.create_task(KIND, f"bench {agents}/{i}", plan).id for i in range(config.tasks * agents)]
    shares = [ids[i::agents] for i in range(agents)]
    failures: list[str] = []
    barrier = threading.Barrier(agents + 1)

    def agent(task_ids: list[int]) -> None:
        remote = InstantRemote()
        with Reckon(url, token) as reckon:
            barrier.wait()
            for task_id in task_ids:
                result = reckon.run(task_id, remote)
                if not result.done:
                    failures.append(f"task {task_id}: {result}")

    threads = [threading.Thread(target=agent, args=(share,)) for share in shares]
    before = server.counts()
    for thread in threads:
        thread.start()
    barrier.wait()
    cpu = _Cpu(name)
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    used = cpu.per(len(ids) * config.nodes)
    if failures:
        raise RuntimeError("over HTTP, tasks did not complete: " + "; ".join(failures[:3]))
    steps = len(ids) * config.nodes
    after = server.counts()
    counts = {key: after[key] - before.get(key, 0) for key in ("requests", "statements", "commits")}
    web_ms = (after.get("cpu_us", 0) - before.get("cpu_us", 0)) / 1000 / steps
    return {
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        **_per_node(counts, steps),
        **used,
        "web_cpu_ms_per_node": web_ms,
    }


def _floor(server: _web_server, agents: int, requests: int) -> dict[str, float]:
    """``requests`` GETs of /healthz shared by ``agents`` threads, each on its own kept-alive httpx client (as the
    Python client sends): requests/s, and the CPU per request of the client and of the web server."""
    each = max(1, requests // agents)
    barrier = threading.Barrier(agents + 1)
    failures: list[int] = []

    def agent() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            barrier.wait()
            for _ in range(each):
                status = client.get("/healthz").status_code
                if status != 200:
                    failures.append(status)

    threads = [threading.Thread(target=agent) for _ in range(agents)]
    before = server.counts()
    for thread in threads:
        thread.start()
    barrier.wait()
    client_cpu = time.process_time()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    client_cpu = time.process_time() - client_cpu
    if failures:
        raise RuntimeError(f"GET /healthz answered {failures[:3]}")
    after = server.counts()
    total = each * agents
    return {
        "requests": total,
        "requests_per_s": total / wall,
        "client_cpu_ms": client_cpu * 1000 / total,
        "web_cpu_ms": (after.get("cpu_us", 0) - before.get("cpu_us", 0)) / 1000 / total,
    }


class _Cpu:
    """CPU time from now on: this process's (all its threads) and, on PostgreSQL on this machine, that of the
    backends connected to database ``name`` (/proc; None when they cannot be read)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process = time.process_time()
        self.database = _backends_cpu(name)

    def per(self, steps: int) -> dict[str, float | None]:
        process = time.process_time() - self.process
        database = _backends_cpu(self.name)
        db_ms = None
        if database is not None and self.database is not None:
            spent = sum(ticks - self.database.get(pid, 0) for pid, ticks in database.items())
            db_ms = spent / os.sysconf("SC_CLK_TCK") * 1000 / steps
        return {"client_cpu_ms_per_node": process * 1000 / steps, "db_cpu_ms_per_node": db_ms}


def _backends_cpu(name: str) -> dict[int, int] | None:
    """Clock ticks of user + system CPU of each PostgreSQL backend connected to ``name``, by pid; None on SQLite or
    when /proc does not show them (a database server on another machine)."""
    connection = connections["default"]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [name])
        pids = [row[0] for row in cursor.fetchall()]
    ticks: dict[int, int] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime and stime: the stat file's 14th and 15th fields
    return ticks


def _per_node(counts: Mapping[str, int], steps: int) -> dict[str, float]:
    return {f"{name}_per_node": value / steps for name, value in counts.items()}


def _token() -> str:
    """An agent token for the benchmark's kind, written directly: the scratch database has no admin to issue it."""
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(
        agent_id="bench", token_hash=token_hash(plaintext), kinds=[KIND], created_by="bench", created_at=clock.now()
    )
    return plaintext


def _database_url(name: str) -> str:
    settings_dict = connections["default"].settings_dict
    if connections["default"].vendor == "sqlite":
        return f"sqlite:///{name}"
    user, host, port = settings_dict.get("USER") or "", settings_dict.get("HOST") or "", settings_dict.get("PORT")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
    return f"postgres://{auth}{host}{':' + str(port) if port else ''}/{name}"


class _web_server:
    """gunicorn with Reckon's configuration on a free loopback port, against ``database_url``, counting what its
    processes send to the database (harness/counting_gunicorn.py)."""

    def __init__(self, database_url: str, workers: int) -> None:
        self.database_url, self.workers = database_url, workers
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._counts = tempfile.TemporaryDirectory(prefix="reckon-bench-counts-")

    def counts(self) -> dict[str, int]:
        """The server's counts so far, summed over its processes. Each process writes its own after a response is
        sent: read until two readings agree."""
        previous: dict[str, int] | None = None
        while True:
            totals: dict[str, int] = {}
            for path in Path(self._counts.name).glob("*.json"):
                for name, value in json.loads(path.read_text()).items():
                    totals[name] = totals.get(name, 0) + value
            if totals == previous:
                return totals
            previous = totals
            time.sleep(0.2)

    def __enter__(self) -> _web_server:
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "RECKON_BIND": f"127.0.0.1:{port}",
            "RECKON_WEB_WORKERS": str(self.workers),
            "RECKON_API_RATE": "0",
            "DJANGO_DEBUG": "0",  # as in production: no query log (Django's CursorDebugWrapper); only the API is asked
            "RECKON_BENCH_COUNTS": self._counts.name,
        }
        gunicorn = Path(sys.executable).with_name("gunicorn")
        self.process = subprocess.Popen(  # noqa: S603 - our own server, our own arguments
            [str(gunicorn), "-c", str(ROOT / "harness" / "counting_gunicorn.py")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode} before answering")
            try:
                if httpx.get(f"{url}/api/v1/openapi.json", timeout=2).status_code == 200:
                    self.url = url
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("gunicorn did not answer within 60 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._counts.cleanup()


def format_http_report(report: dict[str, Any]) -> str:
    lines = [
        f"Step over HTTP vs in process — {report['vendor']}, {report['tasks']} tasks x {report['nodes']} nodes per "
        "agent and run",
        f"{'path':<12} {'agents':>6} {'steps':>7} {'wall s':>8} {'steps/s':>9} {'x in-process':>13} "
        f"{'req/node':>9} {'stmt/node':>10} {'commits/node':>13}   CPU ms/node: {'agent':>6} {'web':>6} {'db':>6}",
    ]
    for run in report["runs"]:
        lines.append(
            f"{run['path']:<12} {run['agents']:>6} {run['steps']:>7} {run['wall_s']:>8.2f} "
            f"{run['steps_per_s']:>9.1f} {run['ratio']:>13.2f} {run['requests_per_node']:>9.2f} "
            f"{run['statements_per_node']:>10.2f} {run['commits_per_node']:>13.2f}"
            f"{'':>16}{_ms(run['client_cpu_ms_per_node']):>6} {_ms(run.get('web_cpu_ms_per_node')):>6} "
            f"{_ms(run['db_cpu_ms_per_node']):>6}"
        )
    lines.append("HTTP floor: GET /healthz (the middleware, no database) on the same client and server")
    lines.append(f"{'agents':>6} {'requests':>9} {'requests/s':>11}   CPU ms/request: {'agent':>6} {'web':>6}")
    for floor in report.get("floor", []):
        lines.append(
            f"{floor['agents']:>6} {floor['requests']:>9} {floor['requests_per_s']:>11.1f}{'':>19}"
            f"{_ms(floor['client_cpu_ms']):>6} {_ms(floor['web_cpu_ms']):>6}"
        )
    ceiling = report.get("ceiling_1_agent")
    if ceiling is not None:
        lines.append(
            f"ceiling with 1 agent (the in-process step plus one floor request): {ceiling['steps_per_s']:.1f} steps/s "
            f"= {ceiling['ratio']:.2f} x in process"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
