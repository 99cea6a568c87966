"""The production topology, started from the commands of docs/operations.md (Scale out): ``./dev serve`` (gunicorn, two
web
workers), two ``./dev worker`` and two ``./dev beat`` on PostgreSQL + RabbitMQ, in the production mode (no
RECKON_ENV), against the object-store simulator. 200 reference tasks (migrate_project) are created in the database;
the beat holding the beat lease sends the recovery scan, which wakes them. During the run each kind of process is
stopped with SIGTERM and started again — a worker (its wake-ups finish and give their leases back), the beat holding
the lease (the other beat takes it over), the web server — and nothing is lost: every task completes, the simulator
counts no side effect twice, and no task lease is left open.

PostgreSQL only (CI's PostgreSQL pass); RabbitMQ must answer on 127.0.0.1:5672 (.ci/run starts it). The run has a
RabbitMQ virtual host of its own, so its queues meet no other run's."""

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.db import connection

from harness.killmatrix import StoreProcess, database_url
from harness.ports import free_port
from leases.beat import BEAT_LEASE
from leases.models import BeatLease, Lease
from reference import migrate_project
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, OperationStatus, TaskStatus, TempResourceStatus
from tasks.engine.cleanup import CLEANABLE
from tasks.engine.plans import task_create
from tasks.jobs import drive_task
from tasks.models import Operation, OperationPurpose, Task, TempResource
from tests.simulator_fixture import ROOT, Simulator

TASKS = int(os.environ.get("RECKON_TOPOLOGY_TASKS", "200"))
OBJECTS, MAX_BATCH = 2, 2  # one copy batch: prepare, copy, verify, switch, and the staging copy's delete
EFFECTS_PER_TASK = 5
RUN_SECONDS = 240  # a bound that turns a hang into a failure; no assertion is about time
RABBITMQ = ("127.0.0.1", 5672)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the production topology runs on PostgreSQL (CI's PostgreSQL pass); DATABASE_URL is SQLite",
    ),
]


def _rabbitmq_answers() -> bool:
    try:
        socket.create_connection(RABBITMQ, timeout=2).close()
    except OSError:
        return False
    return shutil.which("rabbitmqctl") is not None


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)  # noqa: S603, S607


@pytest.fixture
def vhost() -> Iterator[str]:
    """A RabbitMQ virtual host of this run's own (its queues, exchanges and messages), deleted afterwards."""
    if not _rabbitmq_answers():
        if os.environ.get("CI"):
            pytest.fail("RabbitMQ does not answer on 127.0.0.1:5672 (.ci/run starts it)")
        pytest.skip("RabbitMQ does not answer on 127.0.0.1:5672 (or rabbitmqctl is missing): rabbitmq-server -detached")
    name = f"reckon-topology-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", name)
    try:
        _rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        _rabbitmqctl("delete_vhost", name)


@dataclass
class Process:
    """A ``./dev`` command running on its own (its own session: signals go to the process ``./dev`` exec-ed)."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(  # noqa: S603
                [str(ROOT / "dev"), *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, seconds: float = 60) -> int:
        """SIGTERM to the process itself (Celery's or gunicorn's main process), as a supervisor sends it."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(seconds)

    def kill_all(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever is left of its group (pool, web workers)
        self.process.wait(10)


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g}s")
        time.sleep(0.2)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback, our own server
            return int(response.status)
    except OSError:
        return 0


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), where /proc tells; -1 elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def _create_tasks(store: StoreProcess, count: int) -> list[int]:
    run = uuid.uuid4().hex[:6]
    ids = []
    for n in range(count):
        project = f"t{run}-{n}"
        digest = "sha256:" + "5e" * 32
        source = {"source": "store", "locator": f"projects/{project}", "version": "1", "digest": digest}
        store.call("/_sources", {"locator": source["locator"], "version": "1", "digest": digest})
        document = migrate_project.plan(project, objects=OBJECTS, source=source, max_batch=MAX_BATCH)
        task = task_create(
            kind=migrate_project.KIND, title=f"Migrate {project}", plan=document, created_by="topology", project=project
        )
        ids.append(task.pk)
    return ids


def _completed(ids: list[int]) -> int:
    return Task.objects.filter(pk__in=ids, status__in=CLEANABLE).count()


def _all_done(ids: list[int]) -> bool:
    undone = [TempResourceStatus.ACTIVE, TempResourceStatus.CLEANING]
    return _completed(ids) == len(ids) and not TempResource.objects.filter(task_id__in=ids, status__in=undone).exists()


def _beat_holder_pid() -> int:
    row = BeatLease.objects.filter(name=BEAT_LEASE).first()
    return int(row.holder.split(":")[2]) if row and row.holder else 0


def test_the_production_topology_loses_nothing_when_each_process_is_stopped_with_sigterm(
    vhost: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    # The store's state in memory (never restarted here): its state file, rewritten at every write, would be the
    # run's bottleneck.
    store = StoreProcess(tmp_path / "store.json", persist=False)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("RECKON_ENV", "DJANGO_DEBUG", "RECKON_FAILPOINTS")}
    env |= {
        # The production environment of docs/operations.md (Scale out), on this test's database and virtual host.
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "RECKON_RETENTION_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_ANCHOR_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_DATA_DIR": str(tmp_path / "data"),
        "RECKON_OBJECTSTORE_URL": store.url,
        "RECKON_BIND": f"127.0.0.1:{port}",
        "RECKON_WEB_WORKERS": "2",
        # Shorter than a deployment's, so that the run is short: a scan a second, a beat lease of 4 s.
        "RECKON_SCAN_SECONDS": "1",
        "RECKON_BEAT_LEASE_SECONDS": "4",
    }
    processes: list[Process] = []

    def start(name: str, *args: str, level: str = "WARNING") -> Process:
        running = Process(name, list(args), env | {"RECKON_LOG_LEVEL": level}, tmp_path / f"{name}.log")
        processes.append(running)
        return running

    try:
        web = start("web", "serve", "--no-migrate")
        workers = [start(f"worker{n}", "worker", "--concurrency", "2", "-n", f"w{n}@%h") for n in (1, 2)]
        beats = [start(f"beat{n}", "beat", level="INFO") for n in (1, 2)]
        ids = _create_tasks(store, TASKS)  # while the processes start; the scan finds each task once it exists
        created = time.monotonic()
        _wait(lambda: _get(f"{base}/readyz") == 200 or web.process.poll() is not None, 120, "./dev serve ready")
        assert web.process.poll() is None, web.text()
        stops: dict[str, float] = {}

        # A worker: its warm shutdown finishes the wake-ups it runs (giving their leases back) and exits 0.
        _wait(lambda: _completed(ids) >= TASKS // 5, RUN_SECONDS, "a fifth of the tasks done")
        stopped_at = time.monotonic()
        assert workers[0].terminate() == 0, workers[0].text()[-3000:]
        stops["worker"] = time.monotonic() - stopped_at
        assert "Warm shutdown" in workers[0].text()
        workers[0].start()

        # The beat holding the lease: it gives it back on its way out, and the other beat takes it.
        _wait(lambda: _completed(ids) >= 2 * TASKS // 5, RUN_SECONDS, "two fifths of the tasks done")
        [holder] = [beat for beat in beats if beat.pid == _beat_holder_pid()]
        [standby] = [beat for beat in beats if beat is not holder]
        stopped_at = time.monotonic()
        assert holder.terminate() == 0, holder.text()[-3000:]
        stops["beat"] = time.monotonic() - stopped_at
        assert "beat lease released" in holder.text()
        _wait(lambda: _beat_holder_pid() == standby.pid, 30, "the other beat taking the lease")
        assert "Sending due task" not in standby.text().split("beat lease taken")[0]  # it sent nothing before
        holder.start()

        # The web server: gunicorn stops gracefully, and serves again once started.
        _wait(lambda: _completed(ids) >= 3 * TASKS // 5, RUN_SECONDS, "three fifths of the tasks done")
        stopped_at = time.monotonic()
        assert web.terminate() == 0, web.text()[-3000:]
        stops["web"] = time.monotonic() - stopped_at
        web.start()
        _wait(lambda: _get(f"{base}/readyz") == 200 or web.process.poll() is not None, 120, "./dev serve again")
        assert web.process.poll() is None, web.text()[-3000:]
        assert _get(f"{base}/healthz") == 200

        _wait(lambda: _all_done(ids), RUN_SECONDS, f"all {TASKS} tasks done")
        finished = time.monotonic()
        stats = store.call("/_stats")
        store_cpu = _cpu_seconds(store.process.pid)
        for running in [web, *workers, *beats]:
            assert running.terminate() == 0, running.text()[-3000:]
    finally:
        for running in processes:
            running.kill_all()
        store.stop()

    # Nothing lost, nothing twice, no lease left.
    by_key: dict[str, int] = stats.get("by_op_key", {})
    tasks = list(Task.objects.filter(pk__in=ids))
    assert [t.pk for t in tasks if t.status != TaskStatus.COMPLETED] == []
    uids = {t.uid.hex for t in tasks}
    mine = {key: n for key, n in by_key.items() if any(uid in key for uid in uids)}
    duplicates = {key: n for key, n in mine.items() if n > 1}
    assert duplicates == {}
    assert sum(mine.values()) == TASKS * EFFECTS_PER_TASK
    operations = Operation.objects.filter(task_id__in=ids)
    assert not operations.filter(status__in=OPEN_OPERATION_STATUSES).exists()
    committed = operations.filter(status=OperationStatus.COMMITTED, purpose=OperationPurpose.EFFECT, settled_by="")
    assert committed.count() == committed.values("node_id").distinct().count()  # one committed effect per node
    assert not TempResource.objects.filter(task_id__in=ids).exclude(status=TempResourceStatus.DELETED).exists()
    assert list(Lease.objects.filter(task_id__in=ids, released_at__isnull=True).values_list("task_id", flat=True)) == []
    assert not BeatLease.objects.filter(name=BEAT_LEASE).exclude(holder="").exists()  # the last beat gave it back
    figures = {
        "tasks": TASKS,
        "side effects": sum(mine.values()),
        "duplicates": len(duplicates),
        "start and create s": round(created - started, 1),
        "run s": round(finished - created, 1),
        "SIGTERM to exit s": {name: round(s, 1) for name, s in stops.items()},
        "total s": round(time.monotonic() - started, 1),
        "simulator CPU s": store_cpu,
    }
    print("production topology:", json.dumps(figures))


# -- one worker stopped in the middle of a call --------------------------------------------------------------------


def test_a_worker_stopped_with_sigterm_in_the_middle_of_a_call_finishes_its_wake_up_and_gives_the_lease_back(
    simulator: Simulator, tmp_path: Path
) -> None:
    """``./dev worker`` (production mode, a pool of one process) is sent SIGTERM while its wake-up waits on a copy
    the store holds for 3 s: the call's answer is recorded, the wake-up goes on to the end of the task, its lease is
    released (not left to lapse), and the worker exits 0. The test's broker; PostgreSQL only, like the topology
    (15-20 s; nothing in it depends on the database)."""
    queue = f"graceful-{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k not in ("RECKON_ENV", "DJANGO_DEBUG", "RECKON_FAILPOINTS")}
    env |= {
        "DATABASE_URL": database_url(),
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "RECKON_RETENTION_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_ANCHOR_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_OBJECTSTORE_URL": simulator.url,
        "RECKON_LOG_LEVEL": "INFO",
    }
    source = {"source": "store", "locator": "projects/graceful", "version": "1", "digest": "sha256:" + "5e" * 32}
    simulator.set_source(source["locator"], "1", source["digest"])
    document = migrate_project.plan("graceful", objects=OBJECTS, source=source, max_batch=MAX_BATCH)
    kind = migrate_project.KIND
    task = task_create(kind=kind, title="graceful", plan=document, created_by="test", project="graceful")
    simulator.fault("latency", times=1, ms=3000, action="copy_batch")
    args = ["worker", "-Q", queue, "--concurrency", "1", "-n", f"{queue}@%h"]
    worker = Process("worker", args, env, tmp_path / "worker.log")
    try:
        drive_task.apply_async((task.pk,), queue=queue)
        copy = Operation.objects.filter(task=task, action="store.copy_batch")
        _wait(lambda: copy.filter(status=OperationStatus.DISPATCHED).exists(), 90, "the copy in flight")
        assert worker.terminate(seconds=60) == 0, worker.text()[-3000:]
    finally:
        worker.kill_all()
    log = worker.text()
    assert log.index("Warm shutdown") < log.index("succeeded in"), log[-3000:]  # the wake-up ended after the signal
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    [lease] = Lease.objects.filter(task=task)
    assert lease.released_at is not None and lease.release_reason == "released"
    assert set(simulator.stats()["by_op_key"].values()) == {1}
