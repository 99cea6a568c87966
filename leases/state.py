"""A lease's state at one moment of the database clock — live, in its grace, lapsed or closed: the one definition.

A lease that is not released is, at ``now``:

- **live** while ``now < expires_at``: its holder may write (a write exactly at ``expires_at`` is refused);
- **in its grace** while ``expires_at <= now < expires_at + grace``: only its holder may renew it, nobody else may be
  granted the task;
- **lapsed** from ``expires_at + grace`` on (the end of the grace is lapsed): it binds nobody and can write nothing;
  the next grant closes it (leases.services.lease_acquire).

A released lease (given back, forced, or closed once lapsed) is **closed**, whatever the time. "Held" — nobody else
may take the task — is live or in its grace.

Every boundary is exclusive and is the one comparison ``expires_at > now - offset``: offset zero for live, the grace
for held. The Python predicates compute exactly that comparison; the ORM conditions (``live_q``, ``held_q``,
``grace_q``, ``lapsed_q``) and the SQL text (``live_sql``, ``held_sql``, ``open_sql``) the compare-and-set, the
snapshot, the recovery scan and the metrics are written with spell the same one. No other module compares a lease's
expiry (tests/test_lease_state.py reads the source and fails if one does).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.expressions import Combinable

_ZERO = timedelta(0)


class Phase(StrEnum):
    LIVE = "live"
    GRACE = "grace"
    LAPSED = "lapsed"
    CLOSED = "closed"


def lease_grace() -> timedelta:
    """How long after its expiry a lease still keeps everybody but its holder out (RECKON_LEASE_GRACE)."""
    grace: timedelta = settings.RECKON_LEASE_GRACE
    return grace


# A reading of the clock: a datetime, or an expression the statement reads it with (tasks.querysets.ClockNow: a
# queryset built once and compiled with each query).
type Now = datetime | Combinable


def _cutoff(now: datetime, offset: timedelta) -> datetime:
    """The expiry a phase that lasts ``offset`` past expiry has just ended for at ``now``: a lease is inside the
    phase while its ``expires_at`` is later than this, strictly."""
    return now - offset


def _cutoff_q(now: Now, offset: timedelta) -> Any:
    """``_cutoff`` for a condition: on a datetime, or on the statement's own reading of the clock."""
    return now if offset == _ZERO else now - offset  # an expression: the database subtracts


def _grace(grace: timedelta | None) -> timedelta:
    return lease_grace() if grace is None else grace


def live_at(expires_at: datetime, now: datetime) -> bool:
    """An open lease expiring at ``expires_at`` is live at ``now`` (the step's own check: no object, no settings)."""
    return expires_at > _cutoff(now, _ZERO)


def held_at(expires_at: datetime, now: datetime, grace: timedelta | None = None) -> bool:
    """An open lease expiring at ``expires_at`` keeps everybody else out at ``now``: live or in its grace."""
    return expires_at > _cutoff(now, _grace(grace))


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What ``lease_state`` found: the phase, and the times a page shows (whole seconds, truncated toward zero)."""

    phase: Phase
    expires_at: datetime
    now: datetime
    grace: timedelta

    @property
    def live(self) -> bool:
        return self.phase is Phase.LIVE

    @property
    def in_grace(self) -> bool:
        return self.phase is Phase.GRACE

    @property
    def lapsed(self) -> bool:
        return self.phase is Phase.LAPSED

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    @property
    def held(self) -> bool:
        """Nobody else may take the task: live or in its grace."""
        return self.phase in (Phase.LIVE, Phase.GRACE)

    @property
    def expires_in(self) -> timedelta:
        """Until expiry; negative once expired."""
        return self.expires_at - self.now

    @property
    def seconds_left(self) -> int:
        """Whole seconds until expiry; negative once expired."""
        return int(self.expires_in.total_seconds())

    @property
    def seconds_since_expiry(self) -> int:
        return -self.seconds_left

    @property
    def grace_left(self) -> timedelta | None:
        """Until the grace ends, while in it."""
        return self.expires_at + self.grace - self.now if self.in_grace else None

    @property
    def grace_left_seconds(self) -> int | None:
        left = self.grace_left
        return None if left is None else int(left.total_seconds())


def lease_state(
    *, expires_at: datetime, now: datetime, released_at: datetime | None = None, grace: timedelta | None = None
) -> LeaseState:
    """The state of a lease expiring at ``expires_at`` (released at ``released_at``, if it was) at ``now``, a reading
    of the database clock. ``grace``: the deployment's (RECKON_LEASE_GRACE) unless given."""
    grace = _grace(grace)
    if released_at is not None:
        phase = Phase.CLOSED
    elif live_at(expires_at, now):
        phase = Phase.LIVE
    elif held_at(expires_at, now, grace):
        phase = Phase.GRACE
    else:
        phase = Phase.LAPSED
    return LeaseState(phase=phase, expires_at=expires_at, now=now, grace=grace)


# --- the same definition, for queries -------------------------------------------------------------------------

_OPEN = Q(released_at__isnull=True)


def live_q(now: Now) -> Q:
    """Lease rows live at ``now``."""
    return _OPEN & Q(expires_at__gt=_cutoff_q(now, _ZERO))


def held_q(now: Now, grace: timedelta | None = None) -> Q:
    """Lease rows that keep everybody but their holder out at ``now``: live or in their grace."""
    return _OPEN & Q(expires_at__gt=_cutoff_q(now, _grace(grace)))


def grace_q(now: Now, grace: timedelta | None = None) -> Q:
    """Lease rows in their grace at ``now``: held, not live."""
    return _OPEN & Q(expires_at__gt=_cutoff_q(now, _grace(grace))) & ~Q(expires_at__gt=_cutoff_q(now, _ZERO))


def lapsed_q(now: Now, grace: timedelta | None = None) -> Q:
    """Open lease rows past their expiry and grace at ``now``: the next grant closes them."""
    return _OPEN & ~Q(expires_at__gt=_cutoff_q(now, _grace(grace)))


def _column(alias: str, name: str) -> str:
    return f"{alias}.{name}" if alias else name


def open_sql(alias: str = "") -> str:
    """SQL for a lease row that is not closed (live, in its grace or lapsed: the caller judges which)."""
    return f"{_column(alias, 'released_at')} IS NULL"


def live_sql(now: str, alias: str = "") -> str:
    """``live_q`` as SQL, judged at the SQL expression ``now`` — the database's own clock (leases.clock.now_sql) or a
    placeholder — so a statement judges the lease at its own moment."""
    return f"{open_sql(alias)} AND {_column(alias, 'expires_at')} > {now}"


def held_sql(now: datetime, alias: str = "", grace: timedelta | None = None) -> tuple[str, list[Any]]:
    """``held_q`` as SQL and its parameter (adapted for the connection's backend), judged at ``now``."""
    cutoff = connection.ops.adapt_datetimefield_value(_cutoff(now, _grace(grace)))
    return f"{open_sql(alias)} AND {_column(alias, 'expires_at')} > %s", [cutoff]
