"""Partition scenarios: a worker cut off from the database or from the remote in the middle of a step, by
the fault proxy (harness/faultproxy.py), with the kill matrix's processes, counts and judgement (harness/killmatrix.py).

Each scenario starts the simulator, a *direct* Celery worker (its own connections to the database and the remote)
and a few *lanes* (``--lanes``, default 3): a lane is one more worker whose connection to the database — or to the
remote — goes through a fault proxy of its own, with its own queue, and with a short pause after each dispatch
commit (``before_call=sleep(…)``, tasks/engine/failpoints.py) so that the controller (this process) can cut it off
there.
Every task is sent to a lane first; the lane's worker runs it until its k-th dispatch (k = the task's number mod 6:
prepare, each copy batch, verify, the irreversible switch), where the controller partitions it:

- **database lost mid-step** (``db_lost_mid_step``): the lane's database link is blackholed right after its dispatch
  commit. The worker makes its call (the remote commits), and its write of the outcome hangs. Its lease expires on
  the database clock; a direct worker takes the task over (reconciles the dispatched operation by op key) and goes on.
  The partition then heals and the held writes reach the database late: every one must be refused by the fencing
  (the lease's epoch moved). Counted from the lane worker's own log lines: refusals, and state changes it committed
  after the heal (must be none).
- **database cut mid-step** (``db_cut_mid_step``): right after the dispatch commit every database connection of the
  lane's worker is reset and new ones are refused for ``CUT_SECONDS`` — a PostgreSQL restart as that worker sees it
  (the shared server is never restarted). Its wake-up fails with OperationalError and is retried; the same process
  (its pid is checked at the end) reconnects, reconciles the operation by op key and goes on.
- **remote lost in call** (``remote_lost_in_call``): the lane's link to the remote is blackholed in the answer's
  direction while its call is in flight: the remote commits, the answer never arrives, the connector times out and
  the operation is recorded unknown. The partition heals; the operation is reconciled by op key (the remote's
  count says it committed once) and the task goes on.

Two rows need no proxy:

- **clocks skewed** (``clocks_skewed``): three direct workers whose wall clocks run 10 min behind, 3 and 10 min ahead
  of this process's (which sends the scans, as beat would), and a remote 5 min ahead, set per process by libfaketime;
  each worker is SIGKILLed once per task after its call. Leases last seconds: any decision taken on an app server's
  clock would take a task over early (a duplicate) or never (a stall). Every takeover must be judged on the database
  clock. This row found that Celery's ``expires`` — judged by each worker on its own clock — made workers ahead of
  beat drop every scan and wake-up; messages now go stale on the database clock (tasks.jobs.drive_task).
- **broker restarted** (``broker_restarted``): direct workers on a Redis of the run's own, restarted without
  persistence once a third of the tasks have begun: every queued wake-up and scan, and every message taken but not
  acknowledged, is lost. The workers reconnect by themselves (one that exits on kombu's restore race is started
  again, as a supervisor would, and counted); the recovery scan, which reads the database, queues every task needing
  work again once its claim lapses.

A partition counts (the row's ``fired`` figure, which must equal the tasks) only if it happened as described: the
operation was still dispatched when the lease lapsed (or 0.3 s after the cut), or went unknown with the remote's
commit counted; a partition that came too late (the outcome already on its way) is healed and tried at the next
dispatch. When every
task has been through its lane, recovery scans (as beat would send them) finish what is left; then the row is judged
as the kill matrix judges it: duplicates, skips, unknowns left, wrong final states.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

from django.db import connection

from harness import failover, killmatrix
from harness.faultproxy import FaultProxy
from harness.killmatrix import MAX_BATCH, OBJECTS, SCAN_EVERY, Row, Scenario, StoreProcess, Workers
from harness.ports import free_port
from harness.zygote import Process, start_worker, worker_command
from leases import clock
from leases.models import Lease
from leases.state import held_q, lapsed_q
from observability.logs import STATE_LOGGER
from reference import migrate_project
from reference.objectstore import ObjectStoreConnector
from tasks.core.lifecycle import OperationStatus
from tasks.engine.failpoints import hits
from tasks.jobs import drive_task
from tasks.models import Operation

PAUSE_MS = 500  # a lane worker's pause after each dispatch commit: the controller's window to partition it
STEPS = 6  # effect nodes of a migrate_project task (prepare, three copy batches, verify, switch)
CUT_SECONDS = 2.0  # how long a cut worker's new connections are refused
KEEP_ENV = "RECKON_PARTITIONS_KEEP"
LANE_TIMEOUT = 40.0  # seconds a task may spend in its lane once taken before it is given up (a problem on the row)


@dataclass(frozen=True)
class Partition:
    name: str
    what: str
    link: Literal["database", "remote", "clock", "broker"]
    fault: Literal["blackhole", "cut", "restart", "skew", "broker_restart", "failover"] = "blackhole"
    lanes: int = 3
    direct_workers: int = 1  # takes the tasks over (one is enough: three lanes cut off at most three at once)
    lease_ttl: int = 3
    lease_grace: int = 1

    @property
    def scenario(self) -> Scenario:
        """The kill matrix's view of it, for the judgement (every task completes)."""
        return Scenario(self.name, self.what, workers=self.direct_workers, lease_ttl=self.lease_ttl)


PARTITIONS = [
    Partition(
        "db lost mid step",
        "database blackholed after the dispatch commit; lease lapses; a direct worker takes over; late writes refused",
        link="database",
    ),
    Partition(
        "db cut mid step",
        "the worker's connections reset after the dispatch commit, new ones refused 2 s (a restart, as it sees it)",
        link="database",
        fault="cut",
    ),
    Partition(
        "remote lost in call",
        "the remote commits, its answer never arrives; unknown, reconciled by op key after the heal",
        link="remote",
        lease_ttl=10,  # outlasts the connector's 5 s timeout: the worker that lost the answer records it unknown
    ),
    Partition(
        "clocks skewed",
        "workers' clocks 10 min behind, 3 and 10 min ahead of the driver's, the remote's 5 min ahead (libfaketime); "
        "SIGKILL once per task after the call: each takeover judged on the database clock",
        link="clock",
        fault="skew",
        lanes=0,
        direct_workers=3,
    ),
    Partition(
        "broker restarted",
        "the run's own Redis restarted mid-run, every queued wake-up and scan lost; the recovery scan makes them good",
        link="broker",
        fault="broker_restart",
        lanes=0,
        direct_workers=2,
    ),
]


# Only when named (--scenario db_restarted): it restarts the PostgreSQL server the run is configured on, which must be
# one of the run's own (RECKON_PARTITIONS_PGDATA names its data directory) — never a shared one.
RESTART = Partition(
    "db restarted",
    "the run's own PostgreSQL server restarted (fast shutdown, start) mid-run; workers reconnect by themselves",
    link="database",
    fault="restart",
    lanes=0,
    direct_workers=2,
)
PGDATA_ENV = "RECKON_PARTITIONS_PGDATA"
# Only when named (--scenario failover): a primary and its synchronous standby of the run's own (harness/failover.py).
FAILOVER = Partition(
    "failover",
    "a primary and its synchronous standby of the run's own; the primary stopped (immediate) mid-run, the standby "
    "promoted; every process reconnects through a multi-host URL (target_session_attrs=read-write)",
    link="database",
    fault="failover",
    lanes=0,
    direct_workers=2,
)
OPEN = [OperationStatus.INTENT, OperationStatus.DISPATCHED, OperationStatus.UNKNOWN]


def choose(names: list[str]) -> list[Partition]:
    if not names:
        return list(PARTITIONS)
    known = {p.name.replace(" ", "_"): p for p in [*PARTITIONS, RESTART, FAILOVER]}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown partition scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]


class NeedsPostgres(RuntimeError):
    """A database partition needs a database reached over TCP: PostgreSQL."""


@dataclass
class Tally:
    """What the partitions did, beside the row's columns."""

    partitioned: int = 0  # tasks cut off exactly as the scenario says
    retried: int = 0  # a partition that came too late for its dispatch (the step had settled): tried at the next one
    takeovers: int = 0
    refused: int = 0  # late writes refused by the fencing (lane worker's log lines)
    late_commits: int = 0  # state changes a lane worker committed after its partition healed (must be 0)
    reconciled: int = 0  # unknown operations settled by op key after the heal
    restarted: int = 0  # workers that exited on the broker's restart (KOMBU_RESTORE_RACE) and were started again
    problems: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: processes started, lanes, the rest finished

    def line(self, link: str) -> str:
        phases = ", ".join(f"{k} {v:.0f} s" for k, v in self.phases.items())
        return self._what(link) + (f" ({phases})" if phases else "")

    def _what(self, link: str) -> str:
        if link == "broker":
            return (
                f"  partitions: the broker restarted with {self.partitioned} tasks begun and {self.reconciled} "
                "messages queued (lost with it); "
                + (
                    f"{self.restarted} worker(s) exited on kombu's restore race and were started again"
                    if self.restarted
                    else "no worker restarted"
                )
            )
        if link == "clock":
            return (
                f"  partitions: {self.partitioned} tasks taken over after a SIGKILL by a worker whose clock differs "
                "from the dead one's by minutes (clocks -10 / +3 / +10 min, the remote's +5 min)"
            )
        if link == "restart":
            return "  partitions: the server restarted mid-run; no worker restarted"
        if link == "failover":
            return (
                "  partitions: the primary stopped mid-run and its synchronous standby promoted; no worker restarted; "
                "0 lost commits, every log verified, one lease holder at a time"
                if not self.problems
                else f"  partitions: the failover found {len(self.problems)} problem(s)"
            )
        if link == "cut":
            return (
                f"  partitions: {self.partitioned} tasks whose worker lost every database connection after a dispatch "
                f"commit ({self.retried} retried at a later step), each settled after the heal; no worker restarted"
            )
        if link == "database":
            return (
                f"  partitions: {self.partitioned} tasks cut off after a dispatch commit ({self.retried} retried at a "
                f"later step), {self.takeovers} taken over, {self.refused} late writes refused by the fencing, "
                f"{self.late_commits} committed late"
            )
        return (
            f"  partitions: {self.partitioned} calls committed remotely with the answer lost ({self.retried} retried "
            f"at a later step), {self.reconciled} unknown operations reconciled by op key after the heal"
        )


@dataclass
class PartitionRow(Row):
    """A kill matrix row, and the partitions' own verdict: each task cut off as intended, every late write refused."""

    tally: Tally = field(default_factory=Tally)
    link: str = "database"

    @property
    def ok(self) -> bool:
        refused = self.link != "database" or self.tally.refused >= self.tally.partitioned
        return super().ok and refused and not self.tally.late_commits and not self.tally.problems


@dataclass
class Lane:
    n: int
    proxy: FaultProxy
    queue: str
    workers: Workers
    log: Path
    task: int = 0
    target: int = 0  # partition at this dispatch of the task (0-based)
    state: Literal["idle", "running", "confirming", "partitioned", "healing", "reconciling"] = "idle"
    op: int = 0
    since: float = 0.0
    log_offset: int = 0
    taken_over: bool = False
    cut_at: float = 0.0
    woken: int = 0
    pid: int = 0  # its worker's process: it must never have to be restarted

    def __post_init__(self) -> None:
        self.pid = self.workers.processes[0].pid


# -- processes -------------------------------------------------------------------------------------------------


class LaneWorker(Workers):
    """One worker of a lane: the kill matrix's worker, logging at INFO (Celery's --loglevel sets the root logger's
    level), so its refusals and the state changes it commits are in its log, as JSON lines."""

    def _start(self, n: int) -> Process:
        queues = f"{self.queue},{killmatrix.scan_queue(self.queue)}"
        command = worker_command(queues, f"lane{n}-{uuid.uuid4().hex[:6]}@%h", loglevel="INFO")
        return start_worker(command, env=self.env, log=self.log)


@contextmanager
def _running(partition: Partition, workdir: Path) -> Iterator[tuple[StoreProcess, Workers, str, list[Lane]]]:
    if partition.link == "database" and connection.vendor != "postgresql":
        raise NeedsPostgres(
            f"{partition.name!r} needs PostgreSQL (the lane workers reach it through the fault proxy); "
            f"the database is {connection.vendor}"
        )
    with ExitStack() as stack:
        store = StoreProcess(workdir / "store.json")
        stack.callback(store.stop)
        queue = f"partition-{uuid.uuid4().hex[:10]}"
        env = _worker_env(partition, store)
        proxies = [stack.enter_context(FaultProxy(_upstream(partition, store))) for _ in range(partition.lanes)]
        direct = Workers(partition.direct_workers, queue, env, workdir / "direct.log")
        every = [direct]
        stack.callback(_stop_all, every)  # before the proxies close: a worker never sees its link cut as it stops
        lanes = []
        for n, proxy in enumerate(proxies):
            lane_env = env | {
                "RECKON_FAILPOINTS": f"before_call=sleep({PAUSE_MS})",
                "RECKON_LOG_LEVEL": "INFO",  # its refusals and state changes, counted from its log
                "RECKON_LOG_FORMAT": "json",
            }
            if partition.link == "database":
                db = connection.settings_dict
                lane_env["DATABASE_URL"] = f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"
            else:
                lane_env["RECKON_OBJECTSTORE_URL"] = f"http://127.0.0.1:{proxy.port}"
            lane_queue = f"{queue}-lane{n}"
            log = workdir / f"lane{n}.log"
            workers = LaneWorker(1, lane_queue, lane_env, log)
            every.append(workers)
            lanes.append(Lane(n, proxy, lane_queue, workers, log))
        yield store, direct, queue, lanes


def _worker_env(partition: Partition, store: StoreProcess, **extra: str) -> dict[str, str]:
    """The environment of a row's workers: the run's database and simulator, the row's lease times, no failpoint
    unless ``extra`` sets one, warnings only."""
    return os.environ | {
        "DATABASE_URL": killmatrix.database_url(),
        "RECKON_OBJECTSTORE_URL": store.url,
        "RECKON_FAILPOINTS": "",
        "RECKON_LEASE_TTL_SECONDS": str(partition.lease_ttl),
        "RECKON_LEASE_GRACE_SECONDS": str(partition.lease_grace),
        "RECKON_LOG_LEVEL": "WARNING",
        **extra,
    }


def _stop_all(every: list[Workers]) -> None:
    """Ask every worker to stop at once, then wait for each (one by one, each warm shutdown would add up)."""
    for workers in every:
        for process in workers.processes:
            if process.poll() is None:
                process.terminate()
    for workers in every:
        workers.stop()


def _upstream(partition: Partition, store: StoreProcess) -> tuple[str, int]:
    if partition.link == "database":
        db = connection.settings_dict
        return db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)
    host, _, port = store.url.removeprefix("http://").partition(":")
    return host, int(port)


# -- a scenario ------------------------------------------------------------------------------------------------


def run_partition(
    partition: Partition, tasks: int, *, timeout: float, log: Callable[[str], None] = print
) -> PartitionRow:
    if partition.fault == "restart":
        return run_restart(partition, tasks, timeout=timeout, log=log)
    if partition.fault == "skew":
        return run_skew(partition, tasks, timeout=timeout, log=log)
    if partition.fault == "broker_restart":
        return run_broker_restart(partition, tasks, timeout=timeout, log=log)
    if partition.fault == "failover":
        return run_failover(partition, tasks, timeout=timeout, log=log)
    started = time.monotonic()
    row = PartitionRow(partition.name, tasks, link="cut" if partition.fault == "cut" else partition.link)
    tally = row.tally
    keep = bool(os.environ.get(KEEP_ENV))  # keep the workers' logs and the store's state to read after the run
    with (
        tempfile.TemporaryDirectory(prefix="reckon-partition-", delete=not keep) as tmp,
        _running(partition, Path(tmp)) as running,
    ):
        if keep:
            log(f"  workdir kept: {tmp}")
        store, direct, queue, lanes = running
        ids = _create(store, tasks)
        deadline = time.monotonic() + timeout
        tally.phases["start"] = time.monotonic() - started
        _drive_lanes(partition, ids, store, queue, lanes, tally, deadline)
        tally.phases["lanes"] = time.monotonic() - started - tally.phases["start"]
        last_scan = 0.0
        while time.monotonic() < deadline and not killmatrix._finished(ids, partition.scenario):
            direct.replace_dead()
            if time.monotonic() - last_scan >= SCAN_EVERY:
                killmatrix.send_scan(queue)
                last_scan = time.monotonic()
            time.sleep(0.25)
        tally.phases["finish"] = time.monotonic() - started - tally.phases["start"] - tally.phases["lanes"]
        for lane in lanes:
            if lane.workers.processes[0].pid != lane.pid:
                tally.problems.append(f"lane {lane.n}'s worker had to be started again")
        row.fired = tally.partitioned
        if tally.partitioned != tasks:
            row.problems.append(f"the partition hit {tally.partitioned} of {tasks} tasks as intended")
        if row.link == "database" and tally.refused < tally.partitioned:
            row.problems.append(f"{tally.refused} late writes refused for {tally.partitioned} partitions")
        row.wrong += tally.late_commits  # a stale holder's write went through: the fencing failed
        _judge(row, partition, ids, store)
    return _reported(row, started, log)


def _judge(row: PartitionRow, partition: Partition, ids: list[int], store: StoreProcess) -> None:
    """The row's own problems, then the kill matrix's judgement of the run (while the simulator still runs)."""
    row.problems += row.tally.problems
    killmatrix._judge(row, partition.scenario, ids, store.call("/_stats"))


def _reported(row: PartitionRow, started: float, log: Callable[[str], None]) -> PartitionRow:
    """The row and its partitions' line, printed; its time from ``started`` (time.monotonic)."""
    row.seconds = time.monotonic() - started
    log(killmatrix._format_row(row))
    log(row.tally.line(row.link))
    return row


def _create(store: StoreProcess, tasks: int) -> list[int]:
    run = uuid.uuid4().hex[:6]
    connector = ObjectStoreConnector(store.url)
    ids = []
    for n in range(tasks):
        project = f"p{run}-{n}"
        source = killmatrix._source(project)
        store.call("/_sources", {"locator": source["locator"], "version": "1", "digest": source["digest"]})
        task = migrate_project.start(
            project=project,
            objects=OBJECTS,
            source=source,
            store=connector,
            max_batch=MAX_BATCH,
            created_by="partitions",
        )
        ids.append(task.pk)
    return ids


def _drive_lanes(
    partition: Partition,
    ids: list[int],
    store: StoreProcess,
    queue: str,
    lanes: list[Lane],
    tally: Tally,
    deadline: float,
) -> None:
    """Every task through a lane, one at a time per lane; nobody else wakes a task before its partition."""
    pending = list(enumerate(ids))
    grace = timedelta(seconds=partition.lease_grace)
    step = _remote_step if partition.link == "remote" else _database_step
    if partition.fault == "cut":
        step = _cut_step
    while (pending or any(lane.state != "idle" for lane in lanes)) and time.monotonic() < deadline:
        for lane in lanes:
            lane.workers.replace_dead()
            if lane.state == "idle":
                if not pending:
                    continue
                n, task_id = pending.pop(0)
                lane.task, lane.target, lane.state, lane.op = task_id, n % STEPS, "running", 0
                lane.since = time.monotonic()
                drive_task.apply_async((task_id,), queue=lane.queue)
                continue
            if lane.state == "running" and not Lease.objects.filter(task_id=lane.task).exists():
                lane.since = time.monotonic()  # not taken yet (a worker starting slowly): its clock has not started
            if time.monotonic() - lane.since > LANE_TIMEOUT:
                tally.problems.append(f"task {lane.task}: stuck in lane {lane.n} ({lane.state}); given up")
                lane.proxy.heal()
                lane.state = "idle"
                continue
            step(lane, store, queue, grace, tally)
        time.sleep(0.05)


def _dispatched(lane: Lane) -> Operation | None:
    """The lane's task's operation dispatched and not yet settled, if it is its ``target``-th or later."""
    ops = list(Operation.objects.filter(task_id=lane.task).order_by("pk").values_list("pk", "status"))
    for position, (pk, status) in enumerate(ops):
        if status == OperationStatus.DISPATCHED and position >= lane.target:
            return Operation.objects.get(pk=pk)
    return None


def _lane_done(lane: Lane) -> bool:
    """The lane's worker took the task and let it go again without being cut off (it ended, or waits)."""
    leases = Lease.objects.filter(task_id=lane.task)
    return leases.exists() and not leases.filter(released_at__isnull=True).exists()


def _database_step(lane: Lane, store: StoreProcess, queue: str, grace: timedelta, tally: Tally) -> None:
    if lane.state == "running":
        if (op := _dispatched(lane)) is not None:
            lane.proxy.blackhole()
            lane.op, lane.state, lane.since = op.pk, "confirming", time.monotonic()
        elif _lane_done(lane):
            tally.problems.append(f"task {lane.task}: its lane never reached a dispatch to cut off")
            lane.state = "idle"
    elif lane.state == "confirming":
        if time.monotonic() - lane.since < 0.3:
            return
        if Operation.objects.get(pk=lane.op).status != OperationStatus.DISPATCHED:
            # The outcome was on its way before the blackhole: not the partition this scenario is about. Heal and
            # cut it off at its next dispatch instead.
            tally.retried += 1
            lane.proxy.heal()
            lane.target, lane.state = 0, "running"
            return
        lane.state = "partitioned"
    elif lane.state == "partitioned":
        lapsed = Lease.objects.filter(lapsed_q(clock.now(), grace), task_id=lane.task).exists()
        if lapsed and Operation.objects.get(pk=lane.op).status == OperationStatus.DISPATCHED:
            if not lane.taken_over:
                drive_task.apply_async((lane.task,), queue=queue)  # as the recovery scan would: a direct worker
                lane.taken_over = True
                tally.takeovers += 1
            return
        if Operation.objects.get(pk=lane.op).status != OperationStatus.DISPATCHED:
            # Settled by the direct worker, by op key: now heal, and let the held writes reach the database late.
            lane.taken_over = False
            tally.partitioned += 1
            lane.log_offset = lane.log.stat().st_size if lane.log.exists() else 0
            lane.proxy.heal()
            lane.state, lane.since = "healing", time.monotonic()
    elif lane.state == "healing":
        refused, committed, finished = _late_lines(lane)
        if refused or finished:
            tally.refused += refused
            tally.late_commits += committed
            if committed:
                tally.problems.append(f"task {lane.task}: the stale worker committed {committed} change(s) late")
            lane.state = "idle"


def _late_lines(lane: Lane) -> tuple[int, int, bool]:
    """From the lane worker's log since the heal, for its task: refusals, state changes it committed, and whether
    its wake-up has ended."""
    refused = committed = 0
    finished = False
    with lane.log.open("rb") as f:
        f.seek(lane.log_offset)
        text = f.read().decode(errors="replace")
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        message = str(line.get("message", ""))
        if line.get("task_id") != lane.task:
            continue
        if message.startswith(("run stopped:", "write refused:")):  # tasks/engine/runner.py's refusal lines
            refused += 1
        elif line.get("logger") == STATE_LOGGER:
            committed += 1
        if "succeeded in" in message or "raised" in message:
            finished = True
    return refused, committed, finished


def _remote_step(lane: Lane, store: StoreProcess, queue: str, grace: timedelta, tally: Tally) -> None:
    if lane.state == "running":
        if (op := _dispatched(lane)) is not None:
            lane.proxy.blackhole("down")  # the request goes through, the remote commits, the answer is held
            lane.op, lane.state, lane.since = op.pk, "partitioned", time.monotonic()
        elif _lane_done(lane):
            tally.problems.append(f"task {lane.task}: its lane never reached a dispatch to cut off")
            lane.state = "idle"
        return
    op = Operation.objects.get(pk=lane.op)
    if lane.state == "partitioned":
        if op.status == OperationStatus.UNKNOWN:
            counted = store.call("/_stats").get("by_op_key", {}).get(op.op_key, 0)
            if counted != 1:
                tally.problems.append(f"task {lane.task}: {op.op_key} unknown, the remote counted it {counted} times")
            lane.proxy.heal()
            lane.state = "reconciling"
        elif op.status != OperationStatus.DISPATCHED:  # the answer came back before the blackhole: the next one
            tally.retried += 1
            lane.proxy.heal()
            lane.target, lane.state = 0, "running"
    elif lane.state == "reconciling" and op.status not in (OperationStatus.UNKNOWN, OperationStatus.DISPATCHED):
        if op.status == OperationStatus.COMMITTED:
            tally.partitioned += 1
            tally.reconciled += 1
        else:
            tally.problems.append(f"task {lane.task}: {op.op_key} reconciled as {op.status}, not committed")
        lane.state = "idle"


def _cut_step(lane: Lane, store: StoreProcess, queue: str, grace: timedelta, tally: Tally) -> None:
    """The database, as one worker sees a restart: every connection reset right after the dispatch commit, new ones
    refused for ``CUT_SECONDS``; the worker must reconnect by itself (it is never restarted) and the operation be
    settled by op key."""
    if lane.state == "running":
        if (op := _dispatched(lane)) is not None:
            lane.proxy.refuse()
            lane.proxy.cut()
            lane.op, lane.state, lane.since, lane.cut_at = op.pk, "confirming", time.monotonic(), time.monotonic()
        elif _lane_done(lane):
            tally.problems.append(f"task {lane.task}: its lane never reached a dispatch to cut off")
            lane.state = "idle"
        return
    status = Operation.objects.get(pk=lane.op).status
    if lane.state == "confirming" and time.monotonic() - lane.cut_at >= 0.3:
        if status != OperationStatus.DISPATCHED:  # its outcome was committed before the cut: the next dispatch
            tally.retried += 1
            lane.proxy.heal()
            lane.target, lane.state = 0, "running"
        else:
            lane.state = "partitioned"
    elif lane.state == "partitioned" and time.monotonic() - lane.cut_at >= CUT_SECONDS:
        lane.proxy.heal()
        lane.state = "reconciling"
    elif lane.state == "reconciling" and status in (OperationStatus.DISPATCHED, OperationStatus.UNKNOWN):
        # The worker's own retry may have come while its lapsed lease still stood (skipped: lease held); wake it
        # again, as the recovery scan would, once the lease is free — the same process, which must reconnect.
        held = Lease.objects.filter(held_q(clock.now(), grace), task_id=lane.task)
        if not held.exists() and time.monotonic() - lane.cut_at >= CUT_SECONDS + 2 * lane.woken + 1:
            lane.woken += 1
            drive_task.apply_async((lane.task,), queue=lane.queue)
    elif lane.state == "reconciling":
        if status == OperationStatus.COMMITTED:
            tally.partitioned += 1
        else:
            tally.problems.append(f"task {lane.task}: operation {lane.op} settled as {status}, not committed")
        lane.state, lane.woken = "idle", 0


# -- a restart of the run's own server -----------------------------------------------------------------------------


def pg_restart(pgdata: str) -> None:
    """``pg_ctl restart -m fast`` on the run's own server (as the data directory's owner when we are root)."""
    # The server's output to a log in its data directory: a pipe would be held open by the postmaster for ever.
    command = ["pg_ctl", "-D", pgdata, "restart", "-m", "fast", "-w", "-t", "60", "-l", f"{pgdata}/restart.log"]
    binary = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if binary:
        command[0] = str(binary[-1])
    if os.geteuid() == 0:
        import pwd

        command = ["runuser", "-u", pwd.getpwuid(Path(pgdata).stat().st_uid).pw_name, "--", *command]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=90)  # noqa: S603


def run_restart(
    partition: Partition, tasks: int, *, timeout: float, log: Callable[[str], None] = print
) -> PartitionRow:
    """Every worker direct; once a third of the tasks have an operation in flight, the server is restarted (fast
    shutdown: every connection and open transaction dropped), then recovery scans finish the run. The workers are
    never restarted (they reconnect: a wake-up that met the dead connection is retried), and the row is judged as
    the kill matrix judges it. The controller's own connection is dropped too: it reconnects as they do."""

    started = time.monotonic()
    row = PartitionRow(partition.name, tasks, link="restart")
    pgdata = os.environ.get(PGDATA_ENV, "")
    if connection.vendor != "postgresql" or not pgdata:
        raise NeedsPostgres(
            f"{partition.name!r} restarts the PostgreSQL server it runs on: set DATABASE_URL to a server of the run's "
            f"own and {PGDATA_ENV} to its data directory (never a shared server)"
        )
    port = int(connection.settings_dict["PORT"] or 5432)
    pid_file = Path(pgdata) / "postmaster.pid"
    serving = pid_file.read_text().splitlines()[3].strip() if pid_file.exists() else ""
    if serving != str(port):
        raise NeedsPostgres(
            f"{PGDATA_ENV}={pgdata} is not the server the run is on (port {port}; that directory's server: "
            f"{serving or 'not running'}): refusing to restart it"
        )
    with tempfile.TemporaryDirectory(prefix="reckon-partition-") as tmp, _running(partition, Path(tmp)) as running:
        store, direct, queue, _ = running
        ids = _create(store, tasks)
        pids = [p.pid for p in direct.processes]
        for task_id in ids:
            drive_task.apply_async((task_id,), queue=queue)

        def restart() -> bool:
            begun = Operation.objects.filter(task_id__in=ids).values("task_id").distinct().count()
            if begun * 3 < tasks:
                return False
            open_ops = Operation.objects.filter(task_id__in=ids, status__in=OPEN).count()
            connection.close()
            pg_restart(pgdata)
            row.tally.partitioned = tasks  # every task was in the run the restart hit
            log(f"  restarted the server: {begun} of {tasks} tasks begun, {open_ops} operations open")
            return True

        restarted = _fault_then_finish(partition, ids, queue, direct, time.monotonic() + timeout, restart)
        if not restarted:
            row.tally.problems.append("the server was never restarted")
        if [p.pid for p in direct.processes] != pids:
            row.tally.problems.append("a worker had to be started again")
        row.fired = row.tally.partitioned
        _judge(row, partition, ids, store)
    return _reported(row, started, log)


def _fault_then_finish(
    partition: Partition, ids: list[int], queue: str, direct: Workers, deadline: float, fault: Callable[[], bool]
) -> bool:
    """Drive the run until every task is finished: ``fault()`` is tried at each tick until it says it struck, the
    workers that died are replaced and recovery scans sent as beat would; the controller's own connection, dropped
    by the fault, reconnects as the workers' do. Whether the fault struck."""
    from django.db import OperationalError, close_old_connections

    struck, last_scan = False, time.monotonic()
    while time.monotonic() < deadline:
        try:
            direct.replace_dead()
            if not struck:
                struck = fault()
            elif killmatrix._finished(ids, partition.scenario):
                break
            if time.monotonic() - last_scan >= SCAN_EVERY:
                killmatrix.send_scan(queue)
                last_scan = time.monotonic()
        except OperationalError:
            close_old_connections()
            connection.close()
        time.sleep(0.25)
    return struck


# -- a failover to a synchronous standby ---------------------------------------------------------------------------


def run_failover(
    partition: Partition, tasks: int, *, timeout: float, log: Callable[[str], None] = print
) -> PartitionRow:
    """Every worker direct, on a primary and its synchronous standby of the run's own (harness/failover.py), through
    one multi-host URL; once a third of the tasks have begun, the primary is stopped in immediate mode and the
    standby promoted, then recovery scans finish the run. The workers are never restarted. Judged as the kill matrix
    judges a row, and by harness/failover.py's checks: lost commits, the logs, one lease holder at a time."""
    started = time.monotonic()
    row = PartitionRow(partition.name, tasks, link="failover")
    tally = row.tally
    keep = bool(os.environ.get(KEEP_ENV))
    with (
        tempfile.TemporaryDirectory(prefix="reckon-failover-", delete=not keep) as tmp,
        failover.pg_pair(Path(tmp)) as pair,
    ):
        tally.phases["clusters"] = time.monotonic() - started
        with failover.connected_to(pair.url), _running(partition, Path(tmp)) as (store, direct, queue, _lanes):
            ids = _create(store, tasks)
            pids = [p.pid for p in direct.processes]
            for task_id in ids:
                drive_task.apply_async((task_id,), queue=queue)
            before: dict[int, int] = {}
            third = 0.0  # when a third of the tasks had begun

            def fail_over() -> bool:
                nonlocal third
                begun = Operation.objects.filter(task_id__in=ids).values("task_id").distinct().count()
                open_ops = Operation.objects.filter(task_id__in=ids, status__in=OPEN).count()
                # A third begun, and an operation in flight (or, failing that, 5 s later): the crash meets calls made
                # and not yet recorded.
                third = third or (time.monotonic() if begun * 3 >= tasks else 0.0)
                if not third or not (open_ops or time.monotonic() - third > 5):
                    return False
                before.update(failover.versions(ids))
                connection.close()
                stopped = time.monotonic()
                pair.primary.stop("immediate")
                pair.standby.promote()
                tally.partitioned = tasks  # every task was in the run the failover hit
                tally.phases["failover"] = time.monotonic() - stopped
                log(
                    f"  primary stopped (immediate) with {begun} of {tasks} tasks begun, {open_ops} operations open; "
                    f"standby promoted in {tally.phases['failover']:.1f} s"
                )
                return True

            failed_over = _fault_then_finish(partition, ids, queue, direct, time.monotonic() + timeout, fail_over)
            if not failed_over:
                tally.problems.append("the primary was never failed over")
            if [p.pid for p in direct.processes] != pids:
                tally.problems.append("a worker had to be started again")
            if pair.standby.query("SELECT pg_is_in_recovery()", failover.DATABASE) != [(False,)]:
                tally.problems.append("the promoted standby is not a primary at the end")
            tally.problems.extend(failover.lost_commits(before, failover.versions(ids)))
            tally.problems.extend(failover.log_problems(ids))
            tally.problems.extend(failover.lease_problems(ids))
            row.fired = tally.partitioned
            _judge(row, partition, ids, store)
    return _reported(row, started, log)


# -- clocks skewed by minutes ----------------------------------------------------------------------------------------

# Each worker's clock against the driver's (which sends the scans, as beat would), and the remote's: minutes, where a
# lease lasts seconds. Set per process by libfaketime (Debian's faketime package), monotonic clocks left true.
SKEWS = ("-10m", "+3m", "+10m")
REMOTE_SKEW = "+5m"
REMOTE_DEADLINE_SECONDS = 420
FAKETIME_LIBRARIES = tuple(f"/usr/lib/{arch}-linux-gnu/faketime/libfaketime.so.1" for arch in ("x86_64", "aarch64"))


class NeedsFaketime(RuntimeError):
    """The clock-skew row sets each process's clock with libfaketime: apt-get install faketime."""


def faketime_library() -> str:
    for path in FAKETIME_LIBRARIES:
        if Path(path).exists():
            return path
    raise NeedsFaketime(
        f"'clocks skewed' needs libfaketime (apt-get install faketime); looked in {', '.join(FAKETIME_LIBRARIES)}"
    )


def skewed(env: dict[str, str], offset: str, library: str) -> dict[str, str]:
    """``env`` for a process whose wall clock runs ``offset`` (libfaketime's "+10m", "-10m") from the real one."""
    return env | {"LD_PRELOAD": library, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _clock_offset(env: dict[str, str]) -> float:
    """Seconds a process started with ``env`` reads its wall clock ahead of ours: the skew must have taken."""
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"], env=env, capture_output=True, text=True, check=True
    )
    return float(probe.stdout) - time.time()


def _offset_seconds(offset: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(offset[:-1]) * units[offset[-1]]


def run_skew(partition: Partition, tasks: int, *, timeout: float, log: Callable[[str], None] = print) -> PartitionRow:
    """Three direct workers whose clocks disagree with each other, with the driver's and with the remote's by minutes
    (leases last seconds), each SIGKILLed once per task after its call (``after_call=kill_once``): the wake-up that
    died is found by the recovery scan once the lease lapses — on the database clock — and taken by whichever worker
    comes, whatever its clock says (a dead worker is replaced only after that, so most takeovers are by a worker of
    another clock). Judged as the kill matrix judges; besides, some task must have been held by workers of two
    different clocks (``partitioned`` counts them), and each process's clock must really have been skewed."""
    started = time.monotonic()
    row = PartitionRow(partition.name, tasks, link="clock")
    tally = row.tally
    library = faketime_library()
    with tempfile.TemporaryDirectory(prefix="reckon-partition-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        remote_env = skewed(dict(os.environ), REMOTE_SKEW, library)
        store = StoreProcess(workdir / "store.json", env=remote_env)
        stack.callback(store.stop)
        queue = f"partition-{uuid.uuid4().hex[:10]}"
        env = _worker_env(
            partition,
            store,
            RECKON_FAILPOINTS="after_call=kill_once",
            RECKON_FAILPOINT_DIR=str(workdir / "failpoints"),
            # The remote runs minutes ahead: a request's deadline (sent on the database clock) must exceed that, or
            # the store refuses every write as late (as an operator sets it for such a remote; docs/operations.md).
            RECKON_REQUEST_DEADLINE_SECONDS=str(REMOTE_DEADLINE_SECONDS),
        )
        for offset, process_env in [(REMOTE_SKEW, remote_env), *((o, skewed(env, o, library)) for o in SKEWS)]:
            seen = _clock_offset(process_env)
            if abs(seen - _offset_seconds(offset)) > 30:
                tally.problems.append(f"a process meant to run {offset} reads its clock {seen:+.0f} s off")
        groups = [Workers(1, queue, skewed(env, offset, library), workdir / f"workers{offset}.log") for offset in SKEWS]
        stack.callback(_stop_all, list(groups))
        clock_of: dict[int, str] = {}  # worker pid → its skew (replacements included)

        def note_pids() -> None:
            for offset, group in zip(SKEWS, groups, strict=True):
                for process in group.processes:
                    clock_of.setdefault(process.pid, offset)

        ids = _create(store, tasks)
        tally.phases["start"] = time.monotonic() - started
        for task_id in ids:
            drive_task.apply_async((task_id,), queue=queue)
        deadline, last_scan = time.monotonic() + timeout, 0.0
        note_pids()
        died: dict[int, float] = {}  # group → when its worker was found dead
        # A dead worker is replaced only once its lease has lapsed and a scan or two have run: meanwhile the task is
        # taken by a worker of another clock.
        replace_after = partition.lease_ttl + partition.lease_grace + 2 * SCAN_EVERY
        while time.monotonic() < deadline and not killmatrix._finished(ids, partition.scenario):
            for n, group in enumerate(groups):
                if group.processes[0].poll() is None:
                    continue
                died.setdefault(n, time.monotonic())
                if time.monotonic() - died[n] >= replace_after or len(died) == len(groups):
                    group.replace_dead()
                    del died[n]
            note_pids()
            if time.monotonic() - last_scan >= SCAN_EVERY:
                killmatrix.send_scan(queue)
                last_scan = time.monotonic()
            time.sleep(0.25)
        tally.phases["run"] = time.monotonic() - started - tally.phases["start"]
        for group in groups:
            group.replace_dead()
        note_pids()
        row.kills = sum(group.kills for group in groups)
        row.fired = hits("after_call", workdir / "failpoints")
        if row.fired != tasks:
            row.problems.append(f"after_call fired for {row.fired} of {tasks} tasks")
        for task_id in ids:
            holders = Lease.objects.filter(task_id=task_id).values_list("holder_id", flat=True)
            clocks = {clock_of.get(int(h.rsplit(":", 1)[-1]), "?") for h in holders if h.startswith("worker:")}
            tally.partitioned += len(clocks - {"?"}) >= 2
        if not tally.partitioned:
            row.problems.append("no task was taken over by a worker of another clock: the row proved nothing")
        _judge(row, partition, ids, store)
    return _reported(row, started, log)


# -- a restart of the run's own broker ---------------------------------------------------------------------------------

# Claims on wake-ups lapse this long after they are due in the broker row (the default is 120 s): a wake-up lost with
# the broker is queued again by the first scan after its claim lapses, so this bounds the row's time, not its outcome.
BROKER_ROW_WAKE_UP_EXPIRY = 5


class NeedsRedis(RuntimeError):
    """The broker row starts a Redis server of its own: redis-server must be installed."""


# A Celery worker on Redis whose connection drops while it holds an unacknowledged message (acks_late) may exit:
# closing the channel restores the message over a connection kombu has already let go of (kombu 5.7's Redis
# transport, Channel._connparams on a None client). A deployment's supervisor starts it again, and the message was
# never acknowledged, so nothing is lost; the row starts it again as a supervisor would and counts it.
KOMBU_RESTORE_RACE = "Unrecoverable error: AttributeError(\"'NoneType' object has no attribute 'hostname'\")"


def _judge_worker_exits(tally: Tally, started: list[int], now: list[int], log: Path) -> None:
    """The broker row's workers are never to be restarted, but for kombu's restore race (KOMBU_RESTORE_RACE, as a
    supervisor would): any other exit is a problem."""
    exits = sum(1 for before, after in zip(started, now, strict=True) if before != after)
    raced = log.read_text(errors="replace").count(KOMBU_RESTORE_RACE) if log.exists() else 0
    if exits > raced:
        tally.problems.append(f"{exits} worker(s) had to be started again, {raced} of them on kombu's restore race")
    tally.restarted = exits


@contextmanager
def _own_redis(workdir: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    """A Redis server of the run's own on a free loopback port, nothing persisted (what it holds is lost with it, as
    a broker restarted without persistence loses its queues); yields its URL and a function that restarts it."""
    import shutil

    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise NeedsRedis("'broker restarted' starts a Redis server of its own: install redis-server")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    command += ["--dir", str(workdir)]
    process: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        with (workdir / "redis.log").open("ab") as log:  # the server keeps its own copy of the descriptor
            process.append(subprocess.Popen(command, stdout=log, stderr=log))  # noqa: S603
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise NeedsRedis(f"the run's own Redis did not start on port {port}")

    def restart() -> None:
        process[-1].terminate()
        process[-1].wait(10)
        start()

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", restart
    finally:
        process[-1].terminate()
        with suppress(subprocess.TimeoutExpired):
            process[-1].wait(10)
        if process[-1].poll() is None:
            process[-1].kill()


def run_broker_restart(
    partition: Partition, tasks: int, *, timeout: float, log: Callable[[str], None] = print
) -> PartitionRow:
    """Direct workers on a Redis of the run's own; once a third of the tasks have begun, the Redis server is
    restarted without persistence: every wake-up and scan queued, and every message a worker had taken but not
    acknowledged, is gone. The workers are not restarted (they reconnect) but for kombu's restore race
    (KOMBU_RESTORE_RACE); the recovery scan — which reads the database, not the broker — queues every task needing
    work again once its claim lapses. Judged as the kill matrix
    judges: nothing lost, nothing duplicated."""
    import kombu.exceptions

    app = drive_task.app
    started = time.monotonic()
    row = PartitionRow(partition.name, tasks, link="broker")
    tally = row.tally
    keep = bool(os.environ.get(KEEP_ENV))  # keep the workers' and the broker's logs to read after the run
    with (
        tempfile.TemporaryDirectory(prefix="reckon-partition-", delete=not keep) as tmp,
        ExitStack() as stack,
    ):
        workdir = Path(tmp)
        if keep:
            log(f"  workdir kept: {tmp}")
        broker, restart = stack.enter_context(_own_redis(workdir))
        store = StoreProcess(workdir / "store.json")
        stack.callback(store.stop)
        queue = f"partition-{uuid.uuid4().hex[:10]}"
        env = _worker_env(
            partition,
            store,
            CELERY_BROKER_URL=broker,
            RECKON_WAKE_UP_EXPIRY_SECONDS=str(BROKER_ROW_WAKE_UP_EXPIRY),
        )
        workers = Workers(partition.direct_workers, queue, env, workdir / "workers.log")
        stack.callback(workers.stop)
        pids = [p.pid for p in workers.processes]
        # This process sends as beat would, to the run's own broker (named on the connection: CELERY_BROKER_URL in the
        # environment, this process's own broker, would take precedence over an app's configuration).
        sender = app.connection_for_write(broker)
        stack.callback(sender.release)

        def send(name: str, args: tuple[object, ...], to: str) -> None:
            try:
                app.send_task(name, args=args, queue=to, retry=False, connection=sender)
            except (OSError, kombu.exceptions.OperationalError):
                sender.close()  # the broker is down for a moment: the next tick sends again, on a new connection

        ids = _create(store, tasks)
        for task_id in ids:
            send("tasks.drive_task", (task_id,), queue)
        deadline, restarted, last_scan = time.monotonic() + timeout, False, time.monotonic()
        tally.phases["start"] = time.monotonic() - started
        while time.monotonic() < deadline:
            workers.replace_dead()
            if not restarted:
                begun = Operation.objects.filter(task_id__in=ids).values("task_id").distinct().count()
                if begun * 3 >= tasks:
                    import redis

                    queued = redis.Redis.from_url(broker).llen(queue)
                    restart()
                    restarted = True
                    tally.partitioned, tally.reconciled = begun, int(queued)
                    log(f"  restarted the broker: {begun} of {tasks} tasks begun, {queued} messages queued")
            elif killmatrix._finished(ids, partition.scenario):
                break
            if time.monotonic() - last_scan >= SCAN_EVERY:
                send("tasks.recovery_scan", (queue,), killmatrix.scan_queue(queue))
                last_scan = time.monotonic()
            time.sleep(0.25)
        tally.phases["run"] = time.monotonic() - started - tally.phases["start"]
        if not restarted:
            tally.problems.append("the broker was never restarted")
        _judge_worker_exits(tally, pids, [p.pid for p in workers.processes], workdir / "workers.log")
        row.fired = tasks if restarted else 0
        _judge(row, partition, ids, store)
    return _reported(row, started, log)
