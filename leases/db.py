"""The cursor the step's writes go through (the lease heartbeat and the compare-and-set's batch)."""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorWrapper


@cache
def _cache_long_statements() -> None:
    """psycopg keeps its parse of a query (placeholders to $n) only below 4 KiB and 50 parameters
    (``psycopg._queries``): a chained step's batch (two changes, tasks/engine/cas.py) is longer and was parsed again on
    every commit, at more CPU than the rest of the commit's client work. The step's statements are a few fixed
    shapes (tasks.engine.sql._batch_sql), so the cache (128 entries) keeps its purpose. tests/test_step_budget.py fails
    if
    a psycopg upgrade stops reading these names."""
    import psycopg._queries

    psycopg._queries.MAX_CACHED_STATEMENT_LENGTH = max(psycopg._queries.MAX_CACHED_STATEMENT_LENGTH, 32 * 1024)
    psycopg._queries.MAX_CACHED_STATEMENT_PARAMS = max(psycopg._queries.MAX_CACHED_STATEMENT_PARAMS, 500)


@contextmanager
def step_cursor() -> Iterator[CursorWrapper]:
    """The cursor of the step's writes. On PostgreSQL it binds parameters on the server, so psycopg prepares each
    statement after a few runs (prepare_threshold) and the server stops parsing and planning it on every commit —
    Django's own cursors bind on the client, which cannot be prepared. Wrapped like Django's cursors, so execute
    wrappers and the debug query log see every statement (the statement budgets are counted through them).

    One such cursor is kept per database connection and used again by the next step (making one cost more than
    the statement's own client work did): a new connection gets a new cursor."""
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: every attribute read through the proxy costs a lookup
    if db.vendor != "postgresql":
        with db.cursor() as cursor:
            yield cursor
        return
    import psycopg

    _cache_long_statements()
    db.ensure_connection()
    # Taken while in use, so a step cursor opened inside another gets its own.
    kept: tuple[Any, psycopg.Cursor[Any]] | None = db.__dict__.pop("_reckon_step_cursor", None)
    if kept is None or kept[0] is not db.connection or kept[0].closed or kept[1].closed:
        kept = (db.connection, psycopg.Cursor(db.connection))
    try:
        with db.wrap_database_errors:
            yield db._prepare_cursor(kept[1])  # type: ignore[attr-defined]
    finally:
        db._reckon_step_cursor = kept  # type: ignore[attr-defined]
