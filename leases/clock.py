"""The one clock seam for lease, backoff and receipt times.

Decisions are made on the database server's clock, never on an app server's: app servers may be
skewed by minutes. Tests swap in a ControllableClock with ``use_clock``.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from django.db import DEFAULT_DB_ALIAS, connection, connections


class Clock(Protocol):
    def now(self) -> datetime: ...


class DatabaseClock:
    """Reads the current time from the database server, once per call (SQLite: the clock of the host holding the
    database file, as SQLite itself reads it)."""

    def now(self) -> datetime:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                # clock_timestamp(), not now(): now() is frozen at transaction start.
                cursor.execute("SELECT clock_timestamp()")
                value: datetime = cursor.fetchone()[0]
                return value.astimezone(UTC)
            cursor.execute(f"SELECT {SQLITE_NOW}")
            text = cursor.fetchone()[0]
            return datetime.fromisoformat(text).replace(tzinfo=UTC)

    def estimate(self) -> datetime:
        """The database clock without a round trip: the last reading taken on this thread's connection, at most
        ANCHOR_SECONDS ago, advanced by this process's monotonic clock since (which no change of the host's wall
        clock moves). A new connection (a reconnect, a failover) is read afresh. Its error: the reading's round
        trip (by which it runs ahead) and the two clocks' drift over one interval (well under a millisecond where
        NTP keeps them)."""
        wrapper = connections[DEFAULT_DB_ALIAS]
        anchor: tuple[Any, datetime, float] | None = getattr(wrapper, "reckon_clock_anchor", None)
        tick = time.monotonic()
        if anchor is not None and anchor[0] is wrapper.connection and tick - anchor[2] <= ANCHOR_SECONDS:
            return anchor[1] + timedelta(seconds=tick - anchor[2])
        reading = self.now()
        wrapper.reckon_clock_anchor = (wrapper.connection, reading, tick)  # type: ignore[attr-defined]
        return reading


ANCHOR_SECONDS = 1.0  # how long a reading of the database clock stands in for it (DatabaseClock.estimate)


SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


class ControllableClock:
    """A clock tests move by hand. Stands in for the database server's clock, not for Python's."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now

    def set(self, moment: datetime) -> None:
        self._now = moment


_clock: Clock = DatabaseClock()


def now() -> datetime:
    return _clock.now()


def write_time() -> datetime:
    """The time a write records (its rows' timestamps, its event's ``at``): the database clock, estimated without a
    round trip (DatabaseClock.estimate). Never a judgement: every write judges leases on the database clock at its
    own statement (``now_sql``)."""
    clock = _clock
    return clock.estimate() if isinstance(clock, DatabaseClock) else clock.now()


def now_sql() -> tuple[str, list[datetime]]:
    """The current time as an SQL expression and its parameters, for a statement that judges time itself (one
    round trip instead of a clock read and a write): the database's own clock — ``statement_timestamp()`` on
    PostgreSQL, SQLite's ``'now'`` (constant within one statement) — or, under a test clock, its value as a
    parameter. The SQLite expression contains ``%`` signs: callers that pass parameters double them."""
    if isinstance(_clock, DatabaseClock):
        return ("statement_timestamp()" if connection.vendor == "postgresql" else SQLITE_NOW), []
    return "%s", [_clock.now()]


@contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    global _clock
    previous, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = previous


def as_utc(value: datetime | str) -> datetime:
    """A time a statement computed (not a column the ORM converts), as an aware UTC datetime: SQLite hands back
    text or a naive datetime, PostgreSQL an aware one."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
