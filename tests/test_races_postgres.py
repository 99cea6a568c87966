"""Real races on PostgreSQL: many threads, each on its own connection, hammer one task at once.

No controllable clock here: lease decisions run on the database server's clock, and every write really
commits (``transaction=True``), so row locks, the unique indexes and READ COMMITTED re-checks are what
decide the winner. Run with ``pytest -s`` to see the figures.
"""

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count
from pytest_django.fixtures import Settings

from audit.principals import Principal
from leases.errors import LeaseExpired, LeaseHeld, LeaseLost
from leases.models import Lease, ReleaseReason
from leases.services import lease_acquire, lease_release
from tasks.cas import Change, compare_and_set
from tasks.errors import TaskError, VersionConflict
from tasks.events import find_log_problem
from tasks.lifecycle import TaskStatus
from tasks.models import Event, Operation, Receipt, Task
from tasks.outcomes import Committed
from tasks.protocol import (
    next_directive,
    operation_dispatch,
    record_outcome,
    register_intent,
    task_request_cancel,
)
from tests.conftest import chain_plan

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason=f"needs PostgreSQL for real concurrent writers (database vendor is {connection.vendor}); "
        "set DATABASE_URL=postgres://…",
    ),
]

THREADS = 8
LEASE_ROUNDS = 25
CAS_SYNC_ROUNDS = 30
CAS_FREE_ATTEMPTS = 15
INTENT_NODES = 6
STALE_TTL = timedelta(seconds=1)
STALE_GRACE = timedelta(milliseconds=300)
NEW_HOLDER_WRITES = 20
BARRIER_TIMEOUT = 20.0

type Work = Callable[[int, threading.Barrier], None]


def run_threads(count: int, work: Work) -> float:
    """Run ``work(index, barrier)`` in ``count`` threads that share one barrier; return the elapsed seconds.

    Each thread has its own Django connection and closes it. The first real failure of any thread is
    re-raised here; a failing thread breaks the barrier so the others stop instead of hanging.
    """
    barrier = threading.Barrier(count, timeout=BARRIER_TIMEOUT)
    failures: list[BaseException] = []

    def body(index: int) -> None:
        try:
            work(index, barrier)
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,), name=f"racer-{i}") for i in range(count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=BARRIER_TIMEOUT * 2)
    elapsed = time.monotonic() - started
    assert not [t.name for t in threads if t.is_alive()], "racer threads did not finish"
    real = [f for f in failures if not isinstance(f, threading.BrokenBarrierError)]
    if real or failures:
        raise (real or failures)[0]
    return elapsed


def current_version(task_id: int) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task_id)


def probe(**data: Any) -> Change:
    return Change(event="race_probe", data=data)


def event_seqs(task: Task) -> list[int]:
    return list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))


def duplicates(values: list[Any]) -> list[Any]:
    return sorted(value for value, times in Counter(values).items() if times > 1)


def test_exactly_one_of_many_concurrent_acquirers_gets_each_epoch(make_task: Callable[..., Task]) -> None:
    task = make_task()
    outcomes: list[list[Lease | LeaseHeld | None]] = [[None] * THREADS for _ in range(LEASE_ROUNDS)]

    def work(index: int, barrier: threading.Barrier) -> None:
        for round_ in range(LEASE_ROUNDS):
            barrier.wait()
            try:
                won: Lease | LeaseHeld = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=f"racer-{index}")
            except LeaseHeld as exc:
                won = exc
            outcomes[round_][index] = won
            barrier.wait()
            if isinstance(won, Lease):
                lease_release(lease=won)
            barrier.wait()

    elapsed = run_threads(THREADS, work)

    winners_per_round = [[o for o in row if isinstance(o, Lease)] for row in outcomes]
    epochs_won = [w.epoch for row in winners_per_round for w in row]
    refused = [o for row in outcomes for o in row if isinstance(o, LeaseHeld)]
    rows = list(Lease.objects.filter(task=task).order_by("epoch"))
    stored_epochs = [row.epoch for row in rows]
    print(
        f"\n[lease_acquire] threads={THREADS} rounds={LEASE_ROUNDS} "
        f"winners/round={dict(Counter(len(w) for w in winners_per_round))} "
        f"held={len(refused)} (of which lost at the unique index: {sum(r.__cause__ is not None for r in refused)}) "
        f"epochs={stored_epochs[0] if stored_epochs else None}..{stored_epochs[-1] if stored_epochs else None} "
        f"duplicate epochs={duplicates(stored_epochs)} elapsed={elapsed:.2f}s"
    )
    assert all(len(w) == 1 for w in winners_per_round), [len(w) for w in winners_per_round]
    assert all(isinstance(o, Lease | LeaseHeld) for row in outcomes for o in row)
    assert epochs_won == list(range(1, LEASE_ROUNDS + 1))
    assert stored_epochs == list(range(1, LEASE_ROUNDS + 1))
    assert all(row.release_reason == ReleaseReason.RELEASED for row in rows)
    assert not Lease.objects.open().filter(task=task).exists()


def test_exactly_one_compare_and_set_wins_each_version(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = make_task()
    initial_version = task.version
    lease = agent_lease(task, holder="race-holder")
    seen: list[list[int]] = [[0] * THREADS for _ in range(CAS_SYNC_ROUNDS)]
    applied: list[list[int | None]] = [[None] * THREADS for _ in range(CAS_SYNC_ROUNDS)]
    free_wins: list[tuple[int, int, int]] = []  # (expected, applied version, thread)
    free_conflicts: list[int] = []

    def work(index: int, barrier: threading.Barrier) -> None:
        for round_ in range(CAS_SYNC_ROUNDS):
            barrier.wait()
            expected = current_version(task.pk)
            seen[round_][index] = expected
            # Everyone has read the same version before anyone writes.
            barrier.wait()
            try:
                result = compare_and_set(task.pk, expected, probe(thread=index, round=round_), lease=lease)
                applied[round_][index] = result.version
            except VersionConflict:
                applied[round_][index] = None
        barrier.wait()
        for attempt in range(CAS_FREE_ATTEMPTS):
            expected = current_version(task.pk)
            try:
                result = compare_and_set(task.pk, expected, probe(thread=index, attempt=attempt), lease=lease)
                free_wins.append((expected, result.version, index))
            except VersionConflict:
                free_conflicts.append(index)

    elapsed = run_threads(THREADS, work)

    task.refresh_from_db()
    sync_winners = [[v for v in row if v is not None] for row in applied]
    won_versions = [v for row in sync_winners for v in row] + [v for _, v, _ in free_wins]
    successes = len(won_versions)
    seqs = event_seqs(task)
    probe_events = Event.objects.filter(task=task, type="race_probe").count()
    print(
        f"\n[compare_and_set] threads={THREADS} sync rounds={CAS_SYNC_ROUNDS} "
        f"free attempts/thread={CAS_FREE_ATTEMPTS} "
        f"winners/sync round={dict(Counter(len(w) for w in sync_winners))} "
        f"max winners/version={max(Counter(won_versions).values())} successes={successes} "
        f"conflicts={sum(v is None for row in applied for v in row) + len(free_conflicts)} "
        f"version {initial_version}->{task.version} events={len(seqs)} "
        f"duplicate versions={duplicates(won_versions)} duplicate seqs={duplicates(seqs)} elapsed={elapsed:.2f}s"
    )
    for round_, (read, winners) in enumerate(zip(seen, sync_winners, strict=True)):
        assert len(set(read)) == 1, f"round {round_}: threads read versions {read}"
        assert winners == [read[0] + 1], f"round {round_}: read v{read[0]}, winners {winners}"
    assert all(won == expected + 1 for expected, won, _ in free_wins)
    assert duplicates(won_versions) == []
    assert task.version == initial_version + successes
    assert probe_events == successes
    assert seqs == list(range(1, task.version + 1))
    assert find_log_problem(task) is None


def race_register_intent(
    task: Task, key: str, version: int, lease: Lease
) -> tuple[list[Operation | VersionConflict | None], float]:
    results: list[Operation | VersionConflict | None] = [None] * THREADS

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            results[index] = register_intent(task_id=task.pk, node_key=key, expected_version=version, lease=lease)
        except VersionConflict as exc:
            results[index] = exc

    return results, run_threads(THREADS, work)


def test_concurrent_register_intent_creates_one_operation_per_node(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    keys = [f"n{i}" for i in range(INTENT_NODES)]
    task = make_task(plan=chain_plan(*keys))
    lease = agent_lease(task)
    late_same_op = conflicts = 0
    elapsed = 0.0
    op_keys: list[str] = []

    for key in keys:
        directive = next_directive(task_id=task.pk, lease=lease)
        assert (directive.kind, directive.node_key) == ("execute", key)
        results, seconds = race_register_intent(task, key, directive.task_version, lease)
        elapsed += seconds

        ops = [r for r in results if isinstance(r, Operation)]
        assert all(isinstance(r, Operation | VersionConflict) for r in results)
        assert ops, f"node {key}: nobody registered the intent"
        assert {op.pk for op in ops} == {ops[0].pk}, f"node {key}: threads got different operations"
        op_key = ops[0].op_key
        assert Operation.objects.filter(op_key=op_key).count() == 1
        assert Operation.objects.filter(task=task, node__key=key).count() == 1, f"node {key}: several operations"
        intents = Event.objects.filter(task=task, type="intent_registered", payload__data__op_key=op_key).count()
        assert intents == 1, f"node {key}: {intents} intent_registered events"
        assert current_version(task.pk) == directive.task_version + 1
        late_same_op += len(ops) - 1
        conflicts += THREADS - len(ops)
        op_keys.append(op_key)

        operation_dispatch(op_key=op_key, expected_version=directive.task_version + 1, lease=lease)
        record_outcome(
            op_key=op_key,
            outcome=Committed(remote_id=f"r-{key}"),
            expected_version=directive.task_version + 2,
            lease=lease,
        )

    task.refresh_from_db()
    stored_keys = list(Operation.objects.filter(task=task).values_list("op_key", flat=True))
    repeated = list(Operation.objects.values("op_key").annotate(n=Count("pk")).filter(n__gt=1))
    seqs = event_seqs(task)
    print(
        f"\n[register_intent] threads={THREADS} nodes={INTENT_NODES} operations={len(stored_keys)} "
        f"winners/node=1 late callers given the same op={late_same_op} version conflicts={conflicts} "
        f"duplicate op keys={len(repeated)} version={task.version} elapsed={elapsed:.2f}s"
    )
    assert sorted(stored_keys) == sorted(op_keys)
    assert len(set(op_keys)) == INTENT_NODES
    assert repeated == []
    assert task.status == TaskStatus.COMPLETED
    assert seqs == list(range(1, task.version + 1))
    assert find_log_problem(task) is None


def test_a_superseded_epoch_writes_nothing_once_the_new_grant_commits(
    make_task: Callable[..., Task], settings: Settings
) -> None:
    settings.RECKON_LEASE_GRACE = STALE_GRACE
    task = make_task()
    old = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="stale-holder", ttl=STALE_TTL)
    stop = threading.Event()
    granted: list[Lease] = []
    acquire_refusals: list[str] = []
    stale_wins: list[tuple[int, datetime]] = []  # (applied version, database time of the write)
    stale_refusals: Counter[str] = Counter()
    refusals_lock = threading.Lock()

    def take_over() -> None:
        deadline = time.monotonic() + 10
        while not granted:
            try:
                granted.append(lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="new-holder"))
            except LeaseHeld:
                acquire_refusals.append("held")
                assert time.monotonic() < deadline, "the expired lease was never superseded"
                time.sleep(0.02)
        new = granted[0]
        writes = 0
        while writes < NEW_HOLDER_WRITES:
            try:
                compare_and_set(task.pk, current_version(task.pk), probe(epoch=new.epoch, writer="new"), lease=new)
                writes += 1
            except VersionConflict:
                pass
        # Let the stale writers keep trying against the committed grant for a while.
        time.sleep(0.3)

    def write_stale(index: int) -> None:
        while not stop.is_set():
            try:
                result = compare_and_set(
                    task.pk, current_version(task.pk), probe(epoch=old.epoch, writer=index), lease=old
                )
                stale_wins.append((result.version, result.at))
            except (VersionConflict, LeaseExpired, LeaseLost) as exc:
                with refusals_lock:
                    stale_refusals[type(exc).__name__] += 1

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        if index == 0:
            try:
                take_over()
            finally:
                stop.set()
        else:
            write_stale(index)

    elapsed = run_threads(THREADS, work)

    task.refresh_from_db()
    new = granted[0]
    by_epoch: dict[int, list[Event]] = {}
    for event in Event.objects.filter(task=task, type="race_probe").order_by("seq"):
        by_epoch.setdefault(event.payload["data"]["epoch"], []).append(event)
    old_events, new_events = by_epoch.get(old.epoch, []), by_epoch.get(new.epoch, [])
    after_grant = Event.objects.filter(task=task, created_at__gte=new.granted_at).order_by("seq")
    intruders = [e.seq for e in after_grant if e.payload.get("data", {}).get("epoch") != new.epoch]
    stale_late = [e.seq for e in old_events if e.seq > new.task_version_at_grant or e.created_at >= old.expires_at]
    seqs = event_seqs(task)
    print(
        f"\n[stale epoch] threads={THREADS} (1 taker, {THREADS - 1} stale writers) ttl={STALE_TTL.total_seconds()}s "
        f"grace={STALE_GRACE.total_seconds()}s epochs {old.epoch}->{new.epoch} "
        f"writes per epoch={{{old.epoch}: {len(old_events)}, {new.epoch}: {len(new_events)}}} "
        f"stale refusals={dict(stale_refusals)} acquire refusals before takeover={len(acquire_refusals)} "
        f"grant at v{new.task_version_at_grant} "
        f"stale writes after grant={len(intruders)} stale writes past expiry={len(stale_late)} "
        f"duplicate seqs={duplicates(seqs)} elapsed={elapsed:.2f}s"
    )
    assert new.epoch == old.epoch + 1
    assert new.granted_at >= old.expires_at + STALE_GRACE
    assert len(old_events) == len(stale_wins) > 0, "the stale holder never wrote: the race had no teeth"
    assert len(new_events) == NEW_HOLDER_WRITES
    assert stale_refusals["LeaseLost"] > 0, "no stale write was tried against the committed grant"
    assert all(at < old.expires_at for _, at in stale_wins)
    assert stale_late == []
    assert intruders == []
    assert max(e.seq for e in old_events) < min(e.seq for e in new_events)
    assert seqs == list(range(1, task.version + 1))
    assert find_log_problem(task) is None


CANCEL_ROUNDS = 10


def _protocol_racer(task: Task, lease: Lease, cancel_delay: float, dispatched: list[str]) -> Work:
    """Thread 0 records a cancel after ``cancel_delay``; the others drive the step protocol as hard as they can."""

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        if index == 0:
            time.sleep(cancel_delay)
            task_request_cancel(task_id=task.pk, actor=Principal.agent("operator:race"), reason="race")
            return
        for _ in range(INTENT_NODES * 3):
            d = next_directive(task_id=task.pk, lease=lease)
            try:
                if d.kind == "execute" and not d.op_key:
                    register_intent(task_id=task.pk, node_key=d.node_key, expected_version=d.task_version, lease=lease)
                elif d.kind == "execute":
                    op = operation_dispatch(op_key=d.op_key, expected_version=d.task_version, lease=lease)
                    dispatched.append(op.op_key)
                    time.sleep(0.001)  # the remote call: the cancel may land while it is in flight
                    receipt = Committed(remote_id=f"r-{op.op_key}")
                    record_outcome(op_key=op.op_key, outcome=receipt, expected_version=d.task_version + 1, lease=lease)
                elif d.kind == "reconcile":
                    receipt = Committed(remote_id=f"r-{d.op_key}")
                    record_outcome(op_key=d.op_key, outcome=receipt, expected_version=d.task_version, lease=lease)
                else:
                    return
            except (TaskError, LeaseLost, LeaseExpired):
                continue

    return work


def test_a_cancel_racing_the_step_protocol_stops_every_new_side_effect(make_task: Callable[..., Task]) -> None:
    """Invariant 6 under real concurrency: seven workers share a lease and race to register and dispatch the
    next node while an eighth thread records a cancel. Whatever interleaving the database picks, no intent is
    registered and nothing is dispatched after the cancel's commit, and the task ends stopping or stopped."""
    after_cancel = before_cancel = 0
    for round_number in range(CANCEL_ROUNDS):
        task = make_task(plan=chain_plan(*(f"n{i}" for i in range(INTENT_NODES))))
        lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=f"workers-{round_number}")
        dispatched: list[str] = []
        run_threads(THREADS, _protocol_racer(task, lease, 0.05 * round_number, dispatched))
        task.refresh_from_db()
        assert task.cancel_requested_at is not None
        late = Operation.objects.filter(task=task, registered_at__gt=task.cancel_requested_at)
        assert not late.exists(), "an intent was registered after the cancel"
        cancel_seq = Event.objects.get(task=task, type="cancel_requested").seq
        late_dispatch = Event.objects.filter(task=task, type="operation_dispatched", seq__gt=cancel_seq)
        assert not late_dispatch.exists(), "an operation was dispatched after the cancel"
        assert task.status in (TaskStatus.STOPPING, TaskStatus.STOPPED_PENDING, TaskStatus.STOPPED), task.status
        assert find_log_problem(task) is None
        assert len(dispatched) == len(set(dispatched))
        before_cancel += len(dispatched)
        after_cancel += Receipt.objects.filter(operation__task=task, committed_after_cancel_request=True).count()
    print(
        f"\n[cancel race] threads={THREADS} rounds={CANCEL_ROUNDS} dispatched before the cancel={before_cancel} "
        f"commits recorded after the cancel request={after_cancel}; intents or dispatches after a cancel: 0"
    )
