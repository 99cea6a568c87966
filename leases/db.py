"""The cursor the step's writes go through (the lease heartbeat and the compare-and-set's batch)."""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from django.db import connection
from django.db.backends.utils import CursorWrapper


@cache
def _cache_long_statements() -> None:
    """psycopg keeps its parse of a query (placeholders to $n) only below 4 KiB and 50 parameters
    (``psycopg._queries``): a chained step's batch (two changes, tasks/cas.py) is longer and was parsed again on
    every commit, at more CPU than the rest of the commit's client work. The step's statements are a few fixed
    shapes (tasks.sql._batch_sql), so the cache (128 entries) keeps its purpose. tests/test_step_budget.py fails if
    a psycopg upgrade stops reading these names."""
    import psycopg._queries

    psycopg._queries.MAX_CACHED_STATEMENT_LENGTH = max(psycopg._queries.MAX_CACHED_STATEMENT_LENGTH, 32 * 1024)
    psycopg._queries.MAX_CACHED_STATEMENT_PARAMS = max(psycopg._queries.MAX_CACHED_STATEMENT_PARAMS, 500)


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

    _cache_long_statements()
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    with connection.wrap_database_errors, connection._prepare_cursor(raw) as cursor:  # type: ignore[attr-defined]
        yield cursor
