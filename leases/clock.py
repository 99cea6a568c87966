"""The one clock seam for lease, backoff and receipt times.

Decisions are made on the database server's clock, never on an app server's: app servers may be
skewed by minutes. Tests swap in a ControllableClock with ``use_clock``.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol

from django.db import connection


class Clock(Protocol):
    def now(self) -> datetime: ...


class DatabaseClock:
    """The database server's time. PostgreSQL is asked (once per call); SQLite has no server — the database is a
    file on this host and its ``'now'`` is this host's clock, so that clock is read without a round trip."""

    def now(self) -> datetime:
        if connection.vendor != "postgresql":
            return datetime.now(UTC)
        with connection.cursor() as cursor:
            # clock_timestamp(), not now(): now() is frozen at transaction start.
            cursor.execute("SELECT clock_timestamp()")
            value: datetime = cursor.fetchone()[0]
            return value.astimezone(UTC)


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


def now_sql() -> tuple[str, list[datetime]]:
    """The current time as an SQL expression and its parameters, for a statement that judges time itself (one
    round trip instead of a clock read and a write). On PostgreSQL with the database clock it is the statement's
    own timestamp; otherwise (SQLite, or a test clock) the clock's value as a parameter."""
    if isinstance(_clock, DatabaseClock) and connection.vendor == "postgresql":
        return "statement_timestamp()", []
    return "%s", [_clock.now()]


@contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    global _clock
    previous, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = previous
