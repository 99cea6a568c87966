"""Agent leases: acquire, renew, release. Every write is a conditional UPDATE or a constrained INSERT.

Times come from ``leases.clock`` (the database server's clock). Human takeover and forced release
build on the same rows (tasks/people/takeover.py, tasks/people/forced_release.py).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.errors import LeaseError, LeaseExpired, LeaseHeld, LeaseLost, LeaseRefused, LeaseReserved, RenewalOutOfOrder
from leases.models import HolderKind, Lease, LeaseReservation, ReleaseReason
from leases.state import held_q, lapsed_q, live_q, live_sql


def _checked_ttl(ttl: timedelta | None) -> timedelta:
    if ttl is None:
        return lease_ttl()
    if ttl <= timedelta(0):
        raise ValueError(f"a lease ttl must be positive, not {ttl}")
    return ttl


def lease_ttl() -> timedelta:
    ttl: timedelta = settings.RECKON_LEASE_TTL
    return ttl


def _task_state(task_id: int) -> tuple[int, str]:
    task_model = Lease._meta.get_field("task").related_model
    if task_model is None or isinstance(task_model, str):  # pragma: no cover - apps not loaded
        raise LookupError("the task model is not loaded")
    row = task_model._default_manager.filter(pk=task_id).values_list("version", "status").first()
    if row is None:
        raise LookupError(f"task {task_id} does not exist")
    return int(row[0]), str(row[1])


# The task statuses in which an agent may not be granted a lease. leases knows nothing of task statuses: the
# tasks app sets this at start-up from its one table (tasks.core.lifecycle.AGENT_LEASABLE).
_agent_barred: frozenset[str] = frozenset()


def bar_agents_in(statuses: frozenset[str]) -> None:
    global _agent_barred
    _agent_barred = frozenset(statuses)


def lease_acquire(*, task_id: int, holder_kind: str, holder_id: str, ttl: timedelta | None = None) -> Lease:
    """Grant a new lease with the next epoch, if the task has no open lease or it lapsed past its grace.

    Raises LeaseHeld otherwise. Two acquirers racing: the partial unique index on open leases and the
    (task, epoch) unique constraint let exactly one insert through.
    """
    if holder_kind not in HolderKind.values:
        raise ValueError(f"unknown holder kind {holder_kind!r}")
    if not holder_id:
        raise ValueError("holder_id must not be empty")
    ttl = _checked_ttl(ttl)
    try:
        with transaction.atomic():
            now = clock.now()
            _close_lapsed(task_id, now)
            current = Lease.objects.open().filter(task_id=task_id).first()
            if current is not None:
                raise LeaseHeld(task_id, f"{current.holder_kind}:{current.holder_id}", current.expires_at)
            reservation = LeaseReservation.objects.filter(task_id=task_id).first()
            if reservation is not None and (holder_kind, holder_id) != (HolderKind.OPERATOR, reservation.holder_id):
                raise LeaseReserved(task_id, reservation.holder_id)
            # Read the clock again, after the task was found free: a grant is never dated before the
            # release it follows, and it lasts its full ttl.
            now = clock.now()
            last_epoch = Lease.objects.filter(task_id=task_id).aggregate(m=Max("epoch"))["m"] or 0
            version, status = _task_state(task_id)
            if holder_kind == HolderKind.AGENT and status in _agent_barred:
                # People hold the task (or it is quarantined): an agent lease would only block their way back.
                raise LeaseRefused(task_id, status)
            return Lease.objects.create(
                task_id=task_id,
                holder_kind=holder_kind,
                holder_id=holder_id,
                task_version_at_grant=version,
                granted_at=now,
                expires_at=now + ttl,
                ttl=ttl,
                epoch=last_epoch + 1,
            )
    except IntegrityError as exc:
        # Lost the race to another acquirer that committed first.
        current = Lease.objects.open().filter(task_id=task_id).first()
        holder = f"{current.holder_kind}:{current.holder_id}" if current else "another holder"
        raise LeaseHeld(task_id, holder, current.expires_at if current else None) from exc


def _close_lapsed(task_id: int, now: datetime) -> None:
    """Close a lease that lapsed past its grace; a person's lapsed takeover is an audit event."""
    lapsed = Lease.objects.filter(lapsed_q(now), task_id=task_id).first()
    if lapsed is None:
        return
    Lease.objects.filter(pk=lapsed.pk, released_at__isnull=True).update(
        released_at=now, release_reason=ReleaseReason.EXPIRED
    )
    if lapsed.holder_kind == HolderKind.OPERATOR:
        audit_append(
            actor=Principal.system("lease-clock"),
            action="takeover_expired",
            at=now,
            task_id=task_id,
            lease_epoch=lapsed.epoch,
            details={"holder": lapsed.holder_id, "expired_at": lapsed.expires_at.isoformat()},
        )


def lease_force_close(*, lease: Lease) -> Lease:
    """Close a holder's lease against its will (the admin's forced release, in tasks.people.takeover). After this no
    write with its epoch can land: every compare-and-set checks the epoch's lease is open."""
    with transaction.atomic():
        now = clock.now()
        if Lease.objects.open().filter(pk=lease.pk).update(released_at=now, release_reason=ReleaseReason.FORCED) != 1:
            raise LeaseLost(lease.task_id, lease.epoch, "already released or superseded")
        return Lease.objects.get(pk=lease.pk)


def lease_reserve(*, task_id: int, operator_id: str) -> LeaseReservation:
    """Hold the next grant of ``task_id`` for one operator. Raises LeaseReserved if another operator waits."""
    with transaction.atomic():
        existing = LeaseReservation.objects.select_for_update().filter(task_id=task_id).first()
        if existing is not None:
            if existing.holder_id != operator_id:
                raise LeaseReserved(task_id, existing.holder_id)
            return existing
        try:
            with transaction.atomic():
                return LeaseReservation.objects.create(task_id=task_id, holder_id=operator_id, requested_at=clock.now())
        except IntegrityError as exc:
            other = LeaseReservation.objects.filter(task_id=task_id).first()
            raise LeaseReserved(task_id, other.holder_id if other else "another operator") from exc


def lease_unreserve(*, task_id: int, operator_id: str) -> None:
    LeaseReservation.objects.filter(task_id=task_id, holder_id=operator_id).delete()


def lease_reservation(task_id: int) -> LeaseReservation | None:
    return LeaseReservation.objects.filter(task_id=task_id).first()


def lease_renew(*, lease: Lease, expected_renewal_seq: int, ttl: timedelta | None = None) -> Lease:
    """Extend the holder's own lease. Allowed until expiry plus grace; only the same epoch and holder."""
    ttl = _checked_ttl(ttl)
    with transaction.atomic():
        now = clock.now()
        updated = Lease.objects.filter(
            held_q(now),
            pk=lease.pk,
            epoch=lease.epoch,
            holder_kind=lease.holder_kind,
            holder_id=lease.holder_id,
            renewal_seq=expected_renewal_seq,
        ).update(renewal_seq=F("renewal_seq") + 1, expires_at=now + ttl, ttl=ttl)
        if updated != 1:
            _raise_renew_refusal(lease, expected_renewal_seq, now)
        return Lease.objects.get(pk=lease.pk)


def _raise_renew_refusal(lease: Lease, expected_renewal_seq: int, now: object) -> None:
    row = Lease.objects.filter(pk=lease.pk).first()
    if row is None or row.released_at is not None:
        raise LeaseLost(lease.task_id, lease.epoch, row.release_reason if row else "no such lease")
    if row.renewal_seq != expected_renewal_seq:
        raise RenewalOutOfOrder(expected_renewal_seq, row.renewal_seq)
    raise LeaseExpired(lease.task_id, lease.epoch, row.expires_at)


def lease_release(*, lease: Lease) -> Lease:
    """The holder gives the lease back. Releasing twice is refused as LeaseLost."""
    with transaction.atomic():
        now = clock.now()
        updated = (
            Lease.objects.open()
            .filter(pk=lease.pk, epoch=lease.epoch)
            .update(released_at=now, release_reason=ReleaseReason.RELEASED)
        )
        if updated != 1:
            raise LeaseLost(lease.task_id, lease.epoch, "already released or superseded")
        return Lease.objects.get(pk=lease.pk)


def lease_open(task_id: int) -> Lease | None:
    return Lease.objects.open().filter(task_id=task_id).first()


class LeaseRef(Protocol):
    """What a write needs of the caller's lease: a Lease row, or a token carried by an agent."""

    @property
    def pk(self) -> int: ...
    @property
    def task_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def holder_kind(self) -> str: ...
    @property
    def holder_id(self) -> str: ...
    @property
    def ttl(self) -> timedelta | None: ...


@dataclass(frozen=True)
class LeaseCheck:
    """The caller's lease, judged inside a write (``tasks.engine.sql.Batch``), on the database clock.

    ``guard`` returns one row — the lease's expiry — when the lease is still ``task_id``'s open lease at its epoch
    and not expired, and locks it: a concurrent forced release or re-grant waits for the write's commit, or the
    write for theirs, so the check never judges a lease that changes under the write. ``renew``, run only once the
    write is won, extends the lease by its ttl (a write is a heartbeat; a refused one is not) and returns the new
    expiry; None where the guard renews itself (SQLite, whose writes run one by one in a transaction that a refusal
    rolls back). ``renew`` is an UPDATE whose WHERE clause ends the text: the batch adds its gate and RETURNING."""

    guard: str
    guard_params: list[Any]
    renew: str | None = None
    renew_params: list[Any] = field(default_factory=list)


# The lease check's statements (lease_check), judged live at ":now", the write's own moment on the database clock.
# Fixed text only: leases.state's condition names the columns.
_GUARD_POSTGRESQL = (
    "SELECT expires_at FROM leases_lease WHERE id = %s AND task_id = %s AND epoch = %s"  # noqa: S608
    f" AND {live_sql(':now')} FOR UPDATE"
)
_GUARD_SQLITE = (
    "UPDATE leases_lease SET expires_at = MAX(expires_at, %s) WHERE id = %s AND task_id = %s AND epoch = %s"  # noqa: S608
    f" AND {live_sql(':now')} RETURNING expires_at"
)


def lease_check(*, lease: LeaseRef, task_id: int, at: datetime) -> LeaseCheck:
    """The statements that check and extend ``lease`` inside a write to ``task_id`` recorded at ``at`` (see
    LeaseCheck): the lease is judged on the database clock at the write's own statement, and extended to ``at``
    plus its ttl, never shortened."""
    now_expr, now_params = clock.now_sql()
    until = at + (lease.ttl or timedelta(0))
    if connection.vendor == "postgresql":
        # now_expr is "statement_timestamp()" or "%s" (leases.clock.now_sql): never text from outside.
        guard = _GUARD_POSTGRESQL.replace(":now", now_expr)
        renew = "UPDATE leases_lease SET expires_at = GREATEST(expires_at, %s) WHERE id = %s"
        return LeaseCheck(guard, [lease.pk, task_id, lease.epoch, *now_params], renew, [until, lease.pk])
    adapt = connection.ops.adapt_datetimefield_value
    if not now_params:  # SQLite's own clock, in a statement with parameters: its % signs doubled
        now_expr = now_expr.replace("%", "%%")
    guard = _GUARD_SQLITE.replace(":now", now_expr)
    return LeaseCheck(guard, [adapt(until), lease.pk, task_id, lease.epoch, *(adapt(v) for v in now_params)])


def lease_live(*, lease: LeaseRef, task_id: int) -> bool:
    """Whether ``lease`` may write to ``task_id`` now (a read: for naming a refusal, never for deciding a write)."""
    return Lease.objects.filter(live_q(clock.now()), pk=lease.pk, task_id=task_id, epoch=lease.epoch).exists()


def lease_refusal(*, lease: LeaseRef, task_id: int) -> LeaseError:
    """Why ``lease`` may not write to ``task_id`` now: lost (released, forced, superseded, another task's) or
    expired."""
    row = Lease.objects.filter(pk=lease.pk).first()
    if row is None or row.task_id != task_id or row.epoch != lease.epoch or row.released_at is not None:
        return LeaseLost(task_id, lease.epoch, row.release_reason if row and row.released_at else "")
    return LeaseExpired(task_id, lease.epoch, row.expires_at)


def operator_ttl() -> timedelta:
    """A person's takeover lease: its ttl (renewed by the page every third of it)."""
    ttl: timedelta = settings.RECKON_OPERATOR_LEASE_TTL
    return ttl
