"""The kill matrix: real worker processes, the real simulator process, SIGKILLs at named failpoints.

Each scenario starts its own simulator (a fresh state file), its own queue and its own Celery worker processes
(``--pool=solo``: a failpoint's SIGKILL takes the whole worker down), creates tasks of the reference agent's kind,
wakes them, and then acts as the deployment would: a worker that died is replaced by a fresh one, and a recovery
scan is sent every ``SCAN_EVERY`` seconds, as Celery beat would — on a queue of its own (``scan_queue``) that the
workers also consume, so that it never waits behind the wake-ups it queued. When every task has ended (or the
deadline passed) it checks the facts — the simulator's side-effect counts against the database's operations and
receipts — and reports one row. ``manage.py verify_matrix`` prints the table and exits non-zero on any failure.
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User

from audit.errors import Refused
from audit.principals import Principal
from harness.zygote import Process, start_worker, worker_command
from reference import migrate_project
from reference.objectstore import Idempotency, ObjectStoreConnector
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, NodeStatus, OperationStatus, TaskStatus, TempResourceStatus
from tasks.decide.evidence import evidence_problems
from tasks.engine.cleanup import CLEANABLE
from tasks.engine.failpoints import hits
from tasks.engine.verification import find_problems
from tasks.jobs import drive_task, recovery_scan
from tasks.models import LoggedEvent, Node, Operation, OperationPurpose, Receipt, Task, TempResource
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import (
    NodeResult,
    takeover_claim,
    takeover_submit,
)

ROOT = Path(settings.BASE_DIR)
SCAN_EVERY = 2.0
SABOTAGE_ENV = "RECKON_MATRIX_SABOTAGE"  # a fault (JSON) added to every scenario's store, for the matrix's own test
OBJECTS, MAX_BATCH = 30, 10  # three copy batches per task
KILL_POINTS = ("before_intent", "before_call", "after_call", "after_receipt", "after_advance", "mid_cleanup")


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    workers: int = 2
    failpoints: str = ""
    copies_per_message: int = 1  # every wake-up message (and scan) sent this many times
    faults: tuple[dict[str, Any], ...] = ()
    lease_ttl: int = 3
    lease_grace: int = 1
    expect: str = TaskStatus.COMPLETED.value
    act: str = ""  # what the driver does meanwhile: "cancel" or "change_input"
    idempotency: Idempotency = "remote"  # "tag": the store does not dedupe; the connector queries by the op-key tag
    call_timeout: float = 5.0  # how long the workers' connector waits for the store's answer
    drain: float = 0.0  # seconds to wait once every task has ended, for requests the store still holds to land
    late: bool = False  # the scenario is about late requests: the store must have refused some (else it proved nothing)

    @property
    def key(self) -> str:
        """The name on the command line (--scenario) and in RECKON_MATRIX_SCENARIOS: spaces as underscores."""
        return self.name.replace(" ", "_")


SCENARIOS = [
    *(
        Scenario(f"kill {point}", f"SIGKILL once per task at {point}", failpoints=f"{point}=kill_once")
        for point in KILL_POINTS
    ),
    Scenario(
        "kill after_call no-dedupe",
        "the store does not dedupe by op key (local registry + query by tag); SIGKILL once per task after the call",
        failpoints="after_call=kill_once",
        faults=({"mode": "no_idempotency"},),
        idempotency="tag",
    ),
    Scenario("messages twice", "every wake-up and every scan delivered twice", copies_per_message=2),
    Scenario("2 workers", "two workers, every task woken on both", workers=2, copies_per_message=2),
    Scenario("8 workers", "eight workers, every task woken on all", workers=8, copies_per_message=8),
    Scenario(
        "accept then timeout",
        "the store commits, the connection drops before the answer",
        faults=({"mode": "accept_then_drop", "times": 10**6, "every": 3},),
    ),
    Scenario(
        "accepted then observed",
        "every third write is accepted and runs 1 s remotely; observed by op key until it commits",
        faults=({"mode": "run_async", "times": 10**6, "ms": 1000, "every": 3},),
    ),
    Scenario(
        "cancel in delayed call",
        "cancel while the remote call is delayed 1.5 s",
        faults=({"mode": "latency", "times": 10**6, "ms": 1500},),
        expect=TaskStatus.STOPPED.value,
        act="cancel",
    ),
    Scenario(
        "late request after cancel",
        "every copy is held 3 s by the store, its caller gives up after 1 s; cancelled while one is in flight: the"
        " fence refuses it when it lands",
        faults=({"mode": "latency", "times": 10**6, "ms": 3000, "action": "copy_batch"},),
        expect=TaskStatus.STOPPED.value,
        act="cancel",
        call_timeout=1.0,
        drain=3.5,
        late=True,
    ),
    Scenario(
        "input changed in pause",
        "the source changes while a person holds the task; handed back",
        expect=TaskStatus.PAUSED.value,
        act="change_input",
    ),
    Scenario(
        "lease expires in call",
        "the irreversible switch outlasts the lease (4 s) and its grace; another worker takes over",
        faults=({"mode": "latency", "times": 10**6, "ms": 6000, "action": "switch_reference"},),
    ),
]


@dataclass
class Row:
    scenario: str
    tasks: int
    expected: int = 0
    counted: int = 0
    duplicates: int = 0
    unknowns: int = 0
    skipped: int = 0
    wrong: int = 0
    kills: int = 0
    denied: int = 0  # effects the store counted under op keys the log records as never taking effect (rejected)
    late: int = 0  # requests the store refused as fenced or past their deadline
    fired: int = -1  # tasks a kill_once failpoint fired for; -1 when the scenario sets none
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        clean = not (self.duplicates or self.unknowns or self.skipped or self.wrong or self.denied)
        # A kill scenario proves something only if its failpoint fired for every task.
        return clean and self.expected == self.counted and self.fired in (-1, self.tasks)


# -- processes -------------------------------------------------------------------------------------------------


# The simulator with its state in memory only: no journal line fsynced per write (a disk flush per side effect is the
# bottleneck of a benchmark of 1,000 tasks, and of no scenario about Reckon).
IN_MEMORY = "import harness.simulator as s; s.Store.persist = lambda self: None; s.main()"


class StoreProcess:
    """The simulator, as its own process, on a free loopback port. ``persist=False``: its state lives in memory
    only (it cannot be restarted on it), for benchmarks that never restart it."""

    def __init__(self, state: Path, *, persist: bool = True, env: dict[str, str] | None = None) -> None:
        entry = ["-m", "harness.simulator"] if persist else ["-c", IN_MEMORY]
        command = [sys.executable, *entry, "--port", "0", "--state", str(state)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)  # noqa: S603
        out = self.process.stdout
        ready = select.select([out], [], [], 15)[0] if out is not None else []
        line = out.readline() if out is not None and ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the simulator did not start: {line!r}")
        self.url = line.removeprefix("listening on ").strip()

    def call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - loopback, our own process
            self.url + path, data=data, method="POST" if data is not None else "GET"
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


def scan_queue(queue: str) -> str:
    """The queue the recovery scans of a run on ``queue`` are sent on: a queue of its own, as beat's
    RECKON_SCAN_QUEUE, so that a scan never waits behind the wake-ups it queued (they go on ``queue``)."""
    return f"{queue}-scan"


def send_scan(queue: str, *, copies: int = 1) -> None:
    """Send a recovery scan as beat would: on the scan queue, waking tasks on ``queue`` (no expiry: beat sets none,
    see tasks.jobs.recovery_scan)."""
    for _ in range(copies):
        recovery_scan.apply_async((queue,), queue=scan_queue(queue))


class Workers:
    """``count`` Celery worker processes on ``queue`` and its scan queue; a dead one is replaced by a fresh one
    (``replace_dead``)."""

    def __init__(self, count: int, queue: str, env: dict[str, str], log: Path) -> None:
        self.queue, self.env, self.log = queue, env, log
        self.kills = 0
        self.processes = [self._start(n) for n in range(count)]

    def _start(self, n: int) -> Process:
        command = worker_command(f"{self.queue},{scan_queue(self.queue)}", f"w{n}-{uuid.uuid4().hex[:6]}@%h")
        return start_worker(command, env=self.env, log=self.log)

    def replace_dead(self) -> None:
        for n, process in enumerate(self.processes):
            if process.poll() is not None:
                self.kills += process.returncode == -signal.SIGKILL
                self.processes[n] = self._start(n)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


# -- a scenario ------------------------------------------------------------------------------------------------


def database_url(name: str = "") -> str:
    """A DATABASE_URL for another process: the configured database, or ``name`` on the same server."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{name or db['NAME']}"
    # A primary and its standbys (console/database_url.py): every host, and the session it asks for.
    hosts = str(db["HOST"] or "127.0.0.1").split(",")
    ports = str(db["PORT"] or 5432).split(",")
    netloc = ",".join(f"{host}:{port}" for host, port in zip(hosts, ports * len(hosts), strict=False))
    wanted = (db.get("OPTIONS") or {}).get("target_session_attrs")
    query = f"?target_session_attrs={wanted}&connect_timeout=2" if wanted else ""
    return f"postgres://{db['USER']}@{netloc}/{name or db['NAME']}{query}"


@contextmanager
def _running(scenario: Scenario, workdir: Path) -> Iterator[tuple[StoreProcess, Workers, str]]:
    store = StoreProcess(workdir / "store.json")
    queue = f"matrix-{uuid.uuid4().hex[:10]}"
    env = os.environ | {
        "DATABASE_URL": database_url(),
        "RECKON_OBJECTSTORE_URL": store.url,
        "RECKON_FAILPOINTS": scenario.failpoints,
        "RECKON_FAILPOINT_DIR": str(workdir / "failpoints"),
        "RECKON_LEASE_TTL_SECONDS": str(scenario.lease_ttl),
        "RECKON_LEASE_GRACE_SECONDS": str(scenario.lease_grace),
        "RECKON_LOG_LEVEL": "WARNING",
        "RECKON_OBJECTSTORE_IDEMPOTENCY": scenario.idempotency,
        "RECKON_OBJECTSTORE_TIMEOUT_SECONDS": str(scenario.call_timeout),
    }
    workers: Workers | None = None
    try:
        workers = Workers(scenario.workers, queue, env, workdir / "workers.log")
        yield store, workers, queue
    finally:
        if workers is not None:
            workers.stop()
        store.stop()


def _source(project: str) -> dict[str, Any]:
    return {"source": "store", "locator": f"projects/{project}", "version": "1", "digest": "sha256:" + "5e" * 32}


def run_scenario(
    scenario: Scenario,
    tasks: int,
    *,
    timeout: float,
    log: Callable[[str], None] = print,
    objects: int = OBJECTS,
) -> Row:
    """``objects``: what each task migrates, in batches of ``MAX_BATCH`` (100,000: a task of 10,003 nodes)."""
    started = time.monotonic()
    row = Row(scenario.name, tasks)
    with tempfile.TemporaryDirectory(prefix="reckon-matrix-") as tmp, _running(scenario, Path(tmp)) as running:
        store, workers, queue = running
        run = uuid.uuid4().hex[:6]
        connector = ObjectStoreConnector(store.url, idempotency=scenario.idempotency)
        created = []
        for n in range(tasks):
            project = f"m{run}-{n}"
            source = _source(project)
            store.call("/_sources", {"locator": source["locator"], "version": "1", "digest": source["digest"]})
            created.append(
                migrate_project.start(
                    project=project,
                    objects=objects,
                    source=source,
                    store=connector,
                    max_batch=MAX_BATCH,
                    created_by="matrix",
                    confirm_switch=scenario.act == "change_input",
                )
            )
        for fault in scenario.faults:
            store.call("/_faults", fault)
        if sabotage := os.environ.get(SABOTAGE_ENV):  # proves the matrix can fail: e.g. a store that stops deduping
            store.call("/_faults", json.loads(sabotage))
        ids = [t.pk for t in created]

        def wake_all() -> None:
            for _ in range(scenario.copies_per_message):
                for task_id in ids:
                    drive_task.apply_async((task_id,), queue=queue)

        def wake_one(task_id: int) -> None:
            drive_task.apply_async((task_id,), queue=queue)

        handed: set[int] = set()
        wake_all()
        deadline = time.monotonic() + timeout
        last_scan, acted = time.monotonic(), False
        while time.monotonic() < deadline:
            workers.replace_dead()
            if scenario.act == "cancel" and not acted:
                acted = _cancel_in_flight(ids)
            if scenario.act == "change_input" and not acted:
                acted = _change_inputs_and_hand_back(ids, store, handed, wake_one)
            if _finished(ids, scenario):
                break
            if time.monotonic() - last_scan >= SCAN_EVERY:
                send_scan(queue, copies=scenario.copies_per_message)
                last_scan = time.monotonic()
            time.sleep(0.25)
        workers.replace_dead()
        time.sleep(scenario.drain)  # a request the store still holds lands (or is refused) before the count
        row.kills = workers.kills
        if scenario.failpoints:
            point = scenario.failpoints.partition("=")[0]
            row.fired = hits(point, Path(tmp) / "failpoints")
            if row.fired != tasks:
                row.problems.append(f"{point} fired for {row.fired} of {tasks} tasks")
        stats = store.call("/_stats")
        row.late = int(stats.get("refused_fenced", 0)) + int(stats.get("refused_late", 0))
        if scenario.late and not row.late:
            row.problems.append("no request reached the store late: the scenario tried nothing")
            row.wrong += 1
        _judge(row, scenario, ids, stats, objects=objects)
    row.seconds = time.monotonic() - started
    log(_format_row(row))
    return row


def _finished(ids: list[int], scenario: Scenario) -> bool:
    tasks = Task.objects.filter(pk__in=ids)
    if scenario.expect == TaskStatus.PAUSED:
        return tasks.filter(status=TaskStatus.PAUSED, status_reason="input_changed").count() == len(ids)
    # A paused or quarantined task moves no further without a person: the run is over, and _judge says what is wrong
    # (a broken run fails at once instead of waiting out its timeout).
    statuses = set(tasks.values_list("status", flat=True))
    if not statuses <= {*CLEANABLE, TaskStatus.PAUSED, TaskStatus.QUARANTINED}:
        return False
    if not statuses <= set(CLEANABLE):
        return True
    undone = [TempResourceStatus.ACTIVE, TempResourceStatus.CLEANING]
    return not TempResource.objects.filter(task_id__in=ids, status__in=undone).exists()


def _cancel_in_flight(ids: list[int]) -> bool:
    """Cancel each task once it has sent its first batch copy (its call then delayed by the store)."""
    cancelled = 0
    for task in Task.objects.filter(pk__in=ids):
        if task.cancel_requested_at is not None:
            cancelled += 1
        elif Operation.objects.filter(task=task, action="store.copy_batch").exists():
            task_request_cancel(actor=Principal.system("matrix"), task_id=task.pk, reason="kill matrix: cancel")
            cancelled += 1
    return cancelled == len(ids)


def _operator() -> Principal:
    user, _ = User.objects.get_or_create(username="matrix-operator")
    user.groups.add(Group.objects.get(name="admin"))
    return Principal.of_user(user)


def _change_inputs_and_hand_back(
    ids: list[int], store: StoreProcess, handed: set[int], wake: Callable[[int], None]
) -> bool:
    """Once a task waits at its confirmation point: a person claims it, the source moves to version 2 meanwhile, the
    person approves and hands it back. The agent must re-read the source and pause input_changed. A claim that
    races a worker's wake-up is refused by name (the lease moved): it is tried again on the next tick."""
    operator = _operator()
    ready = Node.objects.filter(task_id__in=ids, key="approve-switch", status=NodeStatus.PENDING)
    verified = set(
        Node.objects.filter(task_id__in=ids, key="verify-digests", status=NodeStatus.SUCCEEDED).values_list(
            "task_id", flat=True
        )
    )
    for task_id in ready.filter(task_id__in=verified).exclude(task_id__in=handed).values_list("task_id", flat=True):
        try:
            claim = takeover_claim(actor=operator, task_id=task_id)
            if claim.lease is None:
                continue  # reserved: granted once the worker lets go
            source = Task.objects.get(pk=task_id).input_refs["prepare-target.source"]
            store.call("/_sources", {"locator": source["locator"], "version": "2", "digest": source["digest"]})
            takeover_submit(
                actor=operator,
                lease=claim.lease,
                based_on_version=Task.objects.get(pk=task_id).version,
                decision="resume_agent",
                results=[NodeResult(node_key="approve-switch", remote_id=f"approval:{operator.id}:{task_id}")],
                note="approved in the kill matrix",
            )
        except Refused:
            continue
        handed.add(task_id)
        wake(task_id)
    return len(handed) == len(ids)


# -- judging ---------------------------------------------------------------------------------------------------


def _judge(row: Row, scenario: Scenario, ids: list[int], stats: dict[str, Any], *, objects: int = OBJECTS) -> None:
    by_key: dict[str, int] = stats.get("by_op_key", {})
    for task in Task.objects.filter(pk__in=ids).order_by("pk"):
        mine = {key: n for key, n in by_key.items() if task.uid.hex in key}
        ops = list(Operation.objects.filter(task=task).select_related("node"))
        committed = [op for op in ops if op.status == OperationStatus.COMMITTED and not op.settled_by]
        receipts = set(Receipt.objects.filter(operation__task=task).values_list("operation__op_key", flat=True))
        row.counted += sum(mine.values())
        row.expected += _expected_effects(task, scenario, committed, objects)
        row.duplicates += sum(n - 1 for n in mine.values() if n > 1)
        per_node: dict[int, int] = {}
        for op in committed:
            if op.purpose == OperationPurpose.EFFECT:
                per_node[op.node_id] = per_node.get(op.node_id, 0) + 1
        row.duplicates += sum(n - 1 for n in per_node.values() if n > 1)
        # The log says these never took effect (rejected: refused, cancelled, fenced, not done): the store agrees.
        denied = [op.op_key for op in ops if op.status == OperationStatus.REJECTED and mine.get(op.op_key)]
        row.denied += sum(mine[key] for key in denied)
        if denied:
            row.problems.append(f"task {task.pk}: effects the log denies under {denied}")
        unknown = [op.op_key for op in ops if op.status in OPEN_OPERATION_STATUSES]
        row.unknowns += len(unknown)
        unrecorded = [key for key in mine if key not in receipts]  # an effect the store counted, with no receipt
        row.unknowns += len(unrecorded)
        if unknown or unrecorded:
            row.problems.append(f"task {task.pk}: open {unknown}, effects without receipt {unrecorded}")
        skipped = _skipped_steps(task)
        row.skipped += len(skipped)
        row.problems += [f"task {task.pk}: {s}" for s in skipped]
        wrong = _wrong_final_state(task, scenario)
        row.wrong += bool(wrong)
        row.problems += [f"task {task.pk}: {w}" for w in wrong]


def _expected_effects(task: Task, scenario: Scenario, committed: list[Operation], objects: int = OBJECTS) -> int:
    """What the store should have counted for this task: one per effect node that ran, one per temp resource
    deleted. A cancelled task ran only what committed before or during the cancel (each one with a receipt)."""
    batches = len(migrate_project.batches(objects, MAX_BATCH))
    if scenario.expect == TaskStatus.COMPLETED:
        return 3 + batches + batches  # prepare, copies, verify, switch; one temp staging copy deleted per batch
    return len(committed)  # cancelled or paused: every effect the store counted must be one of these


def _skipped_steps(task: Task) -> list[str]:
    problems = []
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version))
    succeeded = {n.key for n in nodes if n.status == NodeStatus.SUCCEEDED}
    for node in nodes:
        if node.status != NodeStatus.SUCCEEDED:
            continue
        if not set(node.depends_on) <= succeeded:
            problems.append(f"{node.key} succeeded before {sorted(set(node.depends_on) - succeeded)}")
        op = (
            Operation.objects.filter(node=node, status=OperationStatus.COMMITTED, purpose=OperationPurpose.EFFECT)
            .order_by("-pk")
            .first()
        )
        receipt = Receipt.objects.filter(operation=op).first() if op else None
        if op is None or receipt is None:
            problems.append(f"{node.key} succeeded without a receipt")
        elif not op.settled_by and (issues := evidence_problems(node, op, receipt)):
            problems.append(f"{node.key} succeeded on a receipt that fails its evidence: {issues}")
    if task.status == TaskStatus.COMPLETED and len(succeeded) != len(nodes):
        problems.append(f"completed with {sorted({n.key for n in nodes} - succeeded)} not done")
    cancel_seq = LoggedEvent.objects.filter(task=task, type="cancel_requested").values_list("seq", flat=True).first()
    if cancel_seq is not None:
        late = LoggedEvent.objects.filter(
            task=task, seq__gt=cancel_seq, type__in=["intent_registered", "operation_dispatched"]
        )
        problems += [f"{e.type} at seq {e.seq}, after the cancel (seq {cancel_seq})" for e in late]
    return problems


def _wrong_final_state(task: Task, scenario: Scenario) -> list[str]:
    problems = []
    if task.status != scenario.expect:
        problems.append(f"ended {task.status} ({task.status_reason}), expected {scenario.expect}")
    if scenario.act == "change_input":
        if task.status_reason != "input_changed":
            problems.append(f"paused for {task.status_reason!r}, expected input_changed")
        if Operation.objects.filter(task=task, action="store.switch_reference").exists():
            problems.append("the switch was sent after the source changed")
    if task.status in CLEANABLE:
        left = TempResource.objects.filter(task=task).exclude(status=TempResourceStatus.DELETED).count()
        if left:
            problems.append(f"{left} temp resources not deleted")
    problems += [f"verify_log: {p}" for p in find_problems(task)]
    return problems


# -- the table -------------------------------------------------------------------------------------------------

HEADER = (
    f"{'scenario':<27} {'tasks':>5} {'effects exp':>11} {'counted':>8} {'dups':>5} {'unknown':>8} "
    f"{'skipped':>8} {'wrong':>6} {'denied':>6} {'late':>5} {'kills':>6} {'secs':>6}  result"
)


def _format_row(row: Row) -> str:
    return (
        f"{row.scenario:<27} {row.tasks:>5} {row.expected:>11} {row.counted:>8} {row.duplicates:>5} "
        f"{row.unknowns:>8} {row.skipped:>8} {row.wrong:>6} {row.denied:>6} {row.late:>5} {row.kills:>6} "
        f"{row.seconds:>6.1f}  "
        f"{'ok' if row.ok else 'FAIL'}"
    )


def choose(names: list[str]) -> list[Scenario]:
    if not names:
        return list(SCENARIOS)
    known = {s.key: s for s in SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]
