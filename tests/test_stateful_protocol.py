"""A hypothesis state machine driving random sequences of protocol calls by two agents against one task.

Stale versions, duplicate calls, lease expiry on a controllable database clock, remote calls that
commit and then drop the connection, and crashes (an agent forgetting everything it had in memory)
are all in the mix. A crash between an operation's start (registered and marked sent, one commit) and the
call leaves it to a query by op key: it finds nothing, and the same op key is sent again as an intent.
After every step it checks invariants 1, 2, 3, 6, 7 and 10 of DESIGN §3; at the
end a fresh agent must be able to settle every operation (invariant 4's "eventually").

The remote here does NOT deduplicate by op key: every submit that commits counts as a side effect,
so a duplicate anywhere in the protocol shows up as a count of two.
"""

import contextlib
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from audit.principals import Principal
from leases.clock import ControllableClock
from leases.errors import LeaseError
from leases.models import Lease
from leases.services import lease_acquire, lease_release, lease_renew
from tasks.core.errors import TaskError
from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, TaskStatus
from tasks.core.outcomes import Accepted, Committed, Failed, NotFound, Outcome
from tasks.decide.evidence import evidence_problems
from tasks.engine.events import find_log_problem
from tasks.engine.plans import task_create
from tasks.engine.protocol import Directive, next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Event, Node, Operation, Receipt, Task
from tasks.people.cancel import task_request_cancel
from tests.conftest import EFFECT

COUNT = 5
PLAN = {
    "nodes": [
        {"key": "prepare", "action": EFFECT, "evidence": {"remote_id": True, "count": COUNT}},
        {
            "key": "copy-1",
            "action": EFFECT,
            "depends_on": ["prepare"],
            "input": {"target": {"from": "prepare", "field": "remote_id"}},
            "evidence": {"remote_id": True, "count": COUNT},
        },
        {
            "key": "copy-2",
            "action": EFFECT,
            "depends_on": ["prepare"],
            "input": {"target": {"from": "prepare", "field": "remote_id"}},
            "evidence": {"remote_id": True, "count": COUNT},
        },
        {
            "key": "switch",
            "action": EFFECT,
            "depends_on": ["copy-1", "copy-2"],
            "evidence": {"remote_id": True, "count": COUNT},
            "irreversible": True,
            "compensation": "store.restore_reference",
        },
    ]
}

MODES = st.sampled_from(
    [
        "commit",
        "commit",
        "commit",
        "accept",  # accepted, still running remotely; a later lookup finds it committed
        "unavailable",  # 503: nothing happened
        "commit_then_drop",  # the write commits, the client sees a timeout
        "drop_before_send",  # the connection fails before the request leaves
        "short_count",  # commits, but the receipt does not satisfy the evidence
    ]
)


CREATOR = Principal.agent("machine")  # the task's creator: it may cancel the task

# What the examples reached, printed at the end (pytest -s): a machine that never gets anywhere proves nothing.
STATS: Counter[str] = Counter()


class Remote:
    """An external system that commits every submit it receives (no dedupe) and can be queried by op key."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.committed: dict[str, Committed] = {}

    def submit(self, op_key: str, mode: str) -> Outcome:
        if mode in ("unavailable",):
            return Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503")
        if mode == "drop_before_send":
            return Failed(FailureClass.CONNECTION_INTERRUPTED, "connection reset before sending")
        self.effects[op_key] += 1
        receipt = Committed(remote_id=f"r-{op_key}", count=COUNT - 1 if mode == "short_count" else COUNT)
        self.committed[op_key] = receipt
        if mode == "accept":
            return Accepted(remote_id=receipt.remote_id)
        if mode == "commit_then_drop":
            return Failed(FailureClass.CONNECTION_INTERRUPTED, "timeout after sending")
        return receipt

    def lookup(self, op_key: str) -> Outcome:
        return self.committed.get(op_key, NotFound())


@dataclass
class Agent:
    name: str
    lease: Lease | None = None
    version: int = 0
    op_key: str = ""
    outcome: Outcome | None = None
    held: Directive | None = None  # a directive read before a stall, acted on after it
    writes: list[int] = field(default_factory=list)

    def crash(self) -> None:
        """A process dies: everything in memory is gone; its lease stays in the database until it lapses."""
        self.version, self.op_key, self.outcome, self.held = 0, "", None, None


class ProtocolMachine(RuleBasedStateMachine):
    clock: ControllableClock

    def __init__(self) -> None:
        super().__init__()
        self.remote = Remote()
        self.task = task_create(kind="stateful", title="machine", plan=PLAN, created_by=str(CREATOR), attempt_budget=12)
        self.agents = {name: Agent(name) for name in ("a", "b")}

    # --- helpers -------------------------------------------------------------------------------------

    def _lease_is_live(self, agent: Agent) -> bool:
        if agent.lease is None:
            return False
        return Lease.objects.filter(
            pk=agent.lease.pk, released_at__isnull=True, expires_at__gt=self.clock.now()
        ).exists()

    def _write(self, agent: Agent, call: Any) -> Any:
        """Run a protocol write. If it lands, the writer must have held the live lease (invariant 3)."""
        live = self._lease_is_live(agent)
        before = Task.objects.get(pk=self.task.pk).version
        try:
            result = call()
        except (TaskError, LeaseError) as refusal:
            STATS.update([f"refused: {type(refusal).__name__}"])
            assert Task.objects.get(pk=self.task.pk).version == before, "a refused write changed the task"
            return None
        after = Task.objects.get(pk=self.task.pk).version
        if after != before:
            assert live, f"agent {agent.name} wrote without a live lease"
            assert after == before + 1, "one write, one version"
            agent.writes.append(after)
        agent.version = after
        return result if result is not None else True

    # --- rules ---------------------------------------------------------------------------------------

    @initialize()
    def first_agent_holds_the_lease(self) -> None:
        self.agents["a"].lease = lease_acquire(task_id=self.task.pk, holder_kind="agent", holder_id="a")

    @rule(
        name=st.sampled_from(["a", "b"]),
        action=st.sampled_from(["acquire", "renew", "renew", "renew_wrong_seq", "release"]),
    )
    def lease_call(self, name: str, action: str) -> None:
        agent = self.agents[name]
        try:
            if action == "acquire":
                agent.lease = lease_acquire(task_id=self.task.pk, holder_kind="agent", holder_id=name)
            elif agent.lease is None:
                return
            elif action == "renew":
                agent.lease = lease_renew(lease=agent.lease, expected_renewal_seq=agent.lease.renewal_seq)
            elif action == "renew_wrong_seq":
                lease_renew(lease=agent.lease, expected_renewal_seq=agent.lease.renewal_seq + 1)
                raise AssertionError("a renewal with the wrong renewal_seq was accepted")
            else:
                lease_release(lease=agent.lease)
        except LeaseError:
            return

    @rule(
        name=st.sampled_from(["a", "b"]),
        mode=MODES,
        crash_at=st.sampled_from(
            ["", "", "", "after_start", "after_start", "after_call", "stall", "stall_before_start", "duplicate"]
        ),
        stale=st.sampled_from([False, False, False, True]),
        seconds=st.sampled_from([0, 0, 1, 2, 5, 13, 31]),
        renew=st.sampled_from([True, True, False]),
    )
    def step(self, name: str, mode: str, crash_at: str, stale: bool, seconds: int, renew: bool) -> None:
        """Time passes; then one turn of the step protocol, possibly cut short by a crash or a stall, possibly
        with a stale version. A stalled agent wakes up and goes on with what it held, without renewing or
        re-reading anything: its writes must be refused if its lease lapsed or the task moved on."""
        self.clock.advance(timedelta(seconds=seconds))
        agent = self.agents[name]
        if agent.lease is None:
            return
        stalled = agent.outcome is not None or agent.held is not None
        if renew and not stalled:
            try:
                agent.lease = lease_renew(lease=agent.lease, expected_renewal_seq=agent.lease.renewal_seq)
            except LeaseError:
                with contextlib.suppress(LeaseError):  # a worker whose lease is gone tries to get one again
                    agent.lease = lease_acquire(task_id=self.task.pk, holder_kind="agent", holder_id=name)
        if agent.outcome is not None:
            self._record(agent, agent.op_key, agent.outcome)
            agent.outcome, agent.op_key = None, ""
            return
        if agent.held is not None:
            directive, agent.held = agent.held, None
        else:
            directive = next_directive(task_id=self.task.pk, lease=agent.lease)
            STATS.update([f"directive: {directive.kind} {directive.reason}"])
            agent.version = directive.task_version - (1 if stale else 0)
        if directive.kind == "reconcile":
            outcome = self.remote.lookup(directive.op_key)
            self._record(agent, directive.op_key, outcome)
            return
        if directive.kind != "execute":
            return
        if crash_at == "stall_before_start":
            agent.held = directive
            return
        cancelled_before = Task.objects.get(pk=self.task.pk).cancel_requested_at is not None
        started_at = agent.version
        # One commit: the operation registered and marked sent (or an intent sent again), before the call.
        op = self._write(
            agent,
            lambda: (
                operation_start(
                    snapshot_at(task_id=self.task.pk, lease=agent.lease, expected_version=started_at),
                    directive.node_key,
                    lease=agent.lease,
                ).operation
            ),
        )
        if not isinstance(op, Operation):
            return agent.crash()
        assert not cancelled_before, "an operation was started after the cancel was recorded"
        if directive.op_key:
            # An intent left by a query that found nothing: sent again under its own op key.
            assert (op.op_key, op.status) == (directive.op_key, OperationStatus.DISPATCHED)
            assert op.dispatch_count > 1
            STATS.update(["start: an intent sent again"])
        else:
            assert op.dispatch_count == 1 and op.op_key not in self.remote.effects
            STATS.update(["start: first send"])
        if crash_at == "after_start":
            # The process dies between the start's commit and the call: a query by op key will find nothing.
            return agent.crash()
        # The call happens outside any transaction; its answer may be lost with a crash before record.
        outcome = self.remote.submit(op.op_key, mode)
        if crash_at == "after_call":
            return agent.crash()
        if crash_at == "stall":
            # The process stalls with the answer in hand and records it later (late_record), maybe too late.
            agent.op_key, agent.outcome = op.op_key, outcome
            return
        recorded_at = agent.version
        recorded = self._record(agent, op.op_key, outcome)
        if crash_at == "duplicate":
            # The same messages delivered twice, with the versions they carried: refused, nothing written.
            lease = agent.lease
            duplicate = self._write(
                agent,
                lambda: (
                    operation_start(
                        snapshot_at(task_id=self.task.pk, lease=lease, expected_version=started_at),
                        directive.node_key,
                        lease=lease,
                    ).operation
                ),
            )
            assert duplicate is None, "a start delivered twice was applied twice"
            duplicate = self._write(
                agent,
                lambda: (
                    record_outcome(
                        snapshot_at(task_id=op.task_id, lease=lease, expected_version=recorded_at),
                        op.op_key,
                        outcome,
                        lease=lease,
                    ).operation
                ),
            )
            assert duplicate is None or recorded is None, "an outcome delivered twice was recorded twice"
            # And the start once more at the version now, as an agent that re-read it: the op key is not sent again.
            again = self._write(
                agent,
                lambda: (
                    operation_start(
                        snapshot_at(task_id=self.task.pk, lease=lease, expected_version=agent.version),
                        directive.node_key,
                        lease=lease,
                    ).operation
                ),
            )
            assert not isinstance(again, Operation) or again.op_key != op.op_key, "the same op key was sent twice"
            if isinstance(again, Operation):  # a new attempt (a retry the rules allow): never called, as a crash
                return agent.crash()
            self._record(agent, op.op_key, outcome)

    def _record(self, agent: Agent, op_key: str, outcome: Outcome) -> Any:
        lease = agent.lease
        assert lease is not None
        return self._write(
            agent,
            lambda: (
                record_outcome(
                    snapshot_at(
                        task_id=Operation.objects.get(op_key=op_key).task_id,
                        lease=lease,
                        expected_version=agent.version,
                    ),
                    op_key,
                    outcome,
                    lease=lease,
                ).operation
            ),
        )

    # Rare (1 in 50 draws, away from the bounds hypothesis favours): a cancel ends the interesting part of a run.
    # Asked by the agent that created the task, or by an agent holding (or having held) the task's lease.
    @rule(now=st.integers(min_value=0, max_value=49).map(lambda n: n == 17), by=st.sampled_from(["creator", "a", "b"]))
    def cancel(self, now: bool, by: str) -> None:
        if not now:
            return
        if by == "creator":
            task_request_cancel(task_id=self.task.pk, actor=CREATOR, reason="stateful test")
            return
        agent = self.agents[by]
        if agent.lease is None:
            return
        live = self._lease_is_live(agent)
        before = Task.objects.get(pk=self.task.pk).version
        try:
            task_request_cancel(
                task_id=self.task.pk, actor=Principal.agent(by), reason="the holder gives up", lease=agent.lease
            )
        except (TaskError, LeaseError) as refusal:
            STATS.update([f"holder's cancel refused: {type(refusal).__name__}"])
            assert not live, f"the live lease holder's cancel was refused: {refusal}"
            assert Task.objects.get(pk=self.task.pk).version == before
            return
        if Task.objects.get(pk=self.task.pk).version != before:
            assert live, f"agent {by} cancelled without a live lease"
            STATS.update(["holder's cancel recorded"])

    # --- invariants ----------------------------------------------------------------------------------

    @invariant()
    def no_duplicate_side_effects(self) -> None:
        """Invariant 1: at most one external write per op key, and per node."""
        assert all(count == 1 for count in self.remote.effects.values()), self.remote.effects
        per_node = Counter(
            Operation.objects.filter(op_key__in=list(self.remote.effects)).values_list("node_id", flat=True)
        )
        assert all(count == 1 for count in per_node.values()), per_node

    @invariant()
    def no_skipped_steps(self) -> None:
        """Invariant 2: succeeded only with a persisted receipt that satisfies the evidence, in dependency order."""
        nodes = {n.key: n for n in Node.objects.filter(task_id=self.task.pk)}
        for node in nodes.values():
            if node.status != NodeStatus.SUCCEEDED:
                continue
            op = Operation.objects.get(node=node, status=OperationStatus.COMMITTED)
            receipt = Receipt.objects.get(operation=op)
            assert evidence_problems(node, op, receipt) == []
            assert op.op_key in self.remote.committed, "succeeded without a real external commit"
            assert all(nodes[dep].status == NodeStatus.SUCCEEDED for dep in node.depends_on)

    @invariant()
    def one_authority(self) -> None:
        """Invariant 3: the two agents never both wrote the same version, and writes only grow."""
        a, b = self.agents["a"].writes, self.agents["b"].writes
        assert not set(a) & set(b)
        assert a == sorted(a) and b == sorted(b)

    @invariant()
    def cancel_stops_new_side_effects(self) -> None:
        """Invariant 6: no operation registered, and none sent (again), after the cancel; no intent survives it;
        commits after it are flagged, never undone."""
        task = Task.objects.get(pk=self.task.pk)
        if task.cancel_requested_at is None:
            return
        assert not Operation.objects.filter(task=task, registered_at__gt=task.cancel_requested_at).exists()
        cancelled_at = Event.objects.get(task=task, type="cancel_requested").seq
        assert not Event.objects.filter(task=task, type="operation_dispatched", seq__gt=cancelled_at).exists()
        assert not Operation.objects.filter(task=task, status=OperationStatus.INTENT).exists()
        assert task.status in (TaskStatus.STOPPING, TaskStatus.STOPPED_PENDING, TaskStatus.STOPPED)
        for receipt in Receipt.objects.filter(operation__task=task, received_at__gt=task.cancel_requested_at):
            assert receipt.committed_after_cancel_request

    @invariant()
    def log_is_the_truth(self) -> None:
        """Invariant 7: contiguous, hash-chained events that rebuild the stored projection."""
        task = Task.objects.get(pk=self.task.pk)
        assert find_log_problem(task) is None

    @invariant()
    def budgets_are_persisted(self) -> None:
        """Invariant 10: attempts counted in the database match the operations started — the first send of an op
        key is an attempt, sending it again after a query found nothing is not — within the budgets; every send
        is logged."""
        task = Task.objects.get(pk=self.task.pk)
        total = sends = 0
        for node in Node.objects.filter(task=task):
            counts = list(Operation.objects.filter(node=node).values_list("dispatch_count", flat=True))
            assert all(count >= 1 for count in counts), "an operation exists that was never started as sent"
            assert node.attempts == len(counts)
            assert node.attempts <= node.max_attempts
            assert (node.last_attempt_at is not None) == (node.attempts > 0)
            total += len(counts)
            sends += sum(counts)
        assert task.attempts_used == total <= task.attempt_budget
        assert Event.objects.filter(task=task, type="operation_dispatched").count() == sends

    def teardown(self) -> None:
        """Unknowns are eventually settled: a fresh agent, after every old lease lapsed, settles them all."""
        before = Task.objects.get(pk=self.task.pk)
        STATS.update([f"before recovery: {before.status} {before.status_reason}".strip()])
        writes = len(self.agents["a"].writes) + len(self.agents["b"].writes)
        STATS.update([f"agent writes before recovery: {'0' if not writes else '1-9' if writes < 10 else '10+'}"])
        done = Node.objects.filter(task=before, status=NodeStatus.SUCCEEDED).count()
        STATS.update([f"nodes succeeded before recovery: {done}"])
        unknown = Operation.objects.filter(task=before, status=OperationStatus.UNKNOWN).count()
        STATS.update([f"unknown operations left for recovery: {unknown}"])
        self.clock.advance(settings.RECKON_LEASE_TTL + settings.RECKON_LEASE_GRACE + timedelta(seconds=1))
        lease = lease_acquire(task_id=self.task.pk, holder_kind="agent", holder_id="recovery")
        for _ in range(60):
            directive = next_directive(task_id=self.task.pk, lease=lease)
            if directive.kind == "reconcile":
                outcome = self.remote.lookup(directive.op_key)
                record_outcome(
                    snapshot_at(task_id=self.task.pk, lease=lease, expected_version=directive.task_version),
                    directive.op_key,
                    outcome,
                    lease=lease,
                )
            elif directive.kind == "execute":
                v = directive.task_version
                op = operation_start(
                    snapshot_at(task_id=self.task.pk, lease=lease, expected_version=v), directive.node_key, lease=lease
                ).operation
                assert not directive.op_key or op.op_key == directive.op_key
                record_outcome(
                    snapshot_at(task_id=op.task_id, lease=lease, expected_version=v + 1),
                    op.op_key,
                    self.remote.submit(op.op_key, "commit"),
                    lease=lease,
                )
            elif directive.kind == "wait":
                assert directive.until is not None
                self.clock.set(directive.until)
            else:
                break
            lease = lease_renew(lease=lease, expected_renewal_seq=lease.renewal_seq)
        task = Task.objects.get(pk=self.task.pk)
        assert not Operation.objects.filter(
            task=task, status__in=[OperationStatus.DISPATCHED, OperationStatus.ACCEPTED, OperationStatus.UNKNOWN]
        ).exists(), "an operation was left unsettled"
        assert task.status in (
            TaskStatus.COMPLETED,
            TaskStatus.STOPPED,
            TaskStatus.PAUSED,
            TaskStatus.FAILED,
        ), task.status
        STATS.update([f"after recovery: {task.status} {task.status_reason}".strip()])
        self.no_duplicate_side_effects()
        self.no_skipped_steps()
        self.log_is_the_truth()


@pytest.mark.django_db
def test_random_protocol_sequences_keep_the_invariants(clock: ControllableClock) -> None:
    ProtocolMachine.clock = clock
    run_state_machine_as_test(
        ProtocolMachine,
        settings=hsettings(
            # CI size; RECKON_STATEFUL_EXAMPLES=500 for a deeper run.
            max_examples=int(os.environ.get("RECKON_STATEFUL_EXAMPLES", "30")),
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    for line, count in sorted(STATS.items()):
        print(f"{count:4d}  {line}")
    assert STATS["after recovery: completed"] > 0, "no example reached completion"
