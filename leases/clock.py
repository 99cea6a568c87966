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
    """Reads the current time from the database server, once per call."""

    def now(self) -> datetime:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                # clock_timestamp(), not now(): now() is frozen at transaction start.
                cursor.execute("SELECT clock_timestamp()")
                value: datetime = cursor.fetchone()[0]
                return value.astimezone(UTC)
            cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
            text = cursor.fetchone()[0]
            return datetime.fromisoformat(text).replace(tzinfo=UTC)


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


@contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    global _clock
    previous, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = previous
