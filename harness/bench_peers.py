"""``bench peers`` — Reckon's step against two peers on the same PostgreSQL server, side by side in one run: DBOS
Transact (``dbos``) and LangGraph with its Postgres checkpointer (``langgraph``, ``langgraph-checkpoint-postgres``:
``PostgresSaver``). The peers are the optional uv dependency group ``peers`` (pyproject.toml), never installed by
default; ``RECKON_UV_GROUPS=peers`` makes ``./dev`` sync it with the default groups:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/reckon RECKON_ENV=development \\
        RECKON_UV_GROUPS=peers ./dev manage bench peers

The workload: workflows of ``nodes`` (10) steps in a chain, each step the same trivial call, ``tasks`` (20)
workflows per worker and run, with 1 and with 8 workers. A *step* is one node driven from ready to done, committed:

- **Reckon**: a task of a ``nodes``-node chain (harness/bench.py's ``chain_plan``) driven by
  ``tasks.engine.runner.run_steps`` with harness/bench.py's in-process ``BenchConnector`` (every call answered with a
  ``Committed`` receipt at once): per step the intent registered and committed, the call made, the receipt recorded
  and committed. Its workers are harness/bench.py's worker processes (``_Pool``, spawn: one process and one
  connection each); its tasks and leases are made beforehand by this process, not measured (their wall time is
  reported apart, ``create_ms_per_step``: a peer's workflow start is in its figures).
- **DBOS**: a ``@DBOS.workflow()`` calling ``nodes`` distinct ``@DBOS.step()`` functions in turn, each returning a
  receipt dict (``remote_id``, ``count``); DBOS is configured with ``system_database_url`` only (its defaults: a
  SQLAlchemy pool of 20, pre-ping on). Per step DBOS reads whether the step already ran (one transaction), runs it,
  then inserts its output (one transaction); per workflow it also inserts the workflow's status and inputs and
  updates its status at the end. With 8 workers: 8 threads of one process calling the workflow, as DBOS runs them.
- **LangGraph**: a ``StateGraph`` of ``nodes`` nodes in a chain (state: ``count``, ``remote_id``; each node returns
  the receipt as its update), compiled with a ``PostgresSaver`` (``from_conn_string``, ``setup()``) and invoked with
  a new ``thread_id`` and ``durability="sync"``: each super-step's checkpoint is committed before the next node runs
  (and the node's writes are saved by ``put_writes``). With 8 workers: 8 threads of one process, each with its own
  saver (one connection: a saver serialises its connection under a lock) and its own compiled graph.

- **the loops** ``raw`` and ``shared`` (harness/bench.py's raw limits, by Reckon's worker processes in Reckon's
  database): a step as two commits of three rows, or with the next step's intent in the receipt's commit — the floor
  any system that commits before its call meets on this server; the ratios are also given against ``shared``.

Each system has its own fresh database on the server (Reckon's by ``harness.bench.scratch_database``, migrated; the
peers' created by this module and set up by the peers themselves), dropped at the end. Each peer runs in its own
spawned process, started once and kept (its library set up, its connections open), so that what is measured in it
is that peer's alone. Rounds interleave the systems (Reckon, DBOS, LangGraph, Reckon, …) for each worker count, so
the machine's noise hits all three; one warm-up run of each, not recorded, comes first; every figure is the median
of its rounds. Measured per run:

- steps/s: steps / (last worker's end - first worker's start), each worker starting on a barrier;
- client CPU per step: Reckon, ``time.process_time`` of each worker process over its run, summed; a peer, the
  ``time.process_time`` of its whole process over the run (every thread: the workers and the library's own, e.g.
  DBOS's background threads and LangGraph's executor threads);
- from the server's statistics (``harness.bench._PgStats``; each system's connections flush theirs after a run, and
  those flushes are subtracted; a peer's also before it, so that DBOS's background threads between its runs do not
  count in the next): ``xact_commit`` per step of that system's database (read-only transactions included: DBOS's
  pre-ping ``SELECT 1`` in autocommit counts), rows written (``tup_inserted + tup_updated``), and ``pg_stat_wal``'s
  syncs and bytes — cluster-wide: commits elsewhere on the server in a window are reported.

Durability: the run refuses a server with ``fsync`` or ``synchronous_commit`` off (``--allow-nondurable`` measures
anyway, flagged), and reports ``synchronous_commit`` as each system's own connection sees it. After the rounds the
peers' databases are counted: every workflow run must be there, done (DBOS: status SUCCESS and one output per step;
LangGraph: one thread per workflow).

The ratios: Reckon's steps/s over the fastest peer's, and Reckon's CPU per step over the leanest peer's, at each
worker count (ratios of the medians). With the most workers the table also gives each peer's one-process ceiling,
1000 / its CPU ms per step: a peer whose threads come near it is held by its one process (the GIL), not by the
database — Reckon's workers are processes.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import platform
import queue
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypedDict
from urllib.parse import quote, urlencode

import psycopg
from django.db import connections
from psycopg import sql
from psycopg.conninfo import make_conninfo

from harness.bench import (
    BARRIER_TIMEOUT,
    RAW_TABLES,
    _pg_params,
    _PgStats,
    _Pool,
    bench_tasks,
    python_reference_us,
    raw_payloads,
    scratch_database,
)

PEERS = ("dbos", "langgraph")
# The floor, run in the same rounds on Reckon's database by the same worker processes (harness/bench.py's raw
# loops): ``raw`` commits an intent, then a receipt and the version (two commits a step, nothing else); ``shared``
# the same rows with a step's receipt and the next step's intent in one commit, as Reckon's chain does.
LOOPS = ("raw", "shared")
SYSTEMS = ("reckon", *PEERS, *LOOPS)
RUN_AS = {"reckon": "process", "dbos": "thread", "langgraph": "thread", "raw": "process", "shared": "process"}
# The distributions of the uv group peers; and those whose versions the report gives.
PEER_DISTRIBUTIONS = ("dbos", "langgraph", "langgraph-checkpoint-postgres")
VERSIONS = (*PEER_DISTRIBUTIONS, "langgraph-checkpoint", "sqlalchemy", "psycopg", "django")
RUN_COMMAND = "RECKON_UV_GROUPS=peers ./dev manage bench peers"
FIGURES = (
    "steps",
    "wall_s",
    "steps_per_s",
    "cpu_ms_per_step",
    "xact_commit_per_step",
    "rows_written_per_step",
    "wal_syncs_per_step",
    "wal_bytes_per_step",
    "other_db_commits",
    "create_ms_per_step",
)


class PeersError(RuntimeError):
    """The part could not measure: a peer missing or failing, a workflow not done, the server not durable."""


@dataclass(frozen=True)
class PeersConfig:
    tasks: int = 20  # workflows per worker and run
    nodes: int = 10
    rounds: int = 3
    workers: tuple[int, ...] = (1, 8)
    allow_nondurable: bool = False

    def check(self) -> None:
        if self.tasks < 1 or self.nodes < 1 or self.rounds < 1:
            raise ValueError("tasks, nodes and rounds must be at least 1")
        if not self.workers or min(self.workers) < 1:
            raise ValueError("worker counts must be at least 1")
        if self.nodes > 100:
            raise ValueError("a plan has at most 100 nodes (tasks.core.plan.MAX_NODES)")


def missing_peers() -> list[str]:
    """The distributions of the uv group ``peers`` that are not installed in this environment."""
    missing = []
    for name in PEER_DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def peers_missing_message(missing: list[str]) -> str:
    return (
        f"bench peers needs the optional uv dependency group 'peers' ({', '.join(missing)} not installed). "
        f"Install it and run the part with: {RUN_COMMAND} (./dev then syncs the group with the default ones)"
    )


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


# ---------------------------------------------------------------------------------------------------------------
# The peers, each in its own process


class _Peer(Protocol):
    nodes: int

    def run(self, worker: int, label: str) -> None: ...

    def flush_stats(self, workers: int) -> int: ...

    def session(self) -> dict[str, str]: ...

    def close(self) -> None: ...


class _GraphState(TypedDict):
    count: int
    remote_id: str


class _DbosPeer:
    """A DBOS workflow of ``nodes`` steps, on DBOS's defaults but for a quiet log and a fixed application version."""

    def __init__(self, url: str, nodes: int) -> None:
        from dbos import DBOS

        self.nodes = nodes
        steps = [DBOS.step(name=f"n{i}")(_receipt_call(i)) for i in range(nodes)]

        def chain(label: str) -> int:
            count = 0
            for step in steps:
                count += step(label)["count"]
            return count

        self.chain: Callable[[str], int] = DBOS.workflow(name="bench_chain")(chain)
        self.dbos = DBOS(
            config={
                "name": "reckon-bench-peers",
                "system_database_url": url,
                "application_version": "bench",
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        self.destroy: Callable[[], None] = DBOS.destroy

    def run(self, worker: int, label: str) -> None:
        if (count := self.chain(label)) != self.nodes:
            raise PeersError(f"DBOS workflow {label}: {count} of {self.nodes} steps")

    def _engine(self) -> Any:
        return self.dbos._sys_db.engine  # DBOS's own pool (private: no public handle on it)

    def flush_stats(self, workers: int) -> int:
        """Make every idle pooled connection publish its statistics now; the read-only transactions it cost (each
        checkout's pre-ping, each flush) are returned, for the parent to subtract."""
        engine = self._engine()
        taken = [engine.raw_connection() for _ in range(engine.pool.checkedin())]
        for conn in taken:
            cursor = conn.cursor()
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.close()
            conn.commit()
        for conn in taken:
            conn.close()  # back to the pool
        return len(taken) * (2 if getattr(engine.pool, "_pre_ping", False) else 1)

    def session(self) -> dict[str, str]:
        with self._engine().connect() as conn:
            return {name: str(conn.exec_driver_sql(f"SHOW {name}").scalar()) for name in ("synchronous_commit",)}

    def close(self) -> None:
        self.destroy()


def _receipt_call(index: int) -> Callable[[str], dict[str, Any]]:
    def call(label: str) -> dict[str, Any]:
        return {"remote_id": f"bench:{label}:n{index}", "count": 1}

    return call


class _GraphPeer:
    """A LangGraph chain of ``nodes`` nodes checkpointed by PostgresSaver, one saver and graph per worker."""

    def __init__(self, conninfo: str, nodes: int, workers: int) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph

        self.nodes = nodes
        self.stack = ExitStack()
        self.savers = [self.stack.enter_context(PostgresSaver.from_conn_string(conninfo)) for _ in range(workers)]
        self.savers[0].setup()
        builder = StateGraph(_GraphState)
        previous = START
        for i in range(nodes):
            builder.add_node(f"n{i}", _graph_node(i))
            builder.add_edge(previous, f"n{i}")
            previous = f"n{i}"
        builder.add_edge(previous, END)
        self.graphs = [builder.compile(checkpointer=saver) for saver in self.savers]

    def run(self, worker: int, label: str) -> None:
        config = {"configurable": {"thread_id": label}, "recursion_limit": self.nodes + 10}
        state = self.graphs[worker].invoke({"count": 0, "remote_id": ""}, config, durability="sync")
        if state["count"] != self.nodes:
            raise PeersError(f"LangGraph thread {label}: {state['count']} of {self.nodes} nodes")

    def flush_stats(self, workers: int) -> int:
        for saver in self.savers[:workers]:
            saver.conn.execute("SELECT pg_stat_force_next_flush()")
        return workers

    def session(self) -> dict[str, str]:
        row = self.savers[0].conn.execute("SELECT current_setting('synchronous_commit') AS value").fetchone()
        return {"synchronous_commit": str(row["value"])}

    def close(self) -> None:
        self.stack.close()


def _graph_node(index: int) -> Callable[[_GraphState], dict[str, Any]]:
    def call(state: _GraphState) -> dict[str, Any]:
        return {"count": state["count"] + 1, "remote_id": f"bench:n{index}"}

    return call


def _peer_main(
    kind: str, conninfo: str, url: str, nodes: int, workers: int, inbox: Any, results: Any
) -> None:  # pragma: no cover - runs in a spawned process
    try:
        peer: _Peer = _DbosPeer(url, nodes) if kind == "dbos" else _GraphPeer(conninfo, nodes, workers)
    except Exception:
        results.put({"error": traceback.format_exc()})
        return

    try:
        results.put({"ready": True, "session": peer.session()})
        while (job := inbox.get()) is not None:
            workers, tasks, label = job

            def handshake() -> None:
                """Publish what the peer's connections did since the last run (DBOS's background threads), then let
                the parent take its snapshot; start on its word."""
                peer.flush_stats(workers)  # noqa: B023 - called within this iteration
                results.put({"ready": True})
                inbox.get()

            try:
                result = _run_threads(peer, workers, tasks, label, before_start=handshake)
            except Exception:
                result = {"error": traceback.format_exc()}
            results.put(result)
    finally:
        peer.close()


def _run_threads(
    peer: _Peer, workers: int, tasks: int, label: str, before_start: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """``workers`` threads, started together once ``before_start`` returned, each running ``tasks`` workflows; the
    process's CPU over the run."""
    barrier = threading.Barrier(workers + 1)
    spans: dict[int, tuple[float, float]] = {}
    errors: list[str] = []

    def work(index: int) -> None:
        try:
            barrier.wait(BARRIER_TIMEOUT)
            started = time.monotonic()
            for t in range(tasks):
                peer.run(index, f"{label}.{index}.{t}")
            spans[index] = (started, time.monotonic())
        except Exception:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=work, args=(i,), name=f"bench-peer-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    before_start()
    cpu = time.process_time()
    barrier.wait(BARRIER_TIMEOUT)
    for thread in threads:
        thread.join()
    cpu = time.process_time() - cpu
    if errors:
        raise PeersError(errors[0])
    return {
        "started": min(s for s, _ in spans.values()),
        "ended": max(e for _, e in spans.values()),
        "cpu": cpu,
        "steps": workers * tasks * peer.nodes,
        "flushes": peer.flush_stats(workers),
    }


class _PeerHost:
    """One peer's process: its library set up once, then a run of N threads for each job."""

    def __init__(self, kind: str, conninfo: str, url: str, nodes: int, workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.kind = kind
        self.inbox: Any = ctx.Queue()
        self.results: Any = ctx.Queue()
        self.proc = ctx.Process(
            target=_peer_main,
            args=(kind, conninfo, url, nodes, workers, self.inbox, self.results),
            name=f"reckon-bench-{kind}",
            daemon=True,
        )
        self.proc.start()
        try:
            self.session: dict[str, str] = self._answer(BARRIER_TIMEOUT)["session"]
        except BaseException:
            self.close()
            raise

    def _answer(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got: dict[str, Any] = self.results.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise PeersError(f"the {self.kind} process died") from None
                if time.monotonic() > deadline:
                    raise PeersError(f"the {self.kind} process did not answer within {timeout:.0f}s") from None
                continue
            if "error" in got:
                raise PeersError(f"{self.kind} failed:\n{got['error']}")
            return got

    def run(self, workers: int, tasks: int, label: str, before_start: Callable[[], None]) -> dict[str, Any]:
        """One run; ``before_start`` runs once the peer's threads wait and its statistics are published."""
        self.inbox.put((workers, tasks, label))
        self._answer(BARRIER_TIMEOUT)
        before_start()
        self.inbox.put("go")
        return self._answer(24 * 3600)

    def close(self) -> None:
        if self.proc.is_alive():
            self.inbox.put(None)
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)


# ---------------------------------------------------------------------------------------------------------------
# The databases


def _peer_params(settings_dict: dict[str, Any], dbname: str) -> dict[str, Any]:
    """The configured server's connection parameters for ``dbname``, without Reckon's own session options."""
    params = _pg_params(settings_dict, dbname)
    params.pop("options", None)
    return params


def _pg_url(params: dict[str, Any]) -> str:
    """A ``postgresql://`` URL (DBOS takes one) for psycopg connection parameters."""
    user = quote(str(params.get("user", "")), safe="")
    password = f":{quote(str(params['password']), safe='')}" if params.get("password") else ""
    host = str(params.get("host", ""))
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "host", "port", "dbname")}
    if host.startswith("/"):  # a Unix socket directory
        query["host"], host = host, ""
    port = f":{params['port']}" if params.get("port") else ""
    auth = f"{user}{password}@" if user else ""
    tail = f"?{urlencode(query)}" if query else ""
    return f"postgresql://{auth}{host}{port}/{quote(str(params['dbname']), safe='')}{tail}"


@contextmanager
def _peer_databases(settings_dict: dict[str, Any]) -> Iterator[dict[str, str]]:
    """A fresh database for each peer on the configured server, dropped at the end: {peer: name}."""
    names = {peer: f"bench_peers_{peer}_{os.getpid()}" for peer in PEERS}
    with psycopg.connect(**_peer_params(settings_dict, "postgres"), autocommit=True) as admin:
        try:
            for name in names.values():
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            yield names
        finally:
            for name in names.values():
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _count_peer_rows(settings_dict: dict[str, Any], databases: dict[str, str]) -> dict[str, dict[str, int]]:
    """What each peer left committed in its database: workflows done and the rows of their steps."""
    queries = {
        "dbos": {
            "workflows": "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'",
            "workflows_not_done": "SELECT count(*) FROM dbos.workflow_status WHERE status <> 'SUCCESS'",
            "step_outputs": "SELECT count(*) FROM dbos.operation_outputs",
        },
        "langgraph": {
            "workflows": "SELECT count(DISTINCT thread_id) FROM checkpoints",
            "checkpoints": "SELECT count(*) FROM checkpoints",
            "writes": "SELECT count(*) FROM checkpoint_writes",
        },
    }
    counted: dict[str, dict[str, int]] = {}
    for peer, name in databases.items():
        with psycopg.connect(**_peer_params(settings_dict, name)) as conn:
            counted[peer] = {}
            for key, query in queries[peer].items():
                row = conn.execute(query).fetchone()
                counted[peer][key] = int(row[0]) if row else 0
    return counted


# ---------------------------------------------------------------------------------------------------------------
# The runs


@dataclass
class _Runner:
    config: PeersConfig
    pool: _Pool
    hosts: dict[str, _PeerHost]
    stats: dict[str, _PgStats]
    workflows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SYSTEMS, 0))
    batch: int = 0

    def run_once(self, system: str, workers: int, tasks: int) -> dict[str, Any]:
        self.batch += 1
        stats = self.stats[system]
        before: dict[str, Any] = {}

        def snapshot() -> None:  # as the workers are about to start
            before.update(stats.snapshot())

        create_s = None
        if system == "reckon":
            started = time.perf_counter()
            payloads, ids = self._reckon_payloads(workers, tasks)
            create_s = time.perf_counter() - started
            results = self.pool.run("reckon", payloads, snapshot)
            after, flushes = stats.snapshot(), workers  # each worker flushed its connection's statistics
            _check_reckon_completed(ids)
        elif system in LOOPS:
            results = self.pool.run(system, self._loop_payloads(workers, tasks), snapshot)
            after, flushes = stats.snapshot(), workers
        else:
            results = [self.hosts[system].run(workers, tasks, f"b{self.batch}", snapshot)]
            after, flushes = stats.snapshot(), results[0]["flushes"]
        self.workflows[system] += workers * tasks
        server = stats.delta(before, after, flushes=flushes)
        steps = sum(r["steps"] for r in results)
        wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
        return {
            "system": system,
            "workers": workers,
            "run_as": RUN_AS[system],
            "steps": steps,
            "wall_s": wall,
            "steps_per_s": steps / wall,
            "cpu_ms_per_step": 1000 * sum(r["cpu"] for r in results) / steps,
            "xact_commit_per_step": server["xact_commit"] / steps,
            "rows_written_per_step": server["rows"] / steps,
            "wal_syncs_per_step": server["wal_sync"] / steps,
            "wal_bytes_per_step": server["wal_bytes"] / steps,
            "other_db_commits": server["other_db_commits"],
            # Reckon's tasks and leases, made before its window (as harness/bench.py does), one after another in this
            # process; a peer's workflow starts are in its window.
            "create_ms_per_step": None if create_s is None else 1000 * create_s / steps,
        }

    def _loop_payloads(self, workers: int, tasks: int) -> list[dict[str, Any]]:
        """Each worker's rows of the raw loops' task table, made by this process, its statistics published."""
        from django.db import connection

        payloads = raw_payloads(workers, tasks, self.config.nodes)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        return payloads

    def _reckon_payloads(self, workers: int, tasks: int) -> tuple[list[dict[str, Any]], list[int]]:
        """Each worker's tasks and leases, made by this process with DEBUG off as in production (not in the run's
        figures), its statistics published."""
        from django.conf import settings
        from django.db import connection

        payloads, ids = [], []
        debug, settings.DEBUG = settings.DEBUG, False
        try:
            for w in range(workers):
                mine = bench_tasks(tasks, self.config.nodes, label=f"peers.{self.batch}.{w}", holder=f"bench-{w}")
                ids += [task_id for task_id, _lease in mine]
                payloads.append({"nodes": self.config.nodes, "tasks": mine})
        finally:
            settings.DEBUG = debug
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        return payloads, ids


def _check_reckon_completed(ids: list[int]) -> None:
    from tasks.core.lifecycle import TaskStatus
    from tasks.models import Task

    left = list(Task.objects.filter(pk__in=ids).exclude(status=TaskStatus.COMPLETED).values_list("pk", "status"))
    if left:
        raise PeersError(f"{len(left)} Reckon task(s) did not complete: {left[:5]}")


def _check_server(settings_dict: dict[str, Any], allow_nondurable: bool) -> tuple[dict[str, str], str]:
    """The server's settings and version; refuses fsync or synchronous_commit off unless allowed."""
    probe = _PgStats(settings_dict, "")
    try:
        pg_settings, version = probe.settings(), probe.version()
    finally:
        probe.close()
    nondurable = [n for n in ("fsync", "synchronous_commit") if pg_settings.get(n) == "off"]
    if nondurable and not allow_nondurable:
        raise PeersError(
            f"{' and '.join(nondurable)} off on this server: commits are not durable, so the figures would compare"
            " nothing that survives a crash; pass --allow-nondurable to measure anyway (flagged)"
        )
    return pg_settings, version


def run_peers(config: PeersConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the part on the configured PostgreSQL server and return its report."""
    config.check()
    if missing := missing_peers():
        raise PeersError(peers_missing_message(missing))
    if connections["default"].vendor != "postgresql":
        raise PeersError("bench peers needs PostgreSQL (DATABASE_URL=postgres://…): the peers' stores are Postgres")
    settings_dict = dict(connections["default"].settings_dict)
    pg_settings, version = _check_server(settings_dict, config.allow_nondurable)
    started_at = datetime.now(UTC)
    most = max(config.workers)
    with scratch_database() as reckon_db, _peer_databases(settings_dict) as peer_dbs, ExitStack() as stack:
        from django.db import connection

        databases = {"reckon": reckon_db, **peer_dbs}
        stats = {system: _PgStats(settings_dict, name) for system, name in databases.items()}
        stats |= dict.fromkeys(LOOPS, stats["reckon"])  # the loops write in Reckon's database, in turn with it
        for one in set(stats.values()):
            stack.callback(one.close)
        with connection.cursor() as cursor:
            for ddl in RAW_TABLES["postgresql"]:
                cursor.execute(ddl)
            cursor.execute("SELECT current_setting('synchronous_commit')")
            sessions = {"reckon": {"synchronous_commit": str(cursor.fetchone()[0])}}
        log(f"bench peers: {version}; starting {most} Reckon worker processes and the peers' processes")
        pool = _Pool(most, config.workers, reckon_db)
        stack.callback(pool.close)
        hosts: dict[str, _PeerHost] = {}
        for peer in PEERS:
            params = _peer_params(settings_dict, peer_dbs[peer])
            hosts[peer] = _PeerHost(peer, _conninfo(params), _pg_url(params), config.nodes, most)
            stack.callback(hosts[peer].close)
            sessions[peer] = hosts[peer].session
        runner = _Runner(config, pool, hosts, stats)
        for system in SYSTEMS:  # warm-up: imports, caches, pools, prepared statements; not recorded
            runner.run_once(system, most, 1)
        runs: list[dict[str, Any]] = []
        for r in range(config.rounds):
            for workers in config.workers:
                for system in SYSTEMS:
                    run = runner.run_once(system, workers, config.tasks) | {"round": r + 1}
                    runs.append(run)
                    log(
                        f"  round {r + 1} {system:9} {workers} worker(s): {run['steps_per_s']:8.1f} steps/s,"
                        f" {run['cpu_ms_per_step']:.3f} ms CPU a step"
                    )
        for host in hosts.values():
            host.close()  # DBOS shut down: its pool closed before the count
        committed = _count_peer_rows(settings_dict, peer_dbs)
    _check_committed(committed, runner.workflows, config.nodes)
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "database": version,
        "settings": pg_settings,
        "sessions": sessions,
        "versions": _versions(),
        "python_reference_us": python_reference_us(),
    }
    return peers_report(config, env, runs, started_at, committed)


def _conninfo(params: dict[str, Any]) -> str:
    return make_conninfo(**params)


def _check_committed(committed: dict[str, dict[str, int]], workflows: dict[str, int], nodes: int) -> None:
    problems = []
    for peer in PEERS:
        if committed[peer]["workflows"] != workflows[peer]:
            problems.append(f"{peer}: {committed[peer]['workflows']} workflows done of {workflows[peer]} run")
    if committed["dbos"]["step_outputs"] != workflows["dbos"] * nodes:
        problems.append(f"dbos: {committed['dbos']['step_outputs']} step outputs of {workflows['dbos'] * nodes}")
    if problems:
        raise PeersError("a peer did not commit what it ran: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------------------------
# The report


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def peers_report(
    config: PeersConfig,
    env: dict[str, Any],
    runs: list[dict[str, Any]],
    started_at: datetime,
    committed: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """The report of a run: each figure the median of its rounds, and Reckon against the best peer."""
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in runs)]
    figures: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in systems}
    for system in systems:
        for workers in config.workers:
            mine = [r for r in runs if r["system"] == system and r["workers"] == workers]
            figures[system][str(workers)] = {f: _median([r.get(f) for r in mine]) for f in FIGURES}
    warnings = [
        f"{name} is {env['settings'].get(name)} on the server: commits are not durable"
        for name in ("fsync", "synchronous_commit")
        if env["settings"].get(name) == "off"
    ]
    warnings += [
        f"{system}'s connections run with synchronous_commit={session.get('synchronous_commit')}: not durable"
        for system, session in env.get("sessions", {}).items()
        if session.get("synchronous_commit") == "off"
    ]
    if config.rounds < 3:
        warnings.append(f"only {config.rounds} round(s): the figures are not medians of 3 or more")
    others = max((r.get("other_db_commits") or 0 for r in runs), default=0)
    if others:
        warnings.append(
            f"up to {others} commits in other databases during a measured window: the WAL figures (cluster-wide)"
            " include their writes, and the machine was not idle"
        )
    return {
        "schema": 1,
        "started_at": started_at.isoformat(),
        "step": "one node of a chain driven from ready to done and committed (Reckon: intent committed, call made,"
        " receipt committed; DBOS: a @DBOS.step and its recorded output; LangGraph: a node and its checkpoint,"
        " durability sync)",
        "config": {
            "tasks_per_worker": config.tasks,
            "nodes": config.nodes,
            "rounds": config.rounds,
            "workers": list(config.workers),
        },
        "run_as": {s: RUN_AS[s] for s in systems},
        "environment": env,
        "durable": not any("not durable" in w for w in warnings),
        "warnings": warnings,
        "figures": figures,
        "ratios": peer_ratios(figures, config.workers),
        "committed": committed,
        "runs": runs,
    }


def peer_ratios(figures: dict[str, dict[str, dict[str, Any]]], workers: tuple[int, ...]) -> dict[str, Any]:
    """At each worker count: Reckon's steps/s over the fastest peer's, its CPU per step over the leanest peer's;
    with the loops measured, Reckon's and the fastest peer's steps/s over the shared loop's (the floor)."""
    peers = [s for s in figures if s in PEERS]
    ratios: dict[str, Any] = {}
    for count in workers:
        key = str(count)
        reckon = figures["reckon"][key]
        fastest = max(peers, key=lambda p: figures[p][key]["steps_per_s"])
        leanest = min(peers, key=lambda p: figures[p][key]["cpu_ms_per_step"])
        ratios[key] = {
            "steps_per_s": reckon["steps_per_s"] / figures[fastest][key]["steps_per_s"],
            "steps_per_s_peer": fastest,
            "cpu_ms_per_step": reckon["cpu_ms_per_step"] / figures[leanest][key]["cpu_ms_per_step"],
            "cpu_ms_per_step_peer": leanest,
        }
        if "shared" in figures:
            floor = figures["shared"][key]["steps_per_s"]
            ratios[key] |= {
                "reckon_over_shared": reckon["steps_per_s"] / floor,
                "peer_over_shared": figures[fastest][key]["steps_per_s"] / floor,
            }
    return ratios


COLUMNS = (
    # (figure, header, format)
    ("steps_per_s", "steps/s", "{:.1f}"),
    ("cpu_ms_per_step", "cpu ms", "{:.3f}"),
    ("xact_commit_per_step", "xact", "{:.2f}"),
    ("wal_syncs_per_step", "wal syncs", "{:.2f}"),
    ("wal_bytes_per_step", "wal bytes", "{:.0f}"),
    ("rows_written_per_step", "rows", "{:.1f}"),
)


def format_peers(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["config"]
    versions = env.get("versions", {})
    sessions = env.get("sessions", {})
    lines = [
        f"Reckon against its peers — {env['database']}",
        f"dbos {versions.get('dbos')}, langgraph {versions.get('langgraph')} (langgraph-checkpoint-postgres"
        f" {versions.get('langgraph-checkpoint-postgres')}, PostgresSaver, durability sync); Python {env['python']},"
        f" {env['cpus']} CPUs",
        "durability: server "
        + ", ".join(f"{k}={env['settings'].get(k)}" for k in ("fsync", "synchronous_commit"))
        + "; synchronous_commit as each system's connection sees it: "
        + ", ".join(f"{s} {v.get('synchronous_commit')}" for s, v in sessions.items()),
        f"{cfg['tasks_per_worker']} workflows per worker x {cfg['nodes']} steps, {_plural(cfg['rounds'], 'round')}"
        f" interleaved ({', '.join(report['figures'])}, …), medians; figures per step",
    ]
    lines += [f"!!! {warning}" for warning in report["warnings"]]
    header = f"{'workers':>7}  {'system':10} {'run as':12}" + "".join(f"{h:>11}" for _, h, _ in COLUMNS)
    lines += ["", header, "-" * len(header)]
    for workers in cfg["workers"]:
        for system, cells in report["figures"].items():
            cell, run_as = cells[str(workers)], _plural(workers, report["run_as"][system])
            lines.append(
                f"{workers:>7}  {system:10} {run_as:12}" + "".join(f"{_fmt(fmt, cell[f]):>11}" for f, _, fmt in COLUMNS)
            )
        ratio = report["ratios"][str(workers)]
        lines.append(
            f"{'':>7}  Reckon / best peer: {ratio['steps_per_s']:.2f} x the steps/s of {ratio['steps_per_s_peer']},"
            f" {ratio['cpu_ms_per_step']:.2f} x the CPU per step of {ratio['cpu_ms_per_step_peer']}"
        )
        if "reckon_over_shared" in ratio:
            lines.append(
                f"{'':>7}  against the shared loop: Reckon {ratio['reckon_over_shared']:.2f} x,"
                f" {ratio['steps_per_s_peer']} {ratio['peer_over_shared']:.2f} x — twice that peer would be"
                f" {2 * ratio['peer_over_shared']:.2f} x, three times {3 * ratio['peer_over_shared']:.2f} x"
            )
    lines += [
        "",
        "cpu ms: client CPU (Reckon and the loops: their worker processes; a peer: its whole process, library"
        " threads included)",
        "raw, shared: the floor on the same server, in Reckon's database — a step as two commits of an intent and"
        " a receipt with the version (raw), or with the next step's intent in the receipt's commit (shared), and"
        " nothing else: no lease, no log, no check",
        "xact: pg_stat_database.xact_commit of the system's database, read-only transactions included; rows:"
        " tup_inserted + tup_updated; wal: pg_stat_wal (cluster-wide)",
    ]
    create = [(w, report["figures"]["reckon"][str(w)].get("create_ms_per_step")) for w in cfg["workers"]]
    if all(ms is not None for _, ms in create):
        lines.append(
            "not in Reckon's figures: its tasks and leases, made before each run in one process, "
            + ", ".join(f"{ms:.3f} ms per step ({w} worker{'s' if w > 1 else ''})" for w, ms in create)
            + " of wall time; a peer's workflow starts are in its figures"
        )
    if ceilings := one_process_ceilings(report):
        lines.append(
            "a peer's threads share one process (one GIL): at its CPU per step, one core's worth of it allows about "
            + ", ".join(f"{peer} {ceiling:.0f}" for peer, ceiling in ceilings.items())
            + f" steps/s at {max(cfg['workers'])} workers (Reckon's workers are processes)"
        )
    committed = report.get("committed") or {}
    if committed:
        lines.append(
            "committed at the end: "
            + "; ".join(f"{p} " + ", ".join(f"{k} {v}" for k, v in c.items()) for p, c in committed.items())
        )
    return "\n".join(lines)


def one_process_ceilings(report: dict[str, Any]) -> dict[str, float]:
    """Each peer's steps/s if its one process had one core to itself at its CPU per step with the most workers: near
    it, the peer is held by its process (the GIL), not by the database."""
    most = str(max(report["config"]["workers"]))
    cells = {s: c[most] for s, c in report["figures"].items() if report["run_as"][s] == "thread" and most in c}
    return {s: 1000 / c["cpu_ms_per_step"] for s, c in cells.items() if c.get("cpu_ms_per_step")}


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun.endswith('s') else 's'}"


def _fmt(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)
