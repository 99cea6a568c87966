"""Liveness under faults: the recovery scan never floods the broker, never waits behind the work it
queues, a broken database connection does not keep a lease, and a remote that stays down is asked again later and
later. The invariants stay: no duplicate side effect, a duplicated or late message is harmless, the scan makes good
any lost message.

Messages are counted on the configured broker (the filesystem broker by default, Redis or RabbitMQ when
CELERY_BROKER_URL says so), on queues of each test's own that no worker consumes."""

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext

from console.celery import app
from leases.clock import ControllableClock
from leases.models import Lease
from tasks.core.failures import backoff
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed, NotFound, Outcome
from tasks.engine.connectors import Connector
from tasks.engine.plans import task_create
from tasks.engine.recovery import tasks_needing_work, wake_up_begin, wake_up_expiry
from tasks.engine.runner import run_task_once
from tasks.jobs import MAX_COUNTDOWN_SECONDS, drive_task, recovery_scan
from tasks.models import Task, TaskWakeUp
from tests.conftest import chain_plan
from tests.kinds import kind_registered

KIND = "liveness_test"


class Remote(Connector):
    """An in-process remote that counts each op key it carried out; ``down`` makes every call fail as a broken
    connection does (the outcome unknown); ``on_submit`` runs inside a call (a fault injected mid-wake-up)."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.asked = 0
        self.down = False
        self.refuse = 0  # answer this many calls "dependency unavailable" (503)
        self.on_submit: Callable[[], None] = lambda: None

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        if self.down:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, "connection refused")
        if self.refuse:
            self.refuse -= 1
            return Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503")
        self.effects[op_key] += 1
        self.on_submit()
        return Committed(remote_id=f"r-{op_key[-12:]}")

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self.submit(op_key, request)

    def lookup(self, op_key: str) -> Outcome:
        self.asked += 1
        if self.down:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, "connection refused")
        return Committed(remote_id=f"r-{op_key[-12:]}") if op_key in self.effects else NotFound()

    def current_version(self, locator: str) -> str:
        return "1"

    def delete(self, op_key: str, locator: str) -> Outcome:
        return Committed(remote_id=f"d-{op_key[-12:]}")


@pytest.fixture
def remote() -> Iterator[Remote]:
    connector = Remote()
    with kind_registered(KIND, connector=lambda: connector):
        yield connector


def waiting_task(*keys: str) -> Task:
    return task_create(kind=KIND, title="a waiting task", plan=chain_plan(*(keys or ("a", "b"))), created_by="test")


def private_queue(what: str) -> str:
    return f"liveness-{what}-{uuid.uuid4().hex[:10]}"


def drained(queue: str) -> list[tuple[dict[str, Any], list[Any]]]:
    """Every message on ``queue`` (headers, args), taken off it: what a worker would have been handed."""
    found: list[tuple[dict[str, Any], list[Any]]] = []
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        try:
            while True:
                try:
                    message = simple.get_nowait()
                except simple.Empty:
                    return found
                args, kwargs, _embed = message.payload
                found.append((dict(message.headers) | {"kwargs": kwargs}, list(args)))
                message.ack()
        finally:
            simple.close()


def test_scans_run_back_to_back_queue_one_wake_up_per_task_version_and_a_lost_one_again_after_its_expiry(
    db: None, clock: ControllableClock, remote: Remote
) -> None:
    tasks = [waiting_task() for _ in range(6)]
    queue = private_queue("wake")
    sent = [recovery_scan(queue=queue) for _ in range(5)]
    assert sent == [6, 0, 0, 0, 0]
    messages = drained(queue)
    assert sorted(tuple(args) for _, args in messages) == sorted((t.pk, t.version) for t in tasks)
    assert {headers["task"] for headers, _ in messages} == {"tasks.drive_task"}
    claims = TaskWakeUp.objects.filter(queued_version__isnull=False)
    assert sorted(claims.values_list("task_id", "queued_version")) == sorted((t.pk, t.version) for t in tasks)
    # Each message is stale once its claim lapses, on the database clock — not Celery's expires, which a worker
    # judges on its own clock (a worker minutes ahead would drop them all: harness/partitions.py, "clocks skewed").
    until = {task_id: claim and claim.isoformat() for task_id, claim in claims.values_list("task_id", "queued_until")}
    assert all(headers["kwargs"] == {"until": until[args[0]]} for headers, args in messages)
    assert not any(headers.get("expires") for headers, _ in messages)

    # Those messages were lost (drained above, never run): their claims lapse with their expiry, and the scan
    # queues each again, once.
    clock.advance(wake_up_expiry() - timedelta(seconds=1))
    assert recovery_scan(queue=queue) == 0
    clock.advance(timedelta(seconds=2))
    assert [recovery_scan(queue=queue) for _ in range(3)] == [6, 0, 0]
    assert len(drained(queue)) == 6


def test_a_scan_that_finds_every_waiting_task_claimed_costs_the_same_few_statements_however_many_wait(
    db: None, clock: ControllableClock, remote: Remote
) -> None:
    costs = []
    for count in (3, 30):
        queue = private_queue("wake")
        for _ in range(count):
            waiting_task()
        recovery_scan(queue=queue)
        with CaptureQueriesContext(connection) as ctx:
            assert recovery_scan(queue=queue) == 0
        costs.append(len(ctx.captured_queries))
        drained(queue)
    assert costs[0] == costs[1] <= 3  # the tasks needing work, the stalled bulk runs; no statement per task


def test_a_wake_up_that_runs_clears_its_claim_and_a_new_version_may_be_woken_again(
    db: None, clock: ControllableClock, remote: Remote
) -> None:
    task = waiting_task()
    queue = private_queue("wake")
    assert recovery_scan(queue=queue) == 1
    [(_, args)] = drained(queue)
    assert args == [task.pk, task.version]
    assert wake_up_begin(task_id=task.pk, seen_version=task.version) is None
    assert TaskWakeUp.objects.get(task=task).queued_version is None
    assert recovery_scan(queue=queue) == 1  # still waiting, nothing queued for it: the scan queues one
    drained(queue)


def test_a_wake_up_that_arrives_after_its_claim_lapsed_is_dropped_unrun_on_the_database_clock(
    db: None, clock: ControllableClock, remote: Remote
) -> None:
    """A message held back (a worker whose clock is behind holds a countdown longer) or stuck in a queue: once its
    claim lapsed — on the database clock — the scan has queued the task again, and the old one is dropped unrun;
    until then it runs, whatever the clock of the worker that received it says."""
    task = waiting_task()
    queue = private_queue("wake")
    assert recovery_scan(queue=queue) == 1
    [(headers, args)] = drained(queue)
    clock.advance(wake_up_expiry() + timedelta(seconds=1))
    before = Task.objects.get(pk=task.pk).version
    answer = drive_task.apply(args=tuple(args), kwargs=headers["kwargs"]).get()
    assert answer.startswith("skipped: stale"), answer
    assert Task.objects.get(pk=task.pk).version == before and not Lease.objects.filter(task=task).exists()
    assert TaskWakeUp.objects.get(task=task).queued_version == task.version  # its claim untouched: the scan's to renew
    assert recovery_scan(queue=queue) == 1  # queued again, with a new claim
    [(headers, args)] = drained(queue)
    answer = drive_task.apply(args=tuple(args), kwargs=headers["kwargs"]).get()
    assert not answer.startswith("skipped"), answer


def test_the_scan_has_a_queue_of_its_own_that_a_default_worker_consumes_and_beat_sends_it_there_without_an_expiry(
    db: None,
) -> None:
    entry: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE["recovery-scan"]
    scan_queue = settings.RECKON_SCAN_QUEUE
    assert entry["options"]["queue"] == scan_queue != app.conf.task_default_queue
    # No expiry: a worker would judge it on its own clock, and one minutes ahead of beat's would drop every scan.
    assert "expires" not in entry["options"]
    assert app.amqp.router.route({}, "tasks.recovery_scan")["queue"].name == scan_queue  # .delay() too
    assert {scan_queue, app.conf.task_default_queue} <= set(app.amqp.queues)  # `celery worker` without -Q

    # 40 wake-ups already queued: the scan, sent as beat sends it (on a private stand-in for the scan queue), is the
    # next message on its queue, behind none of them.
    wake_queue, stand_in = private_queue("wake"), private_queue("scan")
    for task_id in range(40):
        drive_task.apply_async((task_id + 10**9,), queue=wake_queue)
    app.send_task(entry["task"], **(entry["options"] | {"queue": stand_in}))
    [(headers, _)] = drained(stand_in)
    assert headers["task"] == "tasks.recovery_scan" and not headers.get("expires")
    assert len(drained(wake_queue)) == 40


def test_a_remote_that_stays_down_is_asked_at_growing_jittered_capped_intervals_and_the_task_says_so(
    db: None, clock: ControllableClock, remote: Remote
) -> None:
    task = waiting_task("a")
    remote.down = True
    delays: list[float] = []
    for attempt in range(1, 13):
        wake = run_task_once(task_id=task.pk, holder_id=f"worker-{attempt}", connector=remote)
        assert wake.wake_at is not None and "remote_unreachable" in wake.summary
        delays.append((wake.wake_at - clock.now()).total_seconds())
        row = TaskWakeUp.objects.get(task=task)
        assert row.remote_down_tries == attempt and row.remote_next_ask_at == wake.wake_at
        assert f"({attempt} tries)" in Task.objects.get(pk=task.pk).wake_up.remote_down_detail
        # Not due yet: the scan leaves it alone and a wake-up that comes early asks nobody.
        asked = remote.asked
        assert task.pk not in set(tasks_needing_work().values_list("pk", flat=True))
        assert wake.version is not None
        assert wake_up_begin(task_id=task.pk, seen_version=wake.version) == wake.wake_at
        assert remote.asked == asked
        clock.set(wake.wake_at)
        assert task.pk in set(tasks_needing_work().values_list("pk", flat=True))

    cap = settings.RECKON_BACKOFF_CAP.total_seconds()
    base = settings.RECKON_BACKOFF_BASE.total_seconds()
    raw = [min(cap, base * 2 ** (n - 1)) for n in range(1, 13)]
    below_cap = [d for d, r in zip(delays, raw, strict=True) if r < cap]
    assert len(below_cap) >= 8 and below_cap == sorted(below_cap) and len(set(below_cap)) == len(below_cap)
    assert all(0.75 * r <= d <= 1.25 * r for d, r in zip(delays, raw, strict=True))  # jittered ±25%, capped
    assert len({round(d / r, 4) for d, r in zip(delays, raw, strict=True)}) > 1  # not one fixed factor
    assert delays[0] == backoff(now=clock.now(), attempt=1, seed=f"{task.uid}:remote_down").delay.total_seconds()

    # The remote answers again: the task finishes, the call was carried out once, the outage is forgotten.
    remote.down = False
    wake = run_task_once(task_id=task.pk, holder_id="worker-last", connector=remote)
    assert Task.objects.get(pk=task.pk).status == "completed", wake.summary
    assert set(remote.effects.values()) == {1}
    row = TaskWakeUp.objects.get(task=task)
    assert (row.remote_down_tries, row.remote_next_ask_at, row.remote_down_detail) == (0, None, "")


def test_while_the_remote_rests_a_versioned_wake_up_asks_nobody_but_a_persons_hand_back_goes_on(
    db: None, clock: ControllableClock, remote: Remote
) -> None:
    task = waiting_task("a")
    remote.down = True
    wake = run_task_once(task_id=task.pk, holder_id="worker-1", connector=remote)
    asked = remote.asked
    early = drive_task.apply(args=(task.pk, wake.version)).get()  # a scan's or its own wake-up, come too early
    assert str(early).startswith("skipped: remote down") and remote.asked == asked
    assert not Lease.objects.open().filter(task_id=task.pk).exists()

    remote.down = False
    drive_task.apply(args=(task.pk,)).get()  # a person handed the task back: no version named, it goes on
    assert Task.objects.get(pk=task.pk).status == "completed" and set(remote.effects.values()) == {1}


def test_a_wake_up_the_broker_refused_is_not_claimed(
    db: None, clock: ControllableClock, remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = waiting_task()

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(drive_task, "apply_async", refuse)
    with pytest.raises(ConnectionRefusedError):
        recovery_scan(queue=private_queue("wake"))
    assert not TaskWakeUp.objects.filter(task=task, queued_version__isnull=False).exists()
    monkeypatch.undo()
    queue = private_queue("wake")
    assert recovery_scan(queue=queue) == 1  # the next scan sends it
    assert [args for _, args in drained(queue)] == [[task.pk, task.version]]


def test_a_wake_up_due_too_far_ahead_to_queue_is_left_to_the_scan_which_wakes_the_task_when_due_not_before(
    db: None, clock: ControllableClock, remote: Remote, settings: Any
) -> None:
    settings.RECKON_BACKOFF_BASE = timedelta(minutes=10)  # a refused call backs off 7.5 to 12.5 minutes
    task = waiting_task("a")
    remote.refuse = 1
    drive_task.apply(args=(task.pk,)).get()  # run in place: a message it sent would land on the default queue
    not_before = Task.objects.get(pk=task.pk).nodes.get(key="a").not_before
    assert not_before is not None and (not_before - clock.now()).total_seconds() > MAX_COUNTDOWN_SECONDS
    queue = private_queue("wake")
    clock.advance(timedelta(minutes=1))
    assert [recovery_scan(queue=queue) for _ in range(3)] == [0, 0, 0]  # waiting: no wake-up to find it waiting
    clock.set(not_before + timedelta(seconds=1))
    assert [recovery_scan(queue=queue) for _ in range(3)] == [1, 0, 0]  # due: woken once
    [(_, args)] = drained(queue)
    drive_task.apply(args=tuple(args)).get()
    assert Task.objects.get(pk=task.pk).status == "completed" and set(remote.effects.values()) == {1}


def _terminate_own_connection_once(remote: Remote) -> Callable[[], None]:
    """Inside the remote call: have another session terminate this worker's database connection (as a failover or
    an administrator would), once."""
    done: list[int] = []

    def terminate() -> None:
        if done:
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            other.close()
        done.append(pid)

    return terminate


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL (pg_terminate_backend)")
@pytest.mark.django_db(transaction=True)
def test_a_connection_terminated_mid_wake_up_leaves_no_open_lease(remote: Remote) -> None:
    task = waiting_task("a", "b")
    remote.on_submit = _terminate_own_connection_once(remote)
    with pytest.raises(OperationalError):
        run_task_once(task_id=task.pk, holder_id="worker-1", connector=remote)
    assert not Lease.objects.open().filter(task_id=task.pk).exists()  # given back at once, not after TTL + grace
    [lease] = Lease.objects.filter(task_id=task.pk)
    assert lease.released_at is not None and lease.release_reason == "released"

    # The next wake-up reconciles the call in flight by op key and finishes: one effect per node.
    run_task_once(task_id=task.pk, holder_id="worker-2", connector=remote)
    assert Task.objects.get(pk=task.pk).status == "completed"
    assert len(remote.effects) == 2 and set(remote.effects.values()) == {1}


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL (pg_terminate_backend)")
@pytest.mark.django_db(transaction=True)
def test_a_wake_up_whose_connection_is_terminated_is_retried_and_finishes_with_no_duplicate(remote: Remote) -> None:
    """drive_task run in place (eagerly): the interrupted try gives its lease back, the retry takes a new one."""
    task = waiting_task("a", "b", "c")
    remote.on_submit = _terminate_own_connection_once(remote)
    drive_task.apply(args=(task.pk,))
    assert Task.objects.get(pk=task.pk).status == "completed"
    assert len(remote.effects) == 3 and set(remote.effects.values()) == {1}
    leases = Lease.objects.filter(task_id=task.pk).order_by("epoch")
    assert [lease.release_reason for lease in leases] == ["released", "released"]
    assert not Lease.objects.open().filter(task_id=task.pk).exists()
