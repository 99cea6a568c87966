"""A hypothesis state machine over one task's lease: two agents, two operators and an admin, on a controllable
database clock.

Agents acquire, renew (with the right and a wrong renewal_seq), release, and try to write — compare_and_set and
the step protocol — with whatever lease they last held, stale or not. Operators claim the task, renew, release and
submit ``resume_agent``. An admin (or an operator pretending to be one) force-releases. Time jumps, among others
exactly to a lease's expiry and to the end of its grace. Each rule checks its own outcome against a model of
DESIGN §7; after every step the invariants below hold:

- at most one open lease per task, and the lease epochs are 1, 2, 3… in the order of the grants;
- at every instant at most one principal can advance the task: a harmless compare_and_set is tried with each
  principal's lease (and every earlier lease) in a savepoint that is rolled back; at most one lands, and only
  with the open, unexpired lease; every stale epoch is refused;
- a pending takeover blocks every agent grant, and so does a task people hold (``human``); a live takeover lease
  means the task shows ``human``;
- a write that lands extends its writer's lease by the lease's ttl (a write is a heartbeat); a refused one does not;
- every grant, forced release and lapsed takeover has its audit row; the audit chain and the task's log verify.

Each example runs in a savepoint rolled back at its end, so the audit chain each one verifies stays short.
"""

import os
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from django.conf import settings
from django.db import transaction
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import verify_audit
from leases.clock import ControllableClock
from leases.errors import (
    LeaseError,
    LeaseExpired,
    LeaseHeld,
    LeaseLost,
    LeaseRefused,
    LeaseReserved,
    RenewalOutOfOrder,
)
from leases.models import ForcedRelease, HolderKind, Lease, ReleaseReason
from leases.services import (
    lease_acquire,
    lease_open,
    lease_release,
    lease_renew,
    lease_reservation,
    operator_ttl,
)
from leases.state import lease_grace
from tasks.access.permissions import ADMIN, OPERATOR, PermissionDenied, permission_grant
from tasks.core.errors import InvalidTransition, TakeoverHeld, TaskError, VersionConflict
from tasks.core.lifecycle import TERMINAL_TASK_STATUSES, ChangeKind, NodeStatus, OperationStatus, TaskStatus
from tasks.core.outcomes import Committed, NotFound
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.engine.events import find_log_problem
from tasks.engine.plans import task_create
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Node, Operation, Task
from tasks.people.forced_release import MIN_FORCE_TEXT, TakeoverRefused, lease_force_release
from tasks.people.takeover import takeover_claim, takeover_release, takeover_renew, takeover_submit
from tests.conftest import chain_plan, person

KIND = "stateful-leases"
AGENTS = ("a", "b")
OPERATORS = ("ann", "bob")
NODES = tuple(f"n{i}" for i in range(8))
JUSTIFICATION = "the agent worker is wedged and holds the task"
IMPACT = "its in-flight operation is reconciled by op key"
PROBED_STALE = 6  # earlier leases probed after every step, besides each principal's own

# What the examples reached, printed at the end (pytest -s): a machine that never gets anywhere proves nothing.
STATS: Counter[str] = Counter()
REACHED: Counter[str] = Counter()


class Rollback(Exception):
    """Raised inside a savepoint to undo a probe write."""


def probe(event: str, status: str) -> Change:
    """A harmless change that the permit table lets the task's holder make in ``status``: a settlement while the
    task is not ended (an agent's, or a person's while they hold it), a cleanup once it has ended."""
    return Change(event=event, kind=ChangeKind.CLEANUP if status in TERMINAL_TASK_STATUSES else ChangeKind.SETTLE)


class LeaseMachine(RuleBasedStateMachine):
    clock: ClassVar[ControllableClock]
    people: ClassVar[dict[str, Principal]]

    def __init__(self) -> None:
        super().__init__()
        self._example = transaction.atomic()
        self._example.__enter__()
        self.task = task_create(
            kind=KIND, title="lease machine", plan=chain_plan(*NODES), created_by="machine", attempt_budget=80
        )
        self.leases: dict[str, Lease | None] = dict.fromkeys(AGENTS + OPERATORS)
        self.granted: list[Lease] = []
        self.reached: set[str] = set()

    # --- helpers -------------------------------------------------------------------------------------

    def _version(self) -> int:
        return Task.objects.values_list("version", flat=True).get(pk=self.task.pk)

    def _when(self, lease: Lease) -> str:
        now = self.clock.now()
        return " exactly at expiry" if now == lease.expires_at else " in grace" if now > lease.expires_at else ""

    def _open(self, lease: Lease) -> bool:
        return Lease.objects.filter(pk=lease.pk, released_at__isnull=True).exists()

    def _live(self, lease: Lease) -> bool:
        """Open, not expired on the database clock: the only lease whose holder may advance the task."""
        return Lease.objects.filter(pk=lease.pk, released_at__isnull=True, expires_at__gt=self.clock.now()).exists()

    def _renewable(self, lease: Lease) -> bool:
        return Lease.objects.filter(
            pk=lease.pk,
            released_at__isnull=True,
            renewal_seq=lease.renewal_seq,
            expires_at__gt=self.clock.now() - lease_grace(),
        ).exists()

    def _blocking(self) -> Lease | None:
        """The open lease nobody else may take: live, or expired but inside its grace."""
        return Lease.objects.open().filter(task=self.task, expires_at__gt=self.clock.now() - lease_grace()).first()

    def _granted(self, name: str, lease: Lease) -> None:
        previous = self.granted[-1].epoch if self.granted else 0
        assert lease.epoch == previous + 1, f"epoch {lease.epoch} granted after {previous}"
        assert lease.granted_at == self.clock.now() and lease.renewal_seq == 0
        self.granted.append(lease)
        self.leases[name] = lease

    def _refused(self, what: str, refusal: Exception) -> None:
        STATS[f"{what}: {type(refusal).__name__}"] += 1

    def _unchanged(self, call: Callable[[], Any], what: str) -> Exception:
        """Run a call that must be refused, and check the refusal wrote nothing."""
        before = self._footprint()
        try:
            call()
        except (TaskError, LeaseError) as refusal:
            assert self._footprint() == before, f"{what}: the refusal changed something"
            self._refused(what, refusal)
            return refusal
        raise AssertionError(f"{what} was accepted")

    def _footprint(self) -> tuple[Any, ...]:
        leases = tuple(Lease.objects.filter(task=self.task).order_by("pk").values_list())
        reservation = lease_reservation(self.task.pk)
        return self._version(), leases, reservation and reservation.holder_id, AuditEvent.objects.count()

    # --- agents --------------------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(AGENTS),
        action=st.sampled_from(["acquire", "acquire", "renew", "renew", "renew_wrong_seq", "renew_old_seq", "release"]),
    )
    def agent_lease(self, name: str, action: str) -> None:
        if action == "acquire" or self.leases[name] is None:
            self.agent_acquires(name)
        elif action == "release":
            self.agent_releases(name)
        else:
            self.agent_renews(name, seq_offset={"renew": 0, "renew_wrong_seq": 1, "renew_old_seq": -1}[action])

    def agent_acquires(self, name: str) -> None:
        reserved = lease_reservation(self.task.pk) is not None
        free = self._blocking() is None
        with_people = Task.objects.get(pk=self.task.pk).status == TaskStatus.HUMAN
        try:
            lease = lease_acquire(task_id=self.task.pk, holder_kind=HolderKind.AGENT, holder_id=name)
        except (LeaseHeld, LeaseReserved, LeaseRefused) as refusal:
            assert not free or reserved or with_people, f"agent {name} was refused a free task: {refusal}"
            if free:  # a person waits for the task first; else people hold it (no agent lease while it is human)
                assert isinstance(refusal, LeaseReserved if reserved else LeaseRefused), refusal
            else:
                assert isinstance(refusal, LeaseHeld), refusal
            self._refused("agent acquire", refusal)
            return
        assert not reserved, f"agent {name} was granted the lease while a person waited to take over"
        assert free, f"agent {name} was granted the lease while another holder was inside its grace"
        assert not with_people, f"agent {name} was granted the lease while people hold the task"
        self._granted(name, lease)
        STATS["agent acquire: granted"] += 1

    def agent_renews(self, name: str, seq_offset: int) -> None:
        lease = self.leases[name]
        if lease is None:
            return
        renewable = self._renewable(lease) and seq_offset == 0
        try:
            renewed = lease_renew(lease=lease, expected_renewal_seq=lease.renewal_seq + seq_offset)
        except (LeaseLost, LeaseExpired, RenewalOutOfOrder) as refusal:
            assert not renewable, f"agent {name}'s renewal was refused: {refusal}"
            if seq_offset and self._open(lease):
                assert isinstance(refusal, RenewalOutOfOrder), refusal
            self._refused("agent renew", refusal)
            return
        assert renewable, f"agent {name} renewed {'with a wrong renewal_seq' if seq_offset else 'a lapsed lease'}"
        assert renewed.epoch == lease.epoch and renewed.renewal_seq == lease.renewal_seq + 1
        assert renewed.expires_at == self.clock.now() + settings.RECKON_LEASE_TTL
        self.leases[name] = renewed
        STATS[f"agent renew: renewed{self._when(lease)}"] += 1

    def agent_releases(self, name: str) -> None:
        lease = self.leases[name]
        if lease is None:
            return
        was_open = self._open(lease)
        try:
            released = lease_release(lease=lease)
        except LeaseLost as refusal:
            assert not was_open
            self._refused("agent release", refusal)
            return
        assert was_open and released.release_reason == ReleaseReason.RELEASED

    @rule(
        name=st.sampled_from(AGENTS),
        write=st.sampled_from(["compare_and_set", "start", "start", "not_found", "record"]),
        stale_version=st.sampled_from([False, False, False, True]),
    )
    def agent_writes(self, name: str, write: str, stale_version: bool) -> None:
        """The agent writes with the lease it last held, whatever became of it since: a probe, the start of the
        next node (or of an intent, sent again), or what a query by op key said of a sent operation — nothing
        (an intent to send again) or a receipt."""
        lease = self.leases[name]
        if lease is None:
            return
        version = self._version() - (1 if stale_version else 0)
        call = self._agent_write(lease, write, version)
        if call is not None:
            self._agent_call(name, lease, write, call, stale_version=stale_version)

    @rule(name=st.sampled_from(AGENTS), answer=st.sampled_from(["committed", "committed", "not_found"]))
    def agent_follows_its_directive(self, name: str, answer: str) -> None:
        """A well-behaved agent: it reads the directive with its lease and does what it says at once — start the
        node (or send an intent again), or record what the query by op key answered. A directive never sends the
        agent into a refusal: it tells a holder whose lease is gone to stop."""
        lease = self.leases[name]
        if lease is None:
            return
        task_id = self.task.pk
        d = next_directive(task_id=task_id, lease=lease)
        if d.kind == "execute":
            node_key = d.node_key

            def call() -> Any:
                return operation_start(
                    snapshot_at(task_id=task_id, lease=lease, expected_version=d.task_version), node_key, lease=lease
                ).operation

        elif d.kind == "reconcile" and d.op_key:
            op_key = d.op_key
            outcome = NotFound() if answer == "not_found" else Committed(remote_id=f"r-{op_key}")

            def call() -> Any:
                return record_outcome(
                    snapshot_at(
                        task_id=Operation.objects.get(op_key=op_key).task_id,
                        lease=lease,
                        expected_version=d.task_version,
                    ),
                    op_key,
                    outcome,
                    lease=lease,
                ).operation

        else:
            STATS[f"agent directive: {d.kind} {d.reason}"] += 1
            return
        assert self._live(lease), f"agent {name} was directed to {d.kind} with a lease that is not live"
        what = f"directed {d.kind}" + (f" ({answer})" if d.kind == "reconcile" else " again" if d.op_key else "")
        assert self._agent_call(name, lease, what, call, stale_version=False), f"{what} was refused"

    def _agent_call(self, name: str, lease: Lease, write: str, call: Callable[[], Any], *, stale_version: bool) -> bool:
        """Run an agent's write and check it against the model: it lands only with the live lease and the version
        now, moves the version by one and extends the lease by its ttl; a refusal changes neither. Landed?"""
        live = self._live(lease)
        before = self._version()
        expires_at = Lease.objects.values_list("expires_at", flat=True).get(pk=lease.pk)
        try:
            call()
        except (TaskError, LeaseError) as refusal:
            assert self._version() == before, f"a refused {write} changed the task"
            assert Lease.objects.get(pk=lease.pk).expires_at == expires_at, f"a refused {write} extended the lease"
            self._refused(f"agent {write}", refusal)
            if live and not stale_version:
                STATS[f"agent {write} with a live lease refused: {type(refusal).__name__}"] += 1
            return False
        after = self._version()
        assert live, f"agent {name} wrote with epoch {lease.epoch}, which is not the live lease"
        assert not stale_version and after == before + 1, f"agent {write}: v{before} -> v{after}"
        # A write is a heartbeat: it extends the writer's lease by its ttl (never shortens it).
        assert lease.ttl is not None
        extended = Lease.objects.get(pk=lease.pk).expires_at
        assert extended == max(expires_at, self.clock.now() + lease.ttl), f"agent {write} left the lease at {extended}"
        STATS[f"agent {write}: written{self._when(lease)}"] += 1
        return True

    def _agent_write(self, lease: Lease, write: str, version: int) -> Callable[[], Any] | None:
        task_id = self.task.pk
        if write == "compare_and_set":
            status = Task.objects.get(pk=task_id).status
            return lambda: compare_and_set(task_id, version, probe("agent_probe", status), lease=lease)
        if write == "start":
            intent = Operation.objects.filter(task_id=task_id, status=OperationStatus.INTENT).first()
            node = (
                intent.node
                if intent is not None
                else Node.objects.filter(task_id=task_id)
                .exclude(status=NodeStatus.SUCCEEDED)
                .order_by("position")
                .first()
            )
            if node is None:
                return None
            return lambda: (
                operation_start(
                    snapshot_at(task_id=task_id, lease=lease, expected_version=version), node.key, lease=lease
                ).operation
            )
        op = Operation.objects.filter(task_id=task_id, status=OperationStatus.DISPATCHED).first()
        if op is None:
            return None
        outcome = NotFound() if write == "not_found" else Committed(remote_id=f"r-{op.op_key}")
        return lambda: (
            record_outcome(
                snapshot_at(task_id=op.task_id, lease=lease, expected_version=version), op.op_key, outcome, lease=lease
            ).operation
        )

    # --- operators -----------------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(OPERATORS),
        action=st.sampled_from(
            [
                *("claim", "claim", "renew", "renew", "renew_wrong_seq", "renew_as_other"),
                *("release", "submit", "submit", "submit_stale_form"),
            ]
        ),
    )
    def operator(self, name: str, action: str) -> None:
        """A person acts; one who holds no lease yet claims the task."""
        if action == "claim" or self.leases[name] is None:
            self.operator_claims(name)
        elif action.startswith("renew"):
            self.operator_renews(name, seq_offset=int(action == "renew_wrong_seq"), impostor=action == "renew_as_other")
        elif action == "release":
            self.operator_releases(name)
        else:
            self.operator_submits(name, stale_form=action == "submit_stale_form")

    def operator_claims(self, name: str) -> None:
        actor = self.people[name]
        blocking = self._blocking()
        reservation = lease_reservation(self.task.pk)
        waiting_for = reservation.holder_id if reservation else None
        grants_before = AuditEvent.objects.filter(task_id=self.task.pk, action="takeover_granted").count()
        if Task.objects.get(pk=self.task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
            self._unchanged(lambda: takeover_claim(actor=actor, task_id=self.task.pk), "claim of an ended task")
            return
        try:
            claim = takeover_claim(actor=actor, task_id=self.task.pk)
        except (TakeoverHeld, LeaseReserved) as refusal:
            other_holds = blocking is not None and blocking.holder_kind == "operator" and blocking.holder_id != name
            other_waits = waiting_for not in (None, name)
            assert other_holds or other_waits, f"{name}'s claim was refused: {refusal}"
            self._refused("operator claim", refusal)
            return
        if blocking is None or (blocking.holder_kind, blocking.holder_id) == ("operator", name):
            assert waiting_for in (None, name), f"{name} was granted the task {waiting_for} waited for"
            assert claim.granted and claim.lease is not None
            assert lease_reservation(self.task.pk) is None
            grants = AuditEvent.objects.filter(task_id=self.task.pk, action="takeover_granted").count()
            if blocking is None:
                self._granted(name, claim.lease)
                assert grants == grants_before + 1
                STATS["operator claim: granted"] += 1
            else:
                # Claiming again is how a reconnecting browser renews: same lease, same epoch, one renewal more.
                assert claim.lease.pk == blocking.pk and grants == grants_before
                assert claim.lease.renewal_seq == blocking.renewal_seq + 1
                self.leases[name] = claim.lease
                STATS["operator claim: already held"] += 1
            assert Task.objects.get(pk=self.task.pk).status == TaskStatus.HUMAN
            self.reached.add("human")
            return
        assert blocking.holder_kind == "agent", f"{name} was told to wait for {blocking.holder_id}"
        assert not claim.granted and claim.waiting_for == f"agent:{blocking.holder_id}"
        assert lease_reservation(self.task.pk) is not None
        assert lease_open(self.task.pk) == blocking, "a claim while an agent holds the task must not take its lease"
        self.reached.add("reserved")
        STATS["operator claim: waiting for the agent"] += 1

    def operator_renews(self, name: str, seq_offset: int, impostor: bool) -> None:
        lease = self.leases[name]
        if lease is None:
            return
        actor = self.people[next(o for o in OPERATORS if o != name) if impostor else name]
        if impostor:
            refusal = self._unchanged(
                lambda: takeover_renew(actor=actor, lease=lease, expected_renewal_seq=lease.renewal_seq),
                "renewal of another person's lease",
            )
            assert isinstance(refusal, PermissionDenied)
            return
        renewable = self._renewable(lease) and seq_offset == 0
        audit_rows = AuditEvent.objects.count()
        try:
            renewed = takeover_renew(actor=actor, lease=lease, expected_renewal_seq=lease.renewal_seq + seq_offset)
        except LeaseError as refusal:
            assert not renewable, f"{name}'s renewal was refused: {refusal}"
            assert AuditEvent.objects.count() == audit_rows
            self._refused("operator renew", refusal)
            return
        assert renewable, f"{name} renewed {'with a wrong renewal_seq' if seq_offset else 'a lapsed lease'}"
        assert renewed.expires_at == self.clock.now() + operator_ttl()
        # A renewal is the browser's heartbeat: not audited row by row (the claim, release and expiry are).
        assert AuditEvent.objects.count() == audit_rows
        self.leases[name] = renewed
        STATS[f"operator renew: renewed{self._when(lease)}"] += 1

    def operator_releases(self, name: str) -> None:
        lease = self.leases[name]
        if lease is None:
            return
        was_open = self._open(lease)
        status = Task.objects.get(pk=self.task.pk).status
        try:
            takeover_release(actor=self.people[name], lease=lease, reason="stepping away")
        except LeaseLost as refusal:
            assert not was_open
            self._refused("operator release", refusal)
            return
        assert was_open
        assert Task.objects.get(pk=self.task.pk).status == status, "a release without a decision changed the task"
        STATS["operator release: released"] += 1

    def operator_submits(self, name: str, stale_form: bool) -> None:
        """The person hands the task back to the agents (resume_agent), on the version their form showed."""
        lease = self.leases[name]
        if lease is None:
            return
        version = self._version() - (1 if stale_form else 0)
        accepted = self._live(lease) and not stale_form
        actor = self.people[name]

        def submit() -> Task:
            return takeover_submit(
                actor=actor, lease=lease, based_on_version=version, decision="resume_agent", note="checked by hand"
            )

        if not accepted:
            refusal = self._unchanged(submit, "operator submit")
            assert isinstance(refusal, VersionConflict | LeaseLost | LeaseExpired | InvalidTransition), refusal
            assert stale_form or not isinstance(refusal, VersionConflict)
            # InvalidTransition: a lease already given back by a first submit meets "pending cannot become
            # pending" before its lease check (see the focused test at the end of this file).
            assert not isinstance(refusal, InvalidTransition) or not self._open(lease)
            return
        task = submit()
        assert task.status == TaskStatus.PENDING and task.version == version + 1
        assert Lease.objects.get(pk=lease.pk).release_reason == ReleaseReason.RELEASED
        STATS["operator submit: resume_agent"] += 1

    # --- the admin and time --------------------------------------------------------------------------

    @precondition(lambda self: lease_open(self.task.pk) is not None)
    @rule(actor=st.sampled_from(["root", "root", "root", "ann"]), justified=st.sampled_from([True, True, True, False]))
    def force_release(self, actor: str, justified: bool) -> None:
        """An admin removes whoever holds the lease; without a justification, or as an operator, it is refused."""
        holder = lease_open(self.task.pk)
        justification = JUSTIFICATION if justified else "stuck"
        assert len(JUSTIFICATION) >= MIN_FORCE_TEXT > len("stuck")

        def force() -> ForcedRelease:
            return lease_force_release(
                actor=self.people[actor], task_id=self.task.pk, justification=justification, impact=IMPACT
            )

        if actor != "root" or not justified or holder is None:
            refusal = self._unchanged(force, "forced release")
            expected = PermissionDenied if actor != "root" else TakeoverRefused
            assert isinstance(refusal, expected), refusal
            return
        forced = force()
        assert forced.epoch == holder.epoch and forced.removed_holder == f"{holder.holder_kind}:{holder.holder_id}"
        assert Lease.objects.get(pk=holder.pk).release_reason == ReleaseReason.FORCED
        assert lease_open(self.task.pk) is None
        self.reached.add("forced")
        STATS[f"forced release of an {holder.holder_kind}"] += 1

    @rule(
        to=st.sampled_from(
            ["tick", "second", "before_expiry", "expiry", "after_expiry", "grace_end", "after_grace_end", "minutes"]
        )
    )
    def time_passes(self, to: str) -> None:
        """Move the database clock, to the microsecond around the open lease's expiry and its grace's end."""
        tick = timedelta(microseconds=1)
        lease = lease_open(self.task.pk)
        now = self.clock.now()
        if lease is None or to in ("tick", "second", "minutes"):
            step = {"tick": tick, "second": timedelta(seconds=1), "minutes": timedelta(minutes=3)}.get(to, tick)
            self.clock.advance(step)
        else:
            target = {
                "before_expiry": lease.expires_at - tick,
                "expiry": lease.expires_at,
                "after_expiry": lease.expires_at + tick,
                "grace_end": lease.expires_at + lease_grace(),
                "after_grace_end": lease.expires_at + lease_grace() + tick,
            }[to]
            self.clock.set(max(target, now + tick))
        if lease is not None and self.clock.now() >= lease.expires_at:
            self.reached.add("expired")
            STATS[f"time: {to}, open lease expired"] += 1

    # --- invariants ----------------------------------------------------------------------------------

    @invariant()
    def one_open_lease_and_growing_epochs(self) -> None:
        rows = list(Lease.objects.filter(task=self.task).order_by("pk"))
        assert sum(row.released_at is None for row in rows) <= 1
        assert [row.epoch for row in rows] == list(range(1, len(rows) + 1))
        assert [row.pk for row in rows] == [lease.pk for lease in self.granted]
        if any(row.release_reason == ReleaseReason.EXPIRED for row in rows):
            self.reached.add("lapsed")

    @invariant()
    def at_most_one_principal_can_advance(self) -> None:
        """Try a harmless write with every lease anyone holds or held, each in a savepoint rolled back."""
        candidates = {lease.pk: lease for lease in self.granted[-PROBED_STALE:]}
        candidates |= {lease.pk: lease for lease in self.leases.values() if lease is not None}
        version = self._version()
        landed = []
        status = Task.objects.get(pk=self.task.pk).status
        for lease in candidates.values():
            try:
                with transaction.atomic():
                    compare_and_set(self.task.pk, version, probe("authority_probe", status), lease=lease)
                    raise Rollback
            except Rollback:
                landed.append(lease)
            except (LeaseLost, LeaseExpired):
                pass
        assert self._version() == version, "a probe was not rolled back"
        live = Lease.objects.open().filter(task=self.task, expires_at__gt=self.clock.now()).first()
        assert len(landed) <= 1, f"epochs {[lease.epoch for lease in landed]} could all advance the task"
        assert [lease.pk for lease in landed] == ([live.pk] if live is not None else []), (
            f"the open, unexpired lease is {live}; the probes that landed were {landed}"
        )
        if live is not None and live.holder_kind == HolderKind.OPERATOR:
            assert Task.objects.get(pk=self.task.pk).status == TaskStatus.HUMAN
        for name in AGENTS:
            held = self.leases[name]
            if held is not None and live is not None and held.pk == live.pk:
                directive = next_directive(task_id=self.task.pk, lease=held)
                if Task.objects.get(pk=self.task.pk).status == TaskStatus.HUMAN:
                    assert (directive.kind, directive.reason) == ("stop", "human_takeover")
                elif lease_reservation(self.task.pk) is not None:
                    assert directive.kind in ("stop", "reconcile"), directive
                    assert directive.kind == "reconcile" or directive.reason == "takeover_requested", directive

    @invariant()
    def a_pending_takeover_blocks_every_agent_grant(self) -> None:
        reservation = lease_reservation(self.task.pk)
        if reservation is None:
            return
        self.reached.add("reserved")
        later = Lease.objects.filter(task=self.task, granted_at__gt=reservation.requested_at)
        assert not later.exists(), f"{list(later)} granted while operator {reservation.holder_id} waited"
        holder = lease_open(self.task.pk)
        assert holder is None or holder.holder_kind == HolderKind.AGENT

    @invariant()
    def every_decision_is_audited(self) -> None:
        task_id = self.task.pk
        actions = Counter(AuditEvent.objects.filter(task_id=task_id).values_list("action", flat=True))
        operator_leases = Lease.objects.filter(task_id=task_id, holder_kind=HolderKind.OPERATOR)
        assert actions["takeover_granted"] == operator_leases.count()
        assert actions["lease_forced_release"] == ForcedRelease.objects.filter(task_id=task_id).count()
        assert actions["takeover_expired"] == operator_leases.filter(release_reason=ReleaseReason.EXPIRED).count()
        assert actions["takeover_result_submitted"] <= actions["takeover_granted"]
        verdict = verify_audit()
        assert verdict.problem is None, verdict.problem
        task = Task.objects.get(pk=task_id)
        assert find_log_problem(task) is None
        if task.status == TaskStatus.HUMAN:
            self.reached.add("human")

    def teardown(self) -> None:
        try:
            for state in self.reached:
                REACHED[state] += 1
            REACHED["examples"] += 1
        finally:
            transaction.set_rollback(True)
            self._example.__exit__(None, None, None)


@pytest.mark.django_db
def test_random_lease_and_takeover_sequences_keep_one_authority(clock: ControllableClock) -> None:
    root = person("root", ADMIN)
    people = {"root": root, **{name: person(name, OPERATOR) for name in OPERATORS}}
    for name in OPERATORS:
        permission_grant(actor=root, user=people[name].user, kind=KIND)
    LeaseMachine.clock = clock
    LeaseMachine.people = people
    STATS.clear()
    REACHED.clear()
    run_state_machine_as_test(
        LeaseMachine,
        settings=hsettings(
            # CI size; RECKON_STATEFUL_EXAMPLES=500 for a deeper run.
            max_examples=int(os.environ.get("RECKON_STATEFUL_EXAMPLES", "30")),
            stateful_step_count=35,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    print()
    for line, count in sorted(STATS.items()):
        print(f"{count:5d}  {line}")
    examples = REACHED.pop("examples")
    print(f"examples={examples}; examples that reached each state: {dict(sorted(REACHED.items()))}")
    assert REACHED["human"] > 0, "no example took the task over"
    assert REACHED["forced"] > 0, "no example force-released a lease"


@pytest.mark.django_db
def test_a_takeover_result_submitted_twice_is_refused_as_a_lost_lease(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    """The second submit of a result (a double click, a retried request) carries the lease the first one gave
    back. It must be refused as LeaseLost — the refusal that tells a writer its authority is gone — and not as
    "task cannot go from pending to pending": compare_and_set judges the transition before the lease."""
    task = make_task()
    ann = person("ann", ADMIN)
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert claim.lease is not None
    first = Task.objects.get(pk=task.pk).version
    takeover_submit(actor=ann, lease=claim.lease, based_on_version=first, decision="resume_agent", note="done")
    again = Task.objects.get(pk=task.pk).version
    with pytest.raises(LeaseLost):
        takeover_submit(actor=ann, lease=claim.lease, based_on_version=again, decision="resume_agent", note="done")
