"""Exactly one Celery beat sends, however many hosts start one: a lease row in the database (``BeatLease``).

Every host of a deployment may run ``./dev beat`` (Celery beat with ``CELERY_BEAT_SCHEDULER`` set to
``LeasedScheduler``). Each beat tries to take the row named ``beat``; the one holding it sends the periodic messages
(recovery scan, sweeps, anchoring) and renews it every third of its TTL (``RECKON_BEAT_LEASE_SECONDS``, default 30);
the others send nothing and try again as often. Times are the database server's (``leases.clock``), so hosts may be
skewed. A holder stopped with SIGTERM (or Ctrl-C) gives the row back on its way out, and a standby takes it at its
next try; a holder killed outright (SIGKILL, a host that died, a network cut) holds it until its TTL has passed, then
a standby takes it. A holder that cannot renew (the database unreachable, or another beat holds the row: it lapsed
during a long pause) stops sending at once.

Why a row and not a PostgreSQL advisory lock: a session lock lasts as long as the server believes the session lives —
a beat host cut off by the network keeps it until TCP keepalive gives up (hours by default) while it sends nothing,
and a pooler in transaction mode cannot hold one at all — whereas a row lease lapses after its TTL whatever happened
to its holder, and works the same on SQLite (one statement at a time, judged by the clock SQLite reads) as on
PostgreSQL (a conditional UPDATE, re-checked on the row after any concurrent one).

The holder also keeps its own bound: it sends only while less than the TTL (less a margin) has passed on its
monotonic clock since it started the renewal that succeeded — the database dated the new expiry no earlier than
that, so a beat frozen past its expiry (a paused VM) sends nothing when it wakes before it has renewed. What is
left is a message already handed to the broker when the lease lapsed: every periodic job is idempotent (a second
recovery scan queues nothing twice, DESIGN §9), so that costs nothing.
"""

import logging
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

from celery.beat import Scheduler
from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections
from django.db.models import F, Q

from leases import clock
from leases.models import BeatLease

logger = logging.getLogger(__name__)

BEAT_LEASE = "beat"


def beat_lease_ttl() -> timedelta:
    ttl: timedelta = settings.RECKON_BEAT_LEASE_TTL
    if ttl <= timedelta(0):
        raise ValueError(f"RECKON_BEAT_LEASE_SECONDS must be positive, not {ttl.total_seconds():g}")
    return ttl


@dataclass(frozen=True)
class BeatGrant:
    """The lease a beat holds after a try: its epoch, and how it came to hold it — ``renewed`` (it held it already),
    ``released`` (its last holder gave it back), ``lapsed`` (its last holder stopped renewing: killed, cut off) or
    ``new`` (the first beat ever)."""

    epoch: int
    how: str


def beat_lease_hold(*, holder: str, ttl: timedelta, name: str = BEAT_LEASE) -> BeatGrant | None:
    """Renew ``holder``'s live lease, or grant it the row if free or lapsed; None when another holder's lease is
    live. Each attempt is a conditional UPDATE: two beats racing for a free row both match it, and the second's
    UPDATE, re-checked after the first commits (PostgreSQL) or run after it (SQLite), finds it live and changes
    nothing."""
    if not holder:
        raise ValueError("holder must not be empty")
    now = clock.now()
    rows = BeatLease.objects.filter(name=name)
    if rows.filter(holder=holder, expires_at__gt=now).update(expires_at=now + ttl):
        return BeatGrant(_epoch(name), "renewed")
    grant = {"holder": holder, "epoch": F("epoch") + 1, "granted_at": now, "expires_at": now + ttl}
    if rows.filter(holder="").update(**grant):
        return BeatGrant(_epoch(name), "released")
    if rows.filter(Q(expires_at__isnull=True) | Q(expires_at__lte=now)).update(**grant):
        return BeatGrant(_epoch(name), "lapsed")
    if rows.exists():
        return None
    try:  # the first beat ever: the row is made here (a racing beat's insert fails on the primary key)
        BeatLease.objects.create(name=name, holder=holder, epoch=1, granted_at=now, expires_at=now + ttl)
    except IntegrityError:
        return None
    return BeatGrant(1, "new")


def _epoch(name: str) -> int:
    return int(BeatLease.objects.filter(name=name).values_list("epoch", flat=True).get())


def beat_lease_release(*, holder: str, name: str = BEAT_LEASE) -> bool:
    """``holder`` gives the row back (free from now on); False if it did not hold it (lapsed and taken since)."""
    now = clock.now()
    return BeatLease.objects.filter(name=name, holder=holder).update(holder="", expires_at=now) == 1


def beat_lease_holder(name: str = BEAT_LEASE) -> str:
    """Who holds the row now ("" when nobody's lease is live)."""
    row = BeatLease.objects.filter(name=name).first()
    if row is None or not row.holder or row.expires_at is None or row.expires_at <= clock.now():
        return ""
    return row.holder


class LeasedScheduler(Scheduler):
    """Celery's in-memory scheduler, sending only while this process holds the beat lease.

    In memory, not ``PersistentScheduler``'s shelve file: two beats on one host would share that file, and every
    periodic job here is a sweep that may run early — after a restart or a takeover each entry first runs one
    interval after the start, as a fresh schedule does.

    Stopping: Celery's own SIGTERM/SIGINT handler closes the scheduler inside the signal handler, which may interrupt
    this process in the middle of a database statement on the very connection the release needs (psycopg's
    connection lock is not re-entrant). This scheduler replaces it with one that stops at a safe point: at once while
    the loop sleeps, or at the end of the tick in progress; Celery's loop then closes the scheduler, which releases
    the lease.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lease_ttl = beat_lease_ttl()
        ttl = self.lease_ttl.total_seconds()
        self.renew_every = ttl / 3
        self.margin = min(1.0, ttl / 10)
        self.holder_id = f"beat:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch: int | None = None
        self._valid_until = 0.0  # monotonic: this process may send until then
        self._next_try = 0.0
        self._ticking = False
        self._stop_requested = False
        super().__init__(*args, **kwargs)
        self.max_interval = int(min(self.max_interval or self.renew_every, self.renew_every)) or 1

    def setup_schedule(self) -> None:
        super().setup_schedule()
        if threading.current_thread() is threading.main_thread():  # an embedded beat thread cannot set handlers
            signal.signal(signal.SIGTERM, self._stop_signal)
            signal.signal(signal.SIGINT, self._stop_signal)

    def _stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._ticking:
            self._stop_requested = True  # raised when the tick ends, outside any statement
            return
        raise SystemExit(0)

    def holds(self) -> bool:
        return time.monotonic() < self._valid_until - self.margin

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self._ticking = True
        try:
            started = time.monotonic()
            if started >= self._next_try:
                self._refresh(started)
            if not self.holds():
                return max(0.1, self._next_try - time.monotonic())
            interval = float(super().tick(*args, **kwargs))
            return min(interval, max(0.0, self._next_try - time.monotonic()))
        finally:
            self._ticking = False
            if self._stop_requested:
                raise SystemExit(0)

    def _refresh(self, started: float) -> None:
        """Renew or take the lease; ``started`` (monotonic) is read before the statement, so the local bound is never
        later than the database's expiry."""
        self._next_try = started + self.renew_every
        try:
            grant = beat_lease_hold(holder=self.holder_id, ttl=self.lease_ttl)
        except DatabaseError:
            logger.warning("beat lease: the database did not answer; sending nothing until it does", exc_info=True)
            close_old_connections()  # a broken connection is dropped; the next try opens another
            grant = None
        if grant is None:
            if self.epoch is not None:
                logger.warning("beat lease lost (epoch %s): %s sends nothing now", self.epoch, self.holder_id)
            self.epoch, self._valid_until = None, 0.0
            return
        if grant.epoch != self.epoch:
            what = "beat lease taken (epoch %s, %s): %s sends the periodic messages"
            logger.info(what, grant.epoch, grant.how, self.holder_id)
        self.epoch, self._valid_until = grant.epoch, started + self.lease_ttl.total_seconds()

    def close(self) -> None:
        super().close()
        if self.epoch is None:
            return
        self.epoch, self._valid_until = None, 0.0
        try:
            released = beat_lease_release(holder=self.holder_id)
        except DatabaseError:
            logger.warning("beat lease: could not give it back; it lapses after its TTL", exc_info=True)
            return
        if released:
            logger.info("beat lease released: %s", self.holder_id)
