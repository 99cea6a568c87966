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
from leases import clock
from leases.errors import LeaseExpired, LeaseHeld, LeaseLost
from leases.models import Lease, ReleaseReason
from leases.services import lease_acquire, lease_release
from tasks.core.errors import TaskError, VersionConflict
from tasks.core.lifecycle import OperationStatus, TaskStatus
from tasks.core.outcomes import AWAITING_FINAL, Committed, NotFound
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.engine.events import find_log_problem
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Event, Node, Operation, Receipt, Task
from tasks.people.cancel import task_request_cancel
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
STALE_WRITING = 0.3  # seconds the old holder writes, each landed write extending its lease, before it stalls
STALL_MARGIN = 0.1  # it wakes this long after its lease expired: inside the grace
NEW_HOLDER_WRITES = 20
BARRIER_TIMEOUT = 20.0

type Work = Callable[[int, threading.Barrier], object]  # what it returns is ignored


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


def race_start(
    task: Task, key: str, version: int, lease: Lease
) -> tuple[list[Operation | VersionConflict | None], float]:
    """Every thread calls operation_start for ``key`` at ``version`` at once, with the same lease."""
    results: list[Operation | VersionConflict | None] = [None] * THREADS

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            results[index] = operation_start(
                snapshot_at(task_id=task.pk, lease=lease, expected_version=version), key, lease=lease
            ).operation
        except VersionConflict as exc:
            results[index] = exc

    return results, run_threads(THREADS, work)


def sends_of(task: Task, op_key: str) -> int:
    return Event.objects.filter(task=task, type="operation_dispatched", payload__data__op_key=op_key).count()


def the_one_start(results: list[Operation | VersionConflict | None], what: str) -> Operation:
    """Exactly one thread's start committed; every other one was refused as a version conflict (also a read that
    straddled the winner's commit: see the last tests of this file)."""
    assert all(isinstance(r, Operation | VersionConflict) for r in results), results
    won = [r for r in results if isinstance(r, Operation)]
    assert len(won) == 1, f"{what}: {len(won)} threads' starts committed"
    return won[0]


def test_concurrent_starts_send_each_op_key_once_and_spend_one_attempt(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    """Threads sharing the lease race to start each node at the version they all read: exactly one start commits
    (one operation, one operation_dispatched event, one attempt of the node's and the task's budgets), every other
    one is refused as a version conflict. Then a query by op key finds nothing (the winner died before its call)
    and the threads race to send that intent again: again exactly one wins, with the same op key, and no attempt
    is spent on it."""
    keys = [f"n{i}" for i in range(INTENT_NODES)]
    task = make_task(plan=chain_plan(*keys))
    lease = agent_lease(task)
    conflicts = 0
    elapsed = 0.0
    op_keys: list[str] = []

    for done, key in enumerate(keys):
        directive = next_directive(task_id=task.pk, lease=lease)
        assert (directive.kind, directive.node_key, directive.op_key) == ("execute", key, "")
        start = directive.task_version
        results, seconds = race_start(task, key, start, lease)
        elapsed += seconds
        op = the_one_start(results, f"node {key}, first send")
        assert (op.status, op.dispatch_count) == (OperationStatus.DISPATCHED, 1)
        assert Operation.objects.filter(op_key=op.op_key).count() == 1
        assert Operation.objects.filter(task=task, node__key=key).count() == 1, f"node {key}: several operations"
        assert sends_of(task, op.op_key) == 1
        assert current_version(task.pk) == start + 1
        assert Node.objects.get(task=task, key=key).attempts == 1
        assert Task.objects.get(pk=task.pk).attempts_used == done + 1
        conflicts += THREADS - 1

        # The winner died before its call: the remote has no trace of the op key, so it is sent again, raced too.
        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=start + 1), op.op_key, NotFound(), lease=lease
        )
        directive = next_directive(task_id=task.pk, lease=lease)
        assert (directive.kind, directive.node_key, directive.op_key) == ("execute", key, op.op_key)
        results, seconds = race_start(task, key, start + 2, lease)
        elapsed += seconds
        again = the_one_start(results, f"node {key}, sent again")
        assert (again.op_key, again.status, again.dispatch_count) == (op.op_key, OperationStatus.DISPATCHED, 2)
        assert Operation.objects.get(op_key=op.op_key).dispatch_count == 2
        assert Operation.objects.filter(task=task, node__key=key).count() == 1
        assert sends_of(task, op.op_key) == 2
        assert current_version(task.pk) == start + 3
        assert Node.objects.get(task=task, key=key).attempts == 1, "sending the same op key again spent an attempt"
        assert Task.objects.get(pk=task.pk).attempts_used == done + 1
        conflicts += THREADS - 1
        op_keys.append(op.op_key)

        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=start + 3),
            op.op_key,
            Committed(remote_id=f"r-{key}"),
            lease=lease,
        )

    task.refresh_from_db()
    stored_keys = list(Operation.objects.filter(task=task).values_list("op_key", flat=True))
    repeated = list(Operation.objects.values("op_key").annotate(n=Count("pk")).filter(n__gt=1))
    sends = Event.objects.filter(task=task, type="operation_dispatched").count()
    seqs = event_seqs(task)
    print(
        f"\n[operation_start] threads={THREADS} nodes={INTENT_NODES} races={2 * INTENT_NODES} "
        f"operations={len(stored_keys)} winners/race=1 sends={sends} refusals={conflicts} "
        f"attempts spent={task.attempts_used} duplicate op keys={len(repeated)} version={task.version} "
        f"elapsed={elapsed:.2f}s"
    )
    assert sorted(stored_keys) == sorted(op_keys)
    assert len(set(op_keys)) == INTENT_NODES
    assert repeated == []
    assert sends == 2 * INTENT_NODES
    assert task.attempts_used == INTENT_NODES
    assert list(Node.objects.filter(task=task).values_list("attempts", flat=True)) == [1] * INTENT_NODES
    assert task.status == TaskStatus.COMPLETED
    assert seqs == list(range(1, task.version + 1))
    assert find_log_problem(task) is None


def test_a_superseded_epoch_writes_nothing_once_the_new_grant_commits(
    make_task: Callable[..., Task], settings: Settings
) -> None:
    """Seven threads write with one short lease. Every write that lands extends it by its ttl (a write is a
    heartbeat), so they write freely; then they all stall, and once the lease has expired they hammer again: in
    the grace every write is refused (expired, not merely unrenewed), and once an eighth thread's new grant
    commits, every write with the old epoch is refused as lost. No stale write lands past the old lease's last
    expiry or after the grant."""
    settings.RECKON_LEASE_GRACE = STALE_GRACE
    task = make_task()
    old = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="stale-holder", ttl=STALE_TTL)
    stop = threading.Event()
    stalled = threading.Barrier(THREADS - 1, timeout=BARRIER_TIMEOUT)
    writing_until = time.monotonic() + STALE_WRITING
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

    def write_stale(index: int, until: Callable[[], bool]) -> None:
        while not until():
            try:
                result = compare_and_set(
                    task.pk, current_version(task.pk), probe(epoch=old.epoch, writer=index), lease=old
                )
                stale_wins.append((result.version, result.at))
            except (VersionConflict, LeaseExpired, LeaseLost) as exc:
                with refusals_lock:
                    stale_refusals[type(exc).__name__] += 1

    def stale_holder(index: int) -> None:
        write_stale(index, lambda: time.monotonic() >= writing_until)
        stalled.wait()  # every stale writer's last write has committed: the lease's expiry moves no more
        expires_at = Lease.objects.values_list("expires_at", flat=True).get(pk=old.pk)
        time.sleep(max(0.0, (expires_at - clock.now()).total_seconds()) + STALL_MARGIN)  # on the database clock
        write_stale(index, stop.is_set)

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        if index == 0:
            try:
                take_over()
            finally:
                stop.set()
        else:
            stale_holder(index)

    elapsed = run_threads(THREADS, work)

    task.refresh_from_db()
    new = granted[0]
    old_row = Lease.objects.get(pk=old.pk)
    by_epoch: dict[int, list[Event]] = {}
    for event in Event.objects.filter(task=task, type="race_probe").order_by("seq"):
        by_epoch.setdefault(event.payload["data"]["epoch"], []).append(event)
    old_events, new_events = by_epoch.get(old.epoch, []), by_epoch.get(new.epoch, [])
    after_grant = Event.objects.filter(task=task, created_at__gte=new.granted_at).order_by("seq")
    intruders = [e.seq for e in after_grant if e.payload.get("data", {}).get("epoch") != new.epoch]
    stale_late = [e.seq for e in old_events if e.seq > new.task_version_at_grant or e.created_at >= old_row.expires_at]
    seqs = event_seqs(task)
    print(
        f"\n[stale epoch] threads={THREADS} (1 taker, {THREADS - 1} stale writers) ttl={STALE_TTL.total_seconds()}s "
        f"grace={STALE_GRACE.total_seconds()}s epochs {old.epoch}->{new.epoch} "
        f"writes per epoch={{{old.epoch}: {len(old_events)}, {new.epoch}: {len(new_events)}}} "
        f"old lease extended by its writes {old.expires_at.time()}->{old_row.expires_at.time()} "
        f"stale refusals={dict(stale_refusals)} acquire refusals before takeover={len(acquire_refusals)} "
        f"grant at v{new.task_version_at_grant} "
        f"stale writes after grant={len(intruders)} stale writes past expiry={len(stale_late)} "
        f"duplicate seqs={duplicates(seqs)} elapsed={elapsed:.2f}s"
    )
    assert new.epoch == old.epoch + 1
    assert len(old_events) == len(stale_wins) > 0, "the stale holder never wrote: the race had no teeth"
    # Each landed write extended the lease to its own time plus the ttl; the last one set the final expiry.
    assert old_row.expires_at == max(old.expires_at, max(at for _, at in stale_wins) + STALE_TTL)
    assert old_row.expires_at > old.expires_at, "no write extended the lease it was made with"
    assert old_row.release_reason == ReleaseReason.EXPIRED  # closed as lapsed by the new grant
    assert old_row.released_at is not None and old_row.released_at <= new.granted_at
    assert new.granted_at >= old_row.expires_at + STALE_GRACE
    assert len(new_events) == NEW_HOLDER_WRITES
    assert stale_refusals["LeaseExpired"] > 0, "no stale write was tried inside the grace"
    assert stale_refusals["LeaseLost"] > 0, "no stale write was tried against the committed grant"
    assert all(at < old_row.expires_at for _, at in stale_wins)
    assert stale_late == []
    assert intruders == []
    assert max(e.seq for e in old_events) < min(e.seq for e in new_events)
    assert seqs == list(range(1, task.version + 1))
    assert find_log_problem(task) is None


# Seconds between the workers' start and the cancel, one round each (negative: the cancel starts first). Seven
# workers sharing two cores take tens of milliseconds a node: the first rounds' cancels race the intent's re-send.
CANCEL_DELAYS = (-0.002, 0.0, 0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
CANCEL_NODES = 40  # more than the workers finish before the latest cancel: each round is cut short by it
CREATOR = Principal.agent("tester")  # make_task's tasks are created by agent:tester: it may cancel them


def _protocol_racer(
    task: Task, lease: Lease, cancel_delay: float, sent: list[tuple[str, int]], stops: list[str]
) -> Work:
    """Thread 0 records a cancel ``cancel_delay`` seconds after the others start (a negative delay: before them);
    the others drive the step protocol as hard as they can. The remote commits every operation sent (a query by op
    key says so)."""

    def work(index: int, barrier: threading.Barrier) -> None:
        current_version(task.pk)  # the thread's connection is open before the race starts
        barrier.wait()
        if index == 0:
            time.sleep(max(cancel_delay, 0))
            task_request_cancel(task_id=task.pk, actor=CREATOR, reason="race")
            return
        time.sleep(max(-cancel_delay, 0))
        for _ in range(CANCEL_NODES * 3):
            try:
                d = next_directive(task_id=task.pk, lease=lease)  # may be refused: the task kept changing as read
                if d.kind == "execute":  # a ready node, or an intent to send again under its op key
                    op = operation_start(
                        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version),
                        d.node_key,
                        lease=lease,
                    ).operation
                    sent.append((op.op_key, op.dispatch_count))
                    time.sleep(0.001)  # the remote call: the cancel may land while it is in flight
                    receipt = Committed(remote_id=f"r-{op.op_key}")
                    record_outcome(
                        snapshot_at(task_id=op.task_id, lease=lease, expected_version=d.task_version + 1),
                        op.op_key,
                        receipt,
                        lease=lease,
                    )
                elif d.kind == "reconcile":
                    receipt = Committed(remote_id=f"r-{d.op_key}")
                    record_outcome(
                        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version),
                        d.op_key,
                        receipt,
                        lease=lease,
                    )
                else:
                    stops.append(f"{d.kind} {d.reason}".strip())
                    return
            except (TaskError, LeaseLost, LeaseExpired):
                continue

    return work


def test_a_cancel_racing_the_step_protocol_stops_every_new_side_effect(make_task: Callable[..., Task]) -> None:
    """Invariant 6 under real concurrency: seven workers share a lease and race to start the next node — the
    first one an intent left by a query that found nothing, to be sent again under its op key — while an eighth
    thread records a cancel. Whatever interleaving the database picks, no operation is registered and nothing is
    sent after the cancel's commit, the intent the cancel found (sent once before) is left unknown for the
    reconcile, never withdrawn as never sent, and the task ends stopping or stopped."""
    after_cancel = before_cancel = kept = resent = 0
    stops: list[str] = []
    for round_number, delay in enumerate(CANCEL_DELAYS):
        task = make_task(plan=chain_plan(*(f"n{i}" for i in range(CANCEL_NODES))), attempt_budget=2 * CANCEL_NODES)
        lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=f"workers-{round_number}")
        first = operation_start(
            snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version), "n0", lease=lease
        ).operation
        record_outcome(
            snapshot_at(task_id=first.task_id, lease=lease, expected_version=task.version + 1),
            first.op_key,
            NotFound(),
            lease=lease,
        )
        assert Operation.objects.get(pk=first.pk).status == OperationStatus.INTENT
        sent: list[tuple[str, int]] = []
        run_threads(THREADS, _protocol_racer(task, lease, delay, sent, stops))
        task.refresh_from_db()
        assert task.cancel_requested_at is not None
        late = Operation.objects.filter(task=task, registered_at__gt=task.cancel_requested_at)
        assert not late.exists(), "an operation was registered after the cancel"
        cancel_seq = Event.objects.get(task=task, type="cancel_requested").seq
        late_sends = Event.objects.filter(task=task, type="operation_dispatched", seq__gt=cancel_seq)
        assert not late_sends.exists(), "an operation was sent after the cancel"
        assert not Operation.objects.filter(task=task, status=OperationStatus.INTENT).exists()
        assert task.status in (TaskStatus.STOPPING, TaskStatus.STOPPED_PENDING, TaskStatus.STOPPED), task.status
        assert find_log_problem(task) is None
        # Each send was won by one thread: no op key sent twice by the race, the intent's included.
        assert len(sent) == len(set(sent)) == len({op_key for op_key, _ in sent})
        first.refresh_from_db()
        if (first.op_key, 2) in sent:
            assert first.dispatch_count == 2
            resent += 1
        else:  # the cancel came first: the intent was sent once, so a copy may still land — never withdrawn
            # as never sent, but left unknown (awaiting_final) for the racers' reconcile to settle by the remote
            assert first.dispatch_count == 1
            assert first.status in (OperationStatus.UNKNOWN, OperationStatus.COMMITTED), first.status
            assert first.status == OperationStatus.COMMITTED or first.failure_class == AWAITING_FINAL
            kept += 1
        assert all(count == 1 for op_key, count in sent if op_key != first.op_key)
        # Budgets: one attempt per op key, spent by its first send; the intent's re-send spent none.
        operations = Operation.objects.filter(task=task)
        assert task.attempts_used == operations.count() == len(sent) + (1 if (first.op_key, 2) not in sent else 0)
        assert sum(Node.objects.filter(task=task).values_list("attempts", flat=True)) == task.attempts_used
        before_cancel += len(sent)
        after_cancel += Receipt.objects.filter(operation__task=task, committed_after_cancel_request=True).count()
    # Every worker stopped because the task was cancelled: none was told "no ready node" by a torn read.
    assert set(stops) <= {"stop cancel_requested", "stop stopped"}, Counter(stops)
    print(
        f"\n[cancel race] threads={THREADS} rounds={len(CANCEL_DELAYS)} sends before the cancel={before_cancel} "
        f"(intents sent again={resent}, left unknown by the cancel={kept}) "
        f"commits recorded after the cancel request={after_cancel}; operations or sends after a cancel: 0; "
        f"workers stopped by={dict(Counter(stops))}"
    )


def test_a_start_whose_read_straddles_another_start_is_refused_as_a_version_conflict(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    """The snapshot reads the task row, then the plan's nodes, then the unsettled operations, each in its own
    statement. Another writer's start commits right after the task row was read: the snapshot then pairs the
    old version with the new operation. Nothing can be written on it (the version moved), and the refusal must
    say so — VersionConflict: read again — not name a condition of a version that no snapshot showed."""
    task = make_task(plan=chain_plan("a", "b"))
    lease = agent_lease(task)
    version = task.version
    armed = [True]

    def another_start_commits_after_the_first_read(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql, params, many, context)
        if armed:
            armed.clear()
            run_threads(
                1,
                lambda _index, _barrier: (
                    operation_start(
                        snapshot_at(task_id=task.pk, lease=lease, expected_version=version), "a", lease=lease
                    ).operation
                ),
            )
        return result

    with connection.execute_wrapper(another_start_commits_after_the_first_read), pytest.raises(VersionConflict):
        operation_start(snapshot_at(task_id=task.pk, lease=lease, expected_version=version), "a", lease=lease)
    assert current_version(task.pk) == version + 1
    assert Operation.objects.filter(task=task).count() == 1


def test_a_directive_whose_read_straddles_a_commit_is_the_directive_of_one_version(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    """next_directive reads the task row, the nodes and the operations. Another writer records the open
    operation's receipt right after the nodes were read. The directive must be that of one version — reconcile
    the open operation (the version read), or done (the version after) — never "stop, no ready node", which
    tells a worker to give up on a task that has work left."""
    task = make_task(plan=chain_plan("a", "b"))
    lease = agent_lease(task)
    begun = operation_start(snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version), "a", lease=lease)
    record_outcome(begun.snapshot, begun.operation.op_key, Committed(remote_id="r-a"), lease=lease)
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=task.version + 2), "b", lease=lease
    ).operation
    version = current_version(task.pk)
    reads = [0]

    def the_receipt_is_recorded_after_the_nodes_were_read(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql, params, many, context)
        reads[0] += 1
        if reads[0] == 2:
            run_threads(
                1,
                lambda _index, _barrier: (
                    record_outcome(
                        snapshot_at(task_id=op.task_id, lease=lease, expected_version=version),
                        op.op_key,
                        Committed(remote_id="r-b"),
                        lease=lease,
                    ).operation
                ),
            )
        return result

    with connection.execute_wrapper(the_receipt_is_recorded_after_the_nodes_were_read):
        directive = next_directive(task_id=task.pk, lease=lease)
    assert current_version(task.pk) == version + 1
    assert (directive.kind, directive.task_version) in {("reconcile", version), ("done", version + 1)}, directive


def test_archive_runs_at_once_move_each_task_once(make_task: Callable[..., Task]) -> None:
    """Four archive runs at the same moment over the same ended tasks (every beat host may run one): each event is
    copied once, none is left behind, each task is named by one audit row, and every log still reads whole."""
    from audit.models import AuditEvent
    from tasks.engine.archive import ARCHIVE_ACTION, archive_ended
    from tasks.models import ArchivedEvent

    tasks = []
    for _ in range(12):
        task = make_task(chain_plan("a"))
        lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
        op = operation_start(
            snapshot_at(task_id=task.pk, lease=lease, expected_version=current_version(task.pk)), "a", lease=lease
        ).operation
        record_outcome(
            snapshot_at(task_id=task.pk, lease=lease, expected_version=current_version(task.pk)),
            op.op_key,
            Committed(remote_id="r"),
            lease=lease,
        )
        tasks.append(Task.objects.get(pk=task.pk))
    assert {t.status for t in tasks} == {TaskStatus.COMPLETED}
    events = sum(t.version for t in tasks)
    moved: list[int] = []

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        moved.append(archive_ended(after=timedelta(0)).events)

    run_threads(4, work)
    assert sum(moved) == events and ArchivedEvent.objects.count() == events
    assert not Event.objects.filter(task__in=tasks).exists()
    named = [pk for row in AuditEvent.objects.filter(action=ARCHIVE_ACTION) for pk in row.details["task_ids"]]
    assert sorted(named) == sorted(t.pk for t in tasks)
    assert [find_log_problem(t) for t in tasks] == [None] * len(tasks)
