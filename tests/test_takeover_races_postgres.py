"""Real takeover races on PostgreSQL: operators against operators, and operators against agents.

Every thread has its own connection and every write commits (``transaction=True``); lease decisions run on the
database server's clock. What decides the winner is the partial unique index on open leases, the (task, epoch)
constraint, row locks and the version compare-and-set — the rules the takeover services rely on. Run with
``pytest -s`` to see the figures.
"""

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from pytest_django.fixtures import Settings

from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import verify_audit
from leases import clock
from leases.clock import DatabaseClock, use_clock
from leases.errors import LeaseError, LeaseHeld, LeaseLost, LeaseRefused, LeaseReserved
from leases.models import HolderKind, Lease, ReleaseReason
from leases.services import lease_acquire, lease_release
from tasks.access.permissions import ADMIN, OPERATOR, permission_grant
from tasks.core.errors import TakeoverHeld, TaskError, VersionConflict
from tasks.core.lifecycle import TaskStatus
from tasks.core.outcomes import Committed
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.engine.events import find_log_problem
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Event, Operation, Task
from tasks.people.takeover import (
    Claim,
    takeover_claim,
    takeover_release,
    takeover_submit,
)
from tests.conftest import chain_plan, person
from tests.test_races_postgres import run_threads

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason=f"needs PostgreSQL for real concurrent claims (database vendor is {connection.vendor}); "
        "set DATABASE_URL=postgres://…",
    ),
]

CLAIMERS = 8  # 6 operators with a grant on the task, 2 admins
CLAIM_ROUNDS = 12
AGENTS = 5
OPERATORS = 3
OPERATOR_ROUNDS = 4
OPERATOR_WRITES = 3
AGENT_STEPS = 3
AGENT_PAUSE = 0.008  # between an agent's attempts: eight busy Python threads share one GIL
OPERATOR_PAUSE = 0.5  # between a person's takeovers, for the agents to get work done
OPERATOR_RETRY = 0.02
AGENT_TTL = timedelta(milliseconds=400)
AGENT_GRACE = timedelta(milliseconds=200)
AGENT_CRASH_EVERY = 9  # one lease in nine is never released: it lapses and the next grant closes it
CLAIM_DEADLINE = 20.0


def current_version(task_id: int) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task_id)


def refusal_name(exc: BaseException) -> str:
    """TakeoverHeld raised while handling a LeaseHeld that lost at the unique index says so."""
    name = type(exc).__name__
    held = exc.__context__
    if isinstance(exc, TakeoverHeld) and isinstance(held, LeaseHeld) and isinstance(held.__cause__, IntegrityError):
        return f"{name} (lost at the unique index)"
    return name


def test_exactly_one_of_many_operators_claiming_a_free_task_wins(make_task: Callable[..., Task]) -> None:
    task = make_task()
    root = person("race-root", ADMIN)
    operators = [person(f"race-op-{i}", OPERATOR) for i in range(CLAIMERS - 2)]
    for operator in operators:
        permission_grant(actor=root, user=operator.user, task=task)
    claimers = [*operators, person("race-admin-0", ADMIN), person("race-admin-1", ADMIN)]
    outcomes: list[list[Claim | TaskError | LeaseError | None]] = [[None] * CLAIMERS for _ in range(CLAIM_ROUNDS)]
    open_while_held: list[list[Lease]] = [[] for _ in range(CLAIM_ROUNDS)]
    refusals: Counter[str] = Counter()
    lock = threading.Lock()

    def work(index: int, barrier: threading.Barrier) -> None:
        actor = claimers[index]
        for round_ in range(CLAIM_ROUNDS):
            barrier.wait()
            if actor.id.startswith("race-admin") and round_ % 2:
                # Admins skip the per-object permission queries and would win every round; let operators win some.
                time.sleep(0.03)
            outcome: Claim | TaskError | LeaseError
            try:
                outcome = takeover_claim(actor=actor, task_id=task.pk)
            except (TakeoverHeld, LeaseHeld) as exc:
                outcome = exc
                with lock:
                    refusals[refusal_name(exc)] += 1
            outcomes[round_][index] = outcome
            barrier.wait()
            if index == 0:
                open_while_held[round_] = list(Lease.objects.open().filter(task=task))
            barrier.wait()
            if isinstance(outcome, Claim) and outcome.lease is not None:
                if round_ % 2:
                    takeover_release(actor=actor, lease=outcome.lease, reason=f"round {round_}")
                else:
                    takeover_submit(
                        actor=actor,
                        lease=outcome.lease,
                        based_on_version=current_version(task.pk),
                        decision="resume_agent",
                        note=f"round {round_}",
                    )

    elapsed = run_threads(CLAIMERS, work)

    winners = [[o for o in row if isinstance(o, Claim)] for row in outcomes]
    won_by = Counter(claimers[row.index(w[0])].id for row, w in zip(outcomes, winners, strict=True) if len(w) == 1)
    grants = list(AuditEvent.objects.filter(task_id=task.pk, action="takeover_granted").order_by("seq"))
    leases = list(Lease.objects.filter(task=task).order_by("epoch"))
    print(
        f"\n[takeover_claim, operators only] threads={CLAIMERS} rounds={CLAIM_ROUNDS} "
        f"winners/round={dict(Counter(len(w) for w in winners))} refusals={dict(refusals)} "
        f"wins by claimer={dict(won_by)} takeover_granted audit rows={len(grants)} "
        f"epochs={[lease.epoch for lease in leases]} elapsed={elapsed:.2f}s"
    )
    for round_, (row, won) in enumerate(zip(outcomes, winners, strict=True)):
        assert len(won) == 1, f"round {round_}: {len(won)} operators were granted the takeover"
        claim = won[0]
        assert claim.granted and claim.lease is not None
        assert all(isinstance(o, TakeoverHeld | LeaseHeld) for o in row if o is not claim), row
        assert [lease.pk for lease in open_while_held[round_]] == [claim.lease.pk], f"round {round_}"
        assert claim.lease.holder_kind == HolderKind.OPERATOR
        assert claim.lease.holder_id == claimers[row.index(claim)].id
        rows = [g for g in grants if g.lease_epoch == claim.lease.epoch]
        assert len(rows) == 1, f"round {round_}: {len(rows)} takeover_granted audit rows for epoch {claim.lease.epoch}"
        assert rows[0].actor_id == claim.lease.holder_id
    assert len(grants) == CLAIM_ROUNDS
    assert [lease.epoch for lease in leases] == list(range(1, CLAIM_ROUNDS + 1))
    assert all(lease.release_reason == ReleaseReason.RELEASED for lease in leases)
    assert not Lease.objects.open().filter(task=task).exists()
    assert sum(refusals.values()) == CLAIM_ROUNDS * (CLAIMERS - 1)
    task.refresh_from_db()
    assert task.status == TaskStatus.HUMAN  # the last round released without a decision
    assert find_log_problem(task) is None
    assert verify_audit().problem is None


@dataclass
class Figures:
    """What the threads of the agents-versus-operators race saw, shared under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    agent_refusals: Counter[str] = field(default_factory=Counter)
    operator_refusals: Counter[str] = field(default_factory=Counter)
    directives: Counter[str] = field(default_factory=Counter)
    agent_grants: list[Lease] = field(default_factory=list)
    operator_grants: list[Lease] = field(default_factory=list)
    # (event type, op key) -> the epochs of the agents whose write it was
    agent_writes: defaultdict[tuple[str, str], set[int]] = field(default_factory=lambda: defaultdict(set))
    crashes: int = 0
    samples: int = 0
    max_open: int = 0
    too_many_open: list[tuple[datetime, int]] = field(default_factory=list)

    def count(self, counter: Counter[str], what: str) -> None:
        with self.lock:
            counter[what] += 1


def _agent_loop(task: Task, index: int, stop: threading.Event, figures: Figures) -> None:
    """A worker: take the lease when free, run a couple of protocol steps, give it back (or crash)."""
    name = f"agent-{index}"
    while not stop.is_set():
        try:
            lease = lease_acquire(task_id=task.pk, holder_kind=HolderKind.AGENT, holder_id=name, ttl=AGENT_TTL)
        except (LeaseHeld, LeaseReserved, LeaseRefused) as exc:  # refused: people hold the task (human)
            figures.count(figures.agent_refusals, f"acquire: {type(exc).__name__}")
            time.sleep(AGENT_PAUSE)
            continue
        with figures.lock:
            figures.agent_grants.append(lease)
            crash = len(figures.agent_grants) % AGENT_CRASH_EVERY == 0
        for _ in range(AGENT_STEPS):
            try:
                d = next_directive(task_id=task.pk, lease=lease)
                if d.kind == "execute":
                    # One commit: the operation registered and marked sent (the call itself is the remote's).
                    op = operation_start(
                        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version),
                        d.node_key,
                        lease=lease,
                    ).operation
                    written = ("operation_dispatched", op.op_key)
                elif d.kind == "reconcile" and d.op_key:
                    # The remote committed every dispatched operation; a query by op key says so.
                    receipt = Committed(remote_id=f"r-{d.op_key}")
                    record_outcome(
                        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version),
                        d.op_key,
                        receipt,
                        lease=lease,
                    )
                    written = ("node_succeeded", d.op_key)
                else:
                    figures.count(figures.directives, f"{d.kind} {d.reason}")
                    break
            except (TaskError, LeaseError) as exc:
                figures.count(figures.agent_refusals, f"write: {type(exc).__name__}")
                break
            with figures.lock:
                figures.agent_writes[written].add(lease.epoch)
        if crash:
            with figures.lock:
                figures.crashes += 1  # the process dies holding the lease: it lapses after ttl + grace
        else:
            try:
                lease_release(lease=lease)
            except LeaseLost:
                figures.count(figures.agent_refusals, "release: LeaseLost")
        time.sleep(AGENT_PAUSE)


def _operator_loop(task: Task, actor: Principal, index: int, figures: Figures) -> None:
    """A person: claim until granted (waiting while an agent finishes), write a little, then hand back."""
    time.sleep(OPERATOR_PAUSE * index / OPERATORS)
    for round_ in range(OPERATOR_ROUNDS):
        deadline = time.monotonic() + CLAIM_DEADLINE
        lease: Lease | None = None
        while lease is None:
            assert time.monotonic() < deadline, f"{actor} was never granted the takeover"
            try:
                claim = takeover_claim(actor=actor, task_id=task.pk)
            except (TakeoverHeld, LeaseReserved, VersionConflict) as exc:
                figures.count(figures.operator_refusals, refusal_name(exc))
                time.sleep(OPERATOR_RETRY)
                continue
            if not claim.granted:
                figures.count(figures.operator_refusals, "waiting for the agent")
                time.sleep(OPERATOR_RETRY / 4)
                continue
            lease = claim.lease
        assert lease is not None
        with figures.lock:
            figures.operator_grants.append(lease)
        for write in range(OPERATOR_WRITES):
            # Nobody else may write while the person holds the lease: a VersionConflict here fails the test.
            compare_and_set(
                task.pk,
                current_version(task.pk),
                Change(event="operator_probe", data={"epoch": lease.epoch, "operator": actor.id, "write": write}),
                lease=lease,
            )
            time.sleep(0.002)
        if (round_, index) == (1, 0):
            # The task stays with people: no agent is granted a lease (LeaseRefused) until someone decides.
            takeover_release(actor=actor, lease=lease, reason=f"round {round_}")
        else:
            takeover_submit(
                actor=actor,
                lease=lease,
                based_on_version=current_version(task.pk),
                decision="resume_agent",
                note=f"round {round_}",
            )
        time.sleep(OPERATOR_PAUSE)


def _monitor_loop(task: Task, stop: threading.Event, figures: Figures) -> None:
    """Count open leases, in one statement each time, for as long as the race runs."""
    while not stop.is_set():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT clock_timestamp(), count(*) FROM leases_lease WHERE task_id = %s AND released_at IS NULL",
                [task.pk],
            )
            at, count = cursor.fetchone()
        with figures.lock:
            figures.samples += 1
            figures.max_open = max(figures.max_open, count)
            if count > 1:
                figures.too_many_open.append((at, count))
        time.sleep(0.002)


def _takeovers(task: Task) -> list[tuple[Lease, datetime, datetime]]:
    """Per operator lease: (the lease, the takeover request — or the grant — time, the end of the lease).

    The request's and the grant's audit times are those of their compare-and-set, which an agent's write can only
    precede: a write that came later would have met the moved version and been refused."""
    requested: dict[str, datetime] = {}
    leases = {lease.epoch: lease for lease in Lease.objects.filter(task=task, holder_kind=HolderKind.OPERATOR)}
    takeovers = []
    for row in AuditEvent.objects.filter(task_id=task.pk).order_by("seq"):
        if row.action == "takeover_requested":
            requested.setdefault(row.actor_id, row.at)
        elif row.action == "takeover_granted":
            assert row.lease_epoch is not None
            lease = leases[row.lease_epoch]
            takeovers.append((lease, requested.pop(row.actor_id, row.at), lease.released_at or clock.now()))
    return takeovers


def test_an_operator_racing_agents_never_shares_the_task(make_task: Callable[..., Task], settings: Settings) -> None:
    settings.RECKON_LEASE_GRACE = AGENT_GRACE
    task = make_task(plan=chain_plan(*(f"n{i}" for i in range(100))), attempt_budget=1000)
    root = person("race-root", ADMIN)
    operators = [person(f"race-op-{i}", OPERATOR) for i in range(OPERATORS - 1)]
    for operator in operators:
        permission_grant(actor=root, user=operator.user, task=task)
    operators.append(person("race-admin", ADMIN))
    figures = Figures()
    stop = threading.Event()
    finished: list[int] = []

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        if index < OPERATORS:
            try:
                _operator_loop(task, operators[index], index, figures)
            except BaseException:
                stop.set()  # the agents and the monitor stop too, so the failure is reported at once
                raise
            with figures.lock:
                finished.append(index)
                if len(finished) == OPERATORS:
                    stop.set()
        elif index == OPERATORS:
            _monitor_loop(task, stop, figures)
        else:
            _agent_loop(task, index - OPERATORS - 1, stop, figures)

    elapsed = run_threads(OPERATORS + 1 + AGENTS, work)

    task.refresh_from_db()
    events = list(Event.objects.filter(task=task).order_by("seq"))
    takeovers = _takeovers(task)
    # Which epoch wrote each event: agents from their own log, people from the event's data.
    writer: dict[int, int] = {}
    for event in events:
        data = event.payload.get("data", {})
        epochs = figures.agent_writes.get((event.type, data.get("op_key", "")), set())
        assert len(epochs) <= 1, f"event #{event.seq} {event.type} claimed by epochs {epochs}"
        if epochs:
            writer[event.seq] = next(iter(epochs))
        elif event.type in ("takeover_granted", "operator_probe"):
            writer[event.seq] = data["epoch"]
    agent_events = [e for e in events if e.seq in writer and e.type not in ("takeover_granted", "operator_probe")]
    during = [
        (e.seq, e.type, writer[e.seq], str(lease))
        for e in agent_events
        for lease, _requested, end in takeovers
        if lease.granted_at < e.created_at < end
    ]
    late_starts = [
        (op.op_key, op.registered_at, str(lease))
        for op in Operation.objects.filter(task=task)
        for lease, requested, end in takeovers
        if requested <= op.registered_at <= end
    ]
    ordered_writers = [writer[e.seq] for e in events if e.seq in writer]
    history = list(Lease.objects.filter(task=task).order_by("epoch"))
    overlaps = [
        (before.epoch, after.epoch, before.released_at - after.granted_at)
        for before, after in itertools.pairwise(history)
        if before.released_at is not None and after.granted_at < before.released_at
    ]
    grant_rows = AuditEvent.objects.filter(task_id=task.pk, action="takeover_granted").count()
    print(
        f"\n[operators vs agents] threads={OPERATORS + 1 + AGENTS} ({OPERATORS} operators, {AGENTS} agents, "
        f"1 monitor) operator rounds={OPERATOR_ROUNDS} operator grants={len(figures.operator_grants)} "
        f"agent grants={len(figures.agent_grants)} agent crashes={figures.crashes} "
        f"agent writes={len(agent_events)} nodes done={task.nodes.filter(status='succeeded').count()}/100 "
        f"events={len(events)} open-lease samples={figures.samples} max open={figures.max_open} "
        f"elapsed={elapsed:.2f}s"
        f"\n  operator refusals={dict(figures.operator_refusals)}"
        f"\n  agent refusals={dict(figures.agent_refusals)}"
        f"\n  agent stop directives={dict(figures.directives)}"
        f"\n  agent events inside an operator's lease={during} operations started inside a takeover={late_starts}"
        f"\n  lease rows granted before the previous one was released (see the interleaving test below)="
        f"{len(overlaps)}, by up to {max((o[2] for o in overlaps), default=timedelta(0)).total_seconds() * 1000:.1f}ms"
    )
    assert figures.too_many_open == [], "two leases were open at once"
    assert figures.max_open == 1 and figures.samples > 100
    assert len(figures.operator_grants) == OPERATORS * OPERATOR_ROUNDS
    assert grant_rows == len(figures.operator_grants)
    assert figures.agent_writes, "no agent ever wrote: the race had no teeth"
    assert len(agent_events) == len(figures.agent_writes), "an agent's write is missing from the log"
    assert len(takeovers) == len(figures.operator_grants)
    assert figures.agent_refusals["acquire: LeaseReserved"] > 0, "no agent met a pending takeover"
    assert figures.agent_refusals["acquire: LeaseRefused"] > 0, "no agent met the task left with people"
    assert during == []
    assert late_starts == []
    assert ordered_writers == sorted(ordered_writers), "an older epoch wrote after a newer one"
    granted = list(Lease.objects.filter(task=task).order_by("pk").values_list("epoch", flat=True))
    assert granted == list(range(1, len(granted) + 1))
    assert [e.seq for e in events] == list(range(1, task.version + 1))
    assert find_log_problem(task) is None
    assert verify_audit().problem is None
    _assert_one_open_lease_is_enforced_by_the_database(task)


def _assert_one_open_lease_is_enforced_by_the_database(task: Task) -> None:
    """The partial unique index exists and refuses a second open lease, whatever a service would do."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Lease._meta.db_table)
    assert constraints["lease_one_open_per_task"]["unique"]
    holder = Lease.objects.open().filter(task=task).first()
    if holder is None:
        holder = lease_acquire(task_id=task.pk, holder_kind=HolderKind.AGENT, holder_id="index-check")
    now = clock.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        Lease.objects.create(
            task=task,
            holder_kind=HolderKind.AGENT,
            holder_id="intruder",
            task_version_at_grant=task.version,
            granted_at=now,
            expires_at=now + timedelta(seconds=30),
            epoch=holder.epoch + 1000,
        )


class InterleavingClock(DatabaseClock):
    """The database server's clock, that lets another connection commit ``between`` right after the armed
    thread's first reading. In lease_acquire that is the moment between reading the time and looking for an
    open lease: a moment real threads hit (the figures above count the lease rows it leaves overlapping)."""

    def __init__(self, between: Callable[[], None]) -> None:
        self._between: Callable[[], None] | None = between
        self._armed = threading.get_ident()

    def now(self) -> datetime:
        value = super().now()
        if self._between is not None and threading.get_ident() == self._armed:
            between, self._between = self._between, None
            run_threads(1, lambda _index, _barrier: between())
        return value


def test_a_takeover_is_recorded_as_granted_after_the_agent_it_follows_let_go(make_task: Callable[..., Task]) -> None:
    """The agent starts an operation and releases its lease, both committed, while the operator's claim is between
    reading the clock and finding the lease free. The log and the audit order the takeover after the start; the
    lease history must too, or it shows the person holding the task while the agent was still writing."""
    task = make_task()
    ann = person("ann", ADMIN)
    agent = lease_acquire(task_id=task.pk, holder_kind=HolderKind.AGENT, holder_id="agent-1")
    d = next_directive(task_id=task.pk, lease=agent)

    def agent_writes_then_lets_go() -> None:
        operation_start(
            snapshot_at(task_id=task.pk, lease=agent, expected_version=d.task_version), d.node_key, lease=agent
        )
        lease_release(lease=agent)

    with use_clock(InterleavingClock(agent_writes_then_lets_go)):
        claim = takeover_claim(actor=ann, task_id=task.pk)

    assert claim.granted and claim.lease is not None
    operator = claim.lease
    released = Lease.objects.get(pk=agent.pk).released_at
    assert released is not None
    started = Event.objects.get(task=task, type="operation_dispatched")
    granted = Event.objects.get(task=task, type="takeover_granted")
    audited = AuditEvent.objects.get(task_id=task.pk, action="takeover_granted")
    print(
        f"\n[claim between the clock and the check] agent lease released at {released.time()}, "
        f"agent start at {started.created_at.time()} (seq {started.seq}), operator lease granted_at "
        f"{operator.granted_at.time()}, takeover_granted event at {granted.created_at.time()} (seq {granted.seq}), "
        f"audit at {audited.at.time()}"
    )
    assert started.seq < granted.seq
    assert started.created_at < audited.at
    assert operator.granted_at >= released, (
        f"the operator's lease (epoch {operator.epoch}) is recorded as granted at {operator.granted_at}, "
        f"{(released - operator.granted_at).total_seconds() * 1000:.1f}ms before the agent's lease was released "
        f"and before the agent's start at {started.created_at}: lease_acquire stamps granted_at (and expires_at) "
        "with a time read before it found the task free"
    )
    assert not operator.granted_at < started.created_at, "an agent's event falls inside the operator's lease"
