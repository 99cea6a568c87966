"""The cursor the step's writes go through (the lease heartbeat and the compare-and-set's batch)."""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from django.db.backends.utils import CursorWrapper


@contextmanager
def step_cursor() -> Iterator[CursorWrapper]:
    """The cursor of the step's writes. On PostgreSQL it binds parameters on the server, so psycopg prepares each
    statement after a few runs (prepare_threshold) and the server stops parsing and planning it on every commit —
    Django's own cursors bind on the client, which cannot be prepared. Wrapped like Django's cursors, so execute
    wrappers and the debug query log see every statement (the statement budgets are counted through them)."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            yield cursor
        return
    import psycopg

    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    with connection.wrap_database_errors, connection._prepare_cursor(raw) as cursor:  # type: ignore[attr-defined]
        yield cursor
