"""PostgreSQL → PostgreSQL: copy a table in batches and switch a view to the copy, each write once per op key.

    from reckon_client.connectors.postgres import PostgresConnector

    pg = PostgresConnector(source="postgresql://reader@old-db/app", target="postgresql://writer@new-db/app")
    pg.submit(op_key, {"action": "copy_batch", "not_after": "2026-01-01T00:00:30+00:00",
                       "input": {"source": "public.items", "target": "public.items", "key": "id", "range": [1, 500]}})

The rule: a write and its receipt commit together, in one transaction of the target. Every write under an op key
runs in one transaction at the target that

1. takes the op key's advisory lock (``pg_advisory_xact_lock``), held until it commits or rolls back;
2. reads the ledger (table ``reckon_ledger`` at the target): a key seen before answers what it answered then (the same
   receipt), a fenced key answers ``Fenced``, and nothing is written again;
3. refuses a request past its deadline, judged by the target's clock (``clock_timestamp()``), with no effect;
4. makes the write, computes its receipt at the target and inserts the ledger row (state ``committed``);
5. commits: the effect and its ledger row land together or not at all.

``lookup`` takes the same lock, shared, before it reads the ledger: it waits for a write of that key still open at the
target and never answers "not found" while one could commit. As the deadline is checked under the lock, a "not found"
past the deadline is final. ``fence`` takes the lock and inserts a ``fenced`` ledger row unless the key has one (one
``INSERT … ON CONFLICT DO NOTHING``); a later write under that key finds it and answers ``Fenced``.

Actions (table and view names: ``name`` or ``schema.name`` of letters, digits and ``_``, quoted with
``psycopg.sql.Identifier``):

- ``copy_batch`` ``{"source", "target", "key", "range": [lo, hi]}`` or ``{…, "keys": [k, …]}``, optionally
  ``"source_version"``: copy the source rows whose key is in the inclusive range (or the list) into the target table,
  which has the source's columns. The rows are read in one REPEATABLE READ snapshot of the source. The receipt's
  ``count`` is the rows copied and its ``digest`` is computed at the target in the write's transaction; it must equal
  the source's digest of the same rows (``invalid_params`` otherwise, nothing written). A target already holding a
  row of the batch is a ``conflict``; so is a ``source_version`` that is not the source's version now (checking it
  reads the whole source table, per batch).
- ``switch`` ``{"view", "table"}``: ``CREATE OR REPLACE VIEW view AS SELECT * FROM table`` in the transaction of its
  ledger row; ``remote_id`` is the view, ``remote_version`` the table it now reads.
- compensations: ``delete_batch`` (a copy's input: delete the batch's rows from the target) and ``switch_back`` (a
  switch's input: the view's definition before that switch, restored, or the view dropped if it did not exist).
- ``delete(op_key, locator)``: ``DROP TABLE IF EXISTS locator`` at the target (never CASCADE); count 1 or 0.

A batch's digest is sha256 over its rows' text (``ROW(columns)::text``, the source's column order), sorted bytewise
(``COLLATE "C"``) and joined by newlines; every connection fixes the text forms (UTC, ISO dates, hex bytea, shortest
exact floats). ``current_version(table)`` is ``rows:<n>:sha256:<hex>``, the same function over every row of the
source table (each row's whole text), streamed through a server-side cursor: it changes whenever a row is inserted,
deleted or has a value changed, and not when an UPDATE writes the values a row already had. It reads the whole table.
"""

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from reckon_client.connectors.common import (
    InvalidRequest,
    SourceNotFound,
    WriteRequest,
    op_key_problem,
    optional_text,
    text_field,
)
from reckon_client.outcomes import Committed, Failed, FailureClass, Fenced, NotFound, Outcome

type Connection = psycopg.Connection[tuple[Any, ...]]
type Cursor = psycopg.Cursor[tuple[Any, ...]]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_LOCK_SHARED = "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))"
_LATE = "the request reached the target after its deadline (not_after): refused, no effect"
_IN_FLIGHT = "a write under this op key is still open at the target: its outcome is not known yet"

_LEDGER_COLUMNS = """
    op_key text PRIMARY KEY,
    state text NOT NULL CHECK (state IN ('committed', 'fenced')),
    action text,
    request text,
    remote_id text,
    remote_version text,
    count bigint,
    digest text,
    data jsonb,
    undo text,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
"""

# The text of a set of rows, one function for a batch (in SQL, at either end) and a table (streamed): rows_digest.
_DIGEST = (
    "SELECT count(*), encode(sha256(convert_to(coalesce(string_agg(r, E'\\n' ORDER BY r COLLATE \"C\"), ''), "
    "'UTF8')), 'hex') FROM (SELECT ROW({columns})::text AS r FROM {table} WHERE {where}) AS batch"
)

# Failure classes of a write rolled back by the server, by SQLSTATE and by its class (the first two characters).
_BY_SQLSTATE: dict[str, FailureClass] = {"42501": "permission_revoked"}
_BY_CLASS: dict[str, FailureClass] = {
    "0A": "invalid_params",  # feature not supported
    "22": "invalid_params",  # data exception
    "23": "conflict",  # integrity constraint violation
    "28": "permission_revoked",  # invalid authorization
    "2B": "conflict",  # dependent objects still exist
    "42": "invalid_params",  # syntax error or access rule violation: no such table, column, operator
}


class _Refused(Exception):
    """Inside a write's transaction: roll it back and answer ``outcome``."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass(frozen=True)
class _Written:
    receipt: Committed
    undo: str | None = None  # a switch: the view's definition before it (None: there was no view)


type _Write = Callable[[Cursor], _Written]


def table_name(value: object, what: str = "table") -> tuple[str, ...]:
    """``name`` or ``schema.name`` as the parts of a ``sql.Identifier``; ``InvalidRequest`` for anything else."""
    parts = value.split(".") if isinstance(value, str) else []
    if not 1 <= len(parts) <= 2 or not all(_NAME.fullmatch(part) for part in parts):
        raise InvalidRequest(f"{what} {value!r:.80} is not a name or schema.name of letters, digits and _")
    return tuple(parts)


def rows_digest(texts: Iterable[str]) -> str:
    """sha256 (hex) of row texts sorted by code point (= bytewise UTF-8, ``COLLATE "C"``) and joined by newlines."""
    return hashlib.sha256("\n".join(sorted(texts)).encode()).hexdigest()


def _ident(parts: tuple[str, ...]) -> sql.Identifier:
    return sql.Identifier(*parts)


def _dotted(parts: tuple[str, ...]) -> str:
    return ".".join(parts)


@dataclass(frozen=True)
class Batch:
    """The rows of a ``copy_batch`` (or ``delete_batch``): key in ``[lo, hi]``, or in ``keys``."""

    source: tuple[str, ...]
    target: tuple[str, ...]
    key: str
    bounds: tuple[int | str, int | str] | None
    keys: tuple[int | str, ...] | None
    source_version: str | None

    @classmethod
    def parse(cls, given: Mapping[str, Any], max_rows: int) -> "Batch":
        key = text_field(given, "key", limit=63)
        if not _NAME.fullmatch(key):
            raise InvalidRequest(f"key {key!r} is not a column name of letters, digits and _")
        bounds, keys = given.get("range"), given.get("keys")
        if (bounds is None) == (keys is None):
            raise InvalidRequest('a batch names its rows by "range": [lo, hi] or by "keys": [k, ...], one of the two')
        if bounds is not None and not (isinstance(bounds, list | tuple) and len(bounds) == 2):
            raise InvalidRequest("range is [lo, hi]")
        if keys is not None and not (isinstance(keys, list | tuple) and 0 < len(keys) <= max_rows):
            raise InvalidRequest(f"keys is a list of 1 to {max_rows} keys")
        values = list(bounds if bounds is not None else keys or ())
        if not all(_key_value(value) for value in values) or len({type(value) for value in values}) != 1:
            raise InvalidRequest("the batch's keys are all integers or all strings")
        if bounds is not None and isinstance(bounds[0], int) and bounds[0] > bounds[1]:
            raise InvalidRequest(f"range {list(bounds)} is empty: lo > hi")
        return cls(
            source=table_name(given.get("source"), "source"),
            target=table_name(given.get("target"), "target"),
            key=key,
            bounds=(bounds[0], bounds[1]) if bounds is not None else None,
            keys=tuple(keys) if keys is not None else None,
            source_version=optional_text(given, "source_version"),
        )

    def where(self) -> tuple[sql.Composable, tuple[Any, ...]]:
        key = sql.Identifier(self.key)
        if self.bounds is not None:
            return sql.SQL("{} BETWEEN %s AND %s").format(key), self.bounds
        return sql.SQL("{} = ANY(%s)").format(key), (list(self.keys or ()),)

    @property
    def remote_id(self) -> str:
        if self.bounds is not None:
            return f"{_dotted(self.target)}[{self.key} {self.bounds[0]}..{self.bounds[1]}]"
        return f"{_dotted(self.target)}[{self.key} in {len(self.keys or ())} keys]"


def _key_value(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and len(value) <= 1024)


class PostgresConnector:
    """Copies between two PostgreSQL databases (``source`` and ``target`` are libpq connection strings; they may name
    the same database). Satisfies ``reckon_client.Connector``, ``Fencing`` and ``Deleting``. Every call opens its own
    connections and closes them."""

    def __init__(
        self,
        *,
        source: str,
        target: str,
        ledger: str = "reckon_ledger",
        max_rows: int = 50_000,
        lock_timeout: float = 10.0,
        statement_timeout: float = 300.0,
        idle_timeout: float = 60.0,
        connect_timeout: int = 10,
        prefix: str = "",
    ) -> None:
        self.source, self.target = source, target
        # The actions' names as the server registers them: "pg." makes copy_batch "pg.copy_batch" (the reference
        # agent's kind); every request must then name its action with it.
        self.prefix = prefix
        self.ledger = table_name(ledger, "ledger")
        self.max_rows = max_rows
        self.connect_timeout = connect_timeout
        # Text forms fixed so that a row's text (and so a digest) depends on its values only; a session that dies
        # inside a transaction gives its op key's lock back after idle_timeout.
        self._session = (
            "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; "
            "SET extra_float_digits = 1; SET bytea_output = 'hex'; "
            f"SET lock_timeout = {int(lock_timeout * 1000)}; SET statement_timeout = {int(statement_timeout * 1000)}; "
            f"SET idle_in_transaction_session_timeout = {int(idle_timeout * 1000)}"
        )
        self._ledger_ready = False

    # -- the contract ---------------------------------------------------------------------------------------------

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        try:
            parsed = WriteRequest.parse(request)
            write = self._write_for(parsed)
            _check_op_key(op_key)
        except InvalidRequest as exc:
            return Failed("invalid_params", str(exc))
        return self._run(op_key, parsed, write)

    def compensate(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        """A compensation (``delete_batch``, ``switch_back``) under its own op key: the same rules as ``submit``."""
        return self.submit(op_key, request)

    def delete(self, op_key: str, locator: str) -> Outcome:
        """Drop exactly the table ``locator`` at the target (a staging table), once per op key."""
        return self.submit(op_key, {"action": f"{self.prefix}drop_table", "input": {"table": locator}})

    def lookup(self, op_key: str) -> Outcome:
        if op_key_problem(op_key):
            return NotFound()  # a key submit refuses never took effect
        try:
            conn = self._connect(self.target)
        except psycopg.Error as exc:
            return Failed("connection_interrupted", f"lookup failed: {_say(exc)}")
        try:
            with conn.cursor() as cur:
                cur.execute(_LOCK_SHARED, (_lock_key(op_key),))
                row = self._ledger_row(cur, op_key)
        except errors.UndefinedTable:
            return NotFound()  # no ledger: nothing was ever written through it
        except errors.LockNotAvailable:
            return Failed("connection_interrupted", _IN_FLIGHT)
        except psycopg.Error as exc:
            return Failed("connection_interrupted", f"lookup failed: {_say(exc)}")
        finally:
            conn.close()
        return NotFound() if row is None else _answer(row)

    def fence(self, op_key: str) -> Outcome:
        """What became of ``op_key``, final: the ledger's receipt if it took effect, else a ``fenced`` ledger row that
        refuses it from now on (``Fenced``)."""
        if op_key_problem(op_key):
            return Fenced()  # submit refuses such a key: it can never take effect
        try:
            conn = self._connect(self.target, ledger=True)
        except psycopg.Error as exc:
            return Failed("connection_interrupted", f"fence failed: {_say(exc)}")
        try:
            with conn.cursor() as cur:
                cur.execute(_LOCK, (_lock_key(op_key),))
                cur.execute(
                    sql.SQL(
                        "INSERT INTO {} (op_key, state) VALUES (%s, 'fenced') ON CONFLICT (op_key) DO NOTHING "
                        "RETURNING op_key"
                    ).format(_ident(self.ledger)),
                    (op_key,),
                )
                if cur.fetchone() is None:
                    row = self._ledger_row(cur, op_key)
                    return _answer(row) if row is not None else Failed("connection_interrupted", "ledger row vanished")
            conn.commit()
        except errors.LockNotAvailable:
            return Failed("connection_interrupted", _IN_FLIGHT)
        except psycopg.Error as exc:
            return Failed("connection_interrupted", f"fence failed: {_say(exc)}")
        finally:
            conn.close()
        return Fenced()

    def current_version(self, locator: str) -> str:
        """``rows:<n>:sha256:<hex>`` of the source table ``locator`` now (see the module's docstring).
        ``SourceNotFound`` when there is no such table; ``ConnectionError`` when the source cannot be asked."""
        try:
            table = table_name(locator)
        except InvalidRequest as exc:
            raise SourceNotFound(str(exc)) from exc
        try:
            conn = self._connect(self.source)
        except psycopg.Error as exc:
            raise ConnectionError(f"version of {locator}: {_say(exc)}") from exc
        try:
            conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
            return _table_version(conn, table)
        except errors.UndefinedTable as exc:
            raise SourceNotFound(f"the source has no table {locator}") from exc
        except psycopg.Error as exc:
            raise ConnectionError(f"version of {locator}: {_say(exc)}") from exc
        finally:
            conn.close()

    # -- one write ------------------------------------------------------------------------------------------------

    def key_bounds(self, table: str, key: str) -> tuple[int, int] | None:
        """The least and the greatest integer ``key`` of the source ``table`` (None when it has no rows): what an
        agent cuts into batch ranges. ``SourceNotFound`` when there is no such table."""
        name = table_name(table)
        if not _NAME.fullmatch(key):
            raise InvalidRequest(f"key {key!r} is not a column name of letters, digits and _")
        conn = self._connect(self.source)
        try:
            query = sql.SQL("SELECT min({0}), max({0}) FROM {1}").format(sql.Identifier(key), _ident(name))
            row = conn.execute(query).fetchone()
        except errors.UndefinedTable as exc:
            raise SourceNotFound(f"the source has no table {table}") from exc
        finally:
            conn.close()
        if row is None or row[0] is None:
            return None
        if not all(isinstance(bound, int) for bound in row):
            raise InvalidRequest(f"key {key!r} of {table} is not an integer column")
        return int(row[0]), int(row[1])

    def _write_for(self, request: WriteRequest) -> _Write:
        given = request.input
        action = request.action
        if self.prefix:
            if not action.startswith(self.prefix):
                raise InvalidRequest(f"this connector's actions are named {self.prefix}…, not {action!r:.80}")
            action = action[len(self.prefix) :]
        match action:
            case "copy_batch":
                return self._copy_batch(Batch.parse(given, self.max_rows))
            case "delete_batch":
                return _delete_batch(Batch.parse(given, self.max_rows))
            case "switch":
                return _switch(table_name(given.get("view"), "view"), table_name(given.get("table")))
            case "switch_back":
                return self._switch_back(table_name(given.get("view"), "view"), table_name(given.get("table")))
            case "drop_table":
                return _drop_table(table_name(given.get("table")))
        known = ", ".join(f"{self.prefix}{name}" for name in ("copy_batch", "switch", "delete_batch", "switch_back"))
        raise InvalidRequest(f"the PostgreSQL connector has no action {request.action!r:.80} ({known})")

    def _run(self, op_key: str, request: WriteRequest, write: _Write) -> Outcome:
        """``write`` under ``op_key`` in one transaction at the target, with its ledger row (the module's rule)."""
        try:
            conn = self._connect(self.target, ledger=True)
        except psycopg.Error as exc:
            return _rolled_back(exc, "the target refused the connection or its ledger")
        try:
            try:
                with conn.cursor() as cur:
                    written = self._hold_then_write(cur, op_key, request, write)
            except _Refused as refused:
                return refused.outcome
            except psycopg.Error as exc:
                return _rolled_back(exc)
            try:
                conn.commit()
            except psycopg.Error as exc:
                return Failed("connection_interrupted", f"COMMIT sent, no answer: {_say(exc)}")
            return written.receipt
        finally:
            conn.close()  # an open transaction is rolled back

    def _hold_then_write(self, cur: Cursor, op_key: str, request: WriteRequest, write: _Write) -> _Written:
        try:
            cur.execute(_LOCK, (_lock_key(op_key),))
        except errors.LockNotAvailable as exc:
            raise _Refused(Failed("connection_interrupted", _IN_FLIGHT)) from exc
        # The ledger's row for the key and the deadline, judged by the target's clock, in one statement.
        cur.execute(
            sql.SQL(
                "SELECT l.state, l.request, l.remote_id, l.remote_version, l.count, l.digest, l.data, "
                "clock_timestamp() > %s FROM (SELECT 1) AS one LEFT JOIN {} AS l ON l.op_key = %s"
            ).format(_ident(self.ledger)),
            (request.not_after, op_key),
        )
        *prior, late = _one(cur)
        if prior[0] is not None:
            raise _Refused(_replayed(tuple(prior), request))
        if late:
            raise _Refused(Failed("dependency_unavailable", _LATE))
        written = write(cur)
        receipt = written.receipt
        cur.execute(
            sql.SQL(
                "INSERT INTO {} (op_key, state, action, request, remote_id, remote_version, count, digest, data, undo) "
                "VALUES (%s, 'committed', %s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(_ident(self.ledger)),
            (
                op_key,
                request.action,
                request.digest,
                receipt.remote_id,
                receipt.remote_version,
                receipt.count,
                receipt.digest,
                Jsonb(receipt.data),
                written.undo,
            ),
        )
        return written

    def _copy_batch(self, batch: Batch) -> _Write:
        def write(cur: Cursor) -> _Written:
            columns, count, digest, blocks = self._read_batch(batch)
            where, params = batch.where()
            cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(_ident(batch.target), where), params)
            if already := _one(cur)[0]:
                raise _Refused(Failed("conflict", f"the target already holds {already} rows of {batch.remote_id}"))
            names = sql.SQL(", ").join(map(sql.Identifier, columns))
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(_ident(batch.target), names)) as copy:
                for block in blocks:
                    copy.write(block)
            if _batch_digest(cur, batch.target, columns, batch) != (count, digest):
                detail = f"the rows written to {_dotted(batch.target)} do not read back as the source's"
                raise _Refused(Failed("invalid_params", detail + ": do its columns have the source's types?"))
            return _Written(Committed(remote_id=batch.remote_id, count=count, digest=f"sha256:{digest}"))

        return write

    def _read_batch(self, batch: Batch) -> tuple[list[str], int, str, list[bytes]]:
        """The batch's columns, row count, digest and COPY text, read in one REPEATABLE READ snapshot of the source."""
        try:
            conn = self._connect(self.source)
        except psycopg.Error as exc:
            raise _Refused(Failed("dependency_unavailable", f"the source cannot be reached: {_say(exc)}")) from exc
        try:
            conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
            if batch.source_version is not None and (now := _table_version(conn, batch.source)) != batch.source_version:
                raise _Refused(Failed("conflict", f"the source is at version {now}, not {batch.source_version}"))
            with conn.cursor() as cur:
                cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(_ident(batch.source)))
                columns = [column.name for column in cur.description or ()]
                if batch.key not in columns:
                    raise _Refused(Failed("invalid_params", f"the source has no column {batch.key!r}"))
                where, params = batch.where()
                cur.execute(
                    sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT %s) AS batch").format(
                        _ident(batch.source), where
                    ),
                    (*params, self.max_rows + 1),
                )
                if _one(cur)[0] > self.max_rows:
                    raise _Refused(Failed("invalid_params", f"more than {self.max_rows} rows: too many for one batch"))
                count, digest = _batch_digest(cur, batch.source, columns, batch)
                names = sql.SQL(", ").join(map(sql.Identifier, columns))
                query = sql.SQL("COPY (SELECT {} FROM {} WHERE {} ORDER BY {}) TO STDOUT").format(
                    names, _ident(batch.source), where, sql.Identifier(batch.key)
                )
                with cur.copy(query, params) as copy:
                    blocks = [bytes(block) for block in copy]
            return columns, count, digest, blocks
        except psycopg.Error as exc:
            raise _Refused(_rolled_back(exc, "the source refused the read")) from exc
        finally:
            conn.close()

    def _switch_back(self, view: tuple[str, ...], table: tuple[str, ...]) -> _Write:
        def write(cur: Cursor) -> _Written:
            found_view, found_table = _relation(cur, view), _relation(cur, table)
            if found_view is None or found_table is None:
                raise _Refused(Failed("invalid_params", f"no view {_dotted(view)} or no table {_dotted(table)}"))
            cur.execute(
                sql.SQL(
                    "SELECT undo FROM {} WHERE state = 'committed' AND action = 'switch' AND remote_id = %s "
                    "AND remote_version = %s ORDER BY recorded_at DESC LIMIT 1"
                ).format(_ident(self.ledger)),
                (_dotted(found_view), _dotted(found_table)),
            )
            recorded = cur.fetchone()
            if recorded is None:
                detail = f"no switch of {_dotted(found_view)} to {_dotted(found_table)} is recorded"
                raise _Refused(Failed("invalid_params", detail))
            if (reads := _view_reads(cur, found_view)) != [found_table]:
                detail = f"{_dotted(found_view)} reads {', '.join(map(_dotted, reads))} now, not {_dotted(found_table)}"
                raise _Refused(Failed("conflict", detail))
            cur.execute(sql.SQL("DROP VIEW {}").format(_ident(found_view)))
            before: str | None = recorded[0]
            if before is not None:
                # The definition PostgreSQL itself printed for the view before the switch (pg_get_viewdef).
                definition = sql.SQL(before.strip().rstrip(";"))
                cur.execute(sql.SQL("CREATE VIEW {} AS {}").format(_ident(found_view), definition))
            reads_now = ", ".join(map(_dotted, _view_reads(cur, found_view))) if before is not None else ""
            return _Written(Committed(remote_id=_dotted(found_view), remote_version=reads_now))

        return write

    # -- the ledger and connections ---------------------------------------------------------------------------------

    def _connect(self, conninfo: str, *, ledger: bool = False) -> Connection:
        """A connection with the session's settings, in one round trip; with ``ledger``, the ledger is created too
        the first time (under an advisory lock: two first writes at once must not both try to create it)."""
        conn = psycopg.connect(
            conninfo,
            autocommit=True,
            prepare_threshold=None,  # no server-side prepared statements: safe behind a transaction pooler
            connect_timeout=self.connect_timeout,
            application_name="reckon-connector",
        )
        setup: list[sql.Composable] = [sql.SQL(self._session)]
        creating = ledger and not self._ledger_ready
        if creating:
            name = sql.Literal("reckon-ledger:" + _dotted(self.ledger))
            setup.append(
                sql.SQL(
                    "SELECT pg_advisory_lock(hashtextextended({name}, 0)); "
                    "CREATE TABLE IF NOT EXISTS {ledger} (" + _LEDGER_COLUMNS + "); "
                    "SELECT pg_advisory_unlock(hashtextextended({name}, 0))"
                ).format(name=name, ledger=_ident(self.ledger))
            )
        try:
            conn.execute(sql.SQL("; ").join(setup))
            conn.autocommit = False
        except psycopg.Error:
            conn.close()
            raise
        self._ledger_ready = self._ledger_ready or creating
        return conn

    def _ledger_row(self, cur: Cursor, op_key: str) -> tuple[Any, ...] | None:
        cur.execute(
            sql.SQL(
                "SELECT state, request, remote_id, remote_version, count, digest, data FROM {} WHERE op_key = %s"
            ).format(_ident(self.ledger)),
            (op_key,),
        )
        return cur.fetchone()


def _switch(view: tuple[str, ...], table: tuple[str, ...]) -> _Write:
    def write(cur: Cursor) -> _Written:
        found_table = _relation(cur, table)
        if found_table is None:
            raise _Refused(Failed("invalid_params", f"the target has no table {_dotted(table)}"))
        cur.execute(
            "SELECT c.relkind, pg_get_viewdef(c.oid) FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (_ident(view).as_string(cur),),
        )
        existing = cur.fetchone()
        if existing is not None and existing[0] != "v":
            raise _Refused(Failed("invalid_params", f"{_dotted(view)} exists and is not a view"))
        cur.execute(sql.SQL("CREATE OR REPLACE VIEW {} AS SELECT * FROM {}").format(_ident(view), _ident(found_table)))
        found_view = _relation(cur, view) or view  # created just now, in this transaction
        receipt = Committed(remote_id=_dotted(found_view), remote_version=_dotted(found_table))
        return _Written(receipt, undo=existing[1] if existing is not None else None)

    return write


def _delete_batch(batch: Batch) -> _Write:
    def write(cur: Cursor) -> _Written:
        where, params = batch.where()
        cur.execute(sql.SQL("DELETE FROM {} WHERE {}").format(_ident(batch.target), where), params)
        return _Written(Committed(remote_id=batch.remote_id, count=cur.rowcount))

    return write


def _drop_table(table: tuple[str, ...]) -> _Write:
    def write(cur: Cursor) -> _Written:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_ident(table).as_string(cur),))
        existed = bool(_one(cur)[0])
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(table)))
        return _Written(Committed(remote_id=_dotted(table), count=int(existed)))

    return write


def _relation(cur: Cursor, name: tuple[str, ...]) -> tuple[str, ...] | None:
    """``(schema, name)`` of the relation ``name`` resolves to at the target now (search_path applied), or None."""
    cur.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = to_regclass(%s)",
        (_ident(name).as_string(cur),),
    )
    row = cur.fetchone()
    return (str(row[0]), str(row[1])) if row is not None else None


def _view_reads(cur: Cursor, view: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The relations a view's rule reads (pg_depend of its pg_rewrite rule)."""
    cur.execute(
        "SELECT DISTINCT n.nspname, c.relname FROM pg_rewrite r "
        "JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid "
        "AND d.refclassid = 'pg_class'::regclass "
        "JOIN pg_class c ON c.oid = d.refobjid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE r.ev_class = to_regclass(%s) AND d.refobjid <> r.ev_class ORDER BY 1, 2",
        (_ident(view).as_string(cur),),
    )
    return [(str(schema), str(name)) for schema, name in cur.fetchall()]


def _batch_digest(cur: Cursor, table: tuple[str, ...], columns: list[str], batch: Batch) -> tuple[int, str]:
    where, params = batch.where()
    query = sql.SQL(_DIGEST).format(
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)), table=_ident(table), where=where
    )
    cur.execute(query, params)
    count, digest = _one(cur)
    return int(count), str(digest)


def _table_version(conn: Connection, table: tuple[str, ...]) -> str:
    """``rows:<n>:sha256:<hex>`` over every row's whole text, sorted bytewise, streamed (memory flat in the table)."""
    hasher, count = hashlib.sha256(), 0
    with conn.cursor(name="reckon_table_version") as cur:
        cur.itersize = 5000
        cur.execute(sql.SQL('SELECT t::text FROM {} AS t ORDER BY (t::text) COLLATE "C"').format(_ident(table)))
        for (text,) in cur:
            hasher.update(b"\n" if count else b"")
            hasher.update(str(text).encode())
            count += 1
    return f"rows:{count}:sha256:{hasher.hexdigest()}"


def _replayed(row: tuple[Any, ...], request: WriteRequest) -> Outcome:
    """A key the ledger already holds: its first answer again, for the same request only."""
    state, request_digest = row[0], row[1]
    if state == "committed" and request_digest != request.digest:
        return Failed("invalid_params", "this op key already committed another request: nothing written")
    return _answer(row)


def _answer(row: tuple[Any, ...]) -> Outcome:
    state, _, remote_id, remote_version, count, digest, data = row
    if state == "fenced":
        return Fenced()
    return Committed(
        remote_id=str(remote_id),
        remote_version=str(remote_version or ""),
        count=None if count is None else int(count),
        digest=str(digest or ""),
        data=dict(data or {}),
    )


def _rolled_back(exc: psycopg.Error, what: str = "rolled back") -> Failed:
    """A write that failed before its COMMIT was sent took no effect: classified by its SQLSTATE. Without one, the
    connection broke (the server rolls the open transaction back) or the client could not send the values."""
    state = exc.sqlstate or ""
    if not state:
        failure: FailureClass = (
            "dependency_unavailable" if isinstance(exc, psycopg.OperationalError) else "invalid_params"
        )
    else:
        failure = _BY_SQLSTATE.get(state) or _BY_CLASS.get(state[:2], "dependency_unavailable")
    return Failed(failure, f"{what}, no effect: {_say(exc)}")


def _check_op_key(op_key: str) -> None:
    if problem := op_key_problem(op_key):
        raise InvalidRequest(problem)


def _lock_key(op_key: str) -> str:
    return "reckon-op:" + op_key


def _one(cur: Cursor) -> tuple[Any, ...]:
    row = cur.fetchone()
    if row is None:
        raise psycopg.InterfaceError("the statement returned no row")
    return row


def _say(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


__all__ = ["Batch", "PostgresConnector", "rows_digest", "table_name"]
