"""The step's writes as plain SQL, compiled once per shape: the ORM's query compiler cost more CPU per step than the
database did (profile in docs/benchmark.md). Only the compare-and-set uses this, for rows of known models and fields;
values are adapted by each model field (``get_db_prep_save``), so they are stored exactly as the ORM stores them.
"""

from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models

from leases.db import step_cursor


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


@cache
def _columns(model: type[models.Model], names: tuple[str, ...]) -> "tuple[tuple[str, models.Field[Any, Any]], ...]":
    fields = []
    for name in names:
        field = model._meta.get_field(name)
        if not isinstance(field, models.Field) or field.column is None:  # pragma: no cover - a programming error
            raise LookupError(f"{model.__name__}.{name} is not a column")
        fields.append((field.column, field))
    return tuple(fields)


class RawJSON(str):
    """JSON text already serialised (canonical): stored as it is, not serialised again by the field."""


# Fields that store an int, a str, a bool or None exactly as given, on every backend: such a value needs no
# adaptation (the field's own would return it unchanged). Anything else goes through the field.
_PLAIN_FIELDS = frozenset(
    {
        "CharField",
        "TextField",
        "IntegerField",
        "SmallIntegerField",
        "BigIntegerField",
        "PositiveIntegerField",
        "PositiveSmallIntegerField",
        "PositiveBigIntegerField",
        "BooleanField",
        "ForeignKey",
    }
)
_PLAIN_VALUES = frozenset({int, str, bool, type(None)})


_PLAIN, _AWARE_TIME = 1, 2


@cache
def _kinds(model: type[models.Model], names: tuple[str, ...], vendor: str) -> tuple[int, ...]:
    """Per field: _PLAIN (see _PLAIN_FIELDS), _AWARE_TIME (a DateTimeField on PostgreSQL, which takes an aware
    datetime as it is: the field's own adaptation returns it unchanged) or 0 (the field adapts every value)."""
    kinds = []
    for _column, field in _columns(model, names):
        internal = field.get_internal_type()
        kinds.append(
            _PLAIN
            if internal in _PLAIN_FIELDS
            else _AWARE_TIME
            if internal == "DateTimeField" and vendor == "postgresql"
            else 0
        )
    return tuple(kinds)


def _adapt(model: type[models.Model], names: tuple[str, ...], values: Iterable[Any]) -> list[Any]:
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: every attribute read through the proxy costs a lookup
    return [
        value
        if (kind == _PLAIN and type(value) in _PLAIN_VALUES)
        or (kind == _AWARE_TIME and type(value) is datetime and value.tzinfo is not None)
        else str(value)
        if isinstance(value, RawJSON)
        else field.get_db_prep_save(value, db)
        for (_column, field), kind, value in zip(
            _columns(model, names), _kinds(model, names, db.vendor), values, strict=True
        )
    ]


@cache
def _update_sql(model: type[models.Model], names: tuple[str, ...], where: str, increments: tuple[str, ...]) -> str:
    sets = [f"{_quote(column)} = %s" for column, _field in _columns(model, names)]
    sets += [f"{_quote(column)} = {_quote(column)} + 1" for column in increments]
    return f"UPDATE {_quote(model._meta.db_table)} SET {', '.join(sets)} WHERE {where}"  # noqa: S608


@cache
def _insert_sql(model: type[models.Model], names: tuple[str, ...], returning: bool) -> str:
    columns = ", ".join(_quote(column) for column, _field in _columns(model, names))
    values = ", ".join(["%s"] * len(names))
    tail = f" RETURNING {_quote(str(model._meta.pk.column))}" if returning else ""
    return f"INSERT INTO {_quote(model._meta.db_table)} ({columns}) VALUES ({values}){tail}"  # noqa: S608


REFUSED = "RK001"  # the SQLSTATE of reckon_refuse (tasks/migrations/0016_batch_refusal.py)


class PartRefused(Exception):
    """A part gated on the primary part matched nothing although the primary matched: the batch wrote nothing (the
    statement was aborted, or the caller's transaction is rolled back by this exception)."""

    def __init__(self, part: int) -> None:
        super().__init__(f"part {part} of the batch matched no row")
        self.part = part


type _Part = tuple[str, type[models.Model] | None, tuple[str, ...], str, tuple[str, ...], bool]


class Batch:
    """The writes of one compare-and-set, gated on its *primary* part (the task row's conditional UPDATE, the first
    part after the guard), which is itself gated on the guard (the caller's lease, checked and locked), if any.

    On PostgreSQL the batch is one statement of data-modifying CTEs — every part runs only if the one it is gated on
    matched its row — so a step's commit is one round trip; elsewhere the parts run one by one, stopping at the
    first gate that matched nothing. ``run`` gives per part: the guard's value (None when it matched nothing), the
    row count (updates), the new id (inserts; None when gated out) or the value a ``returning`` part returned.
    An update gated on the primary part that matches no row while the primary did raises PartRefused, with nothing
    written: on PostgreSQL the statement aborts itself (``reckon_refuse``), so a batch run on its own, outside a
    transaction, still lands whole or not at all."""

    def __init__(self) -> None:
        self._parts: list[_Part] = []
        self._values: list[tuple[list[Any], list[Any]]] = []

    def guard(self, sql: str, params: list[Any]) -> int:
        """A SELECT (PostgreSQL: FOR UPDATE) or an UPDATE … RETURNING of one value that must return a row for
        anything else to be written. First, and at most once."""
        if self._parts:
            raise ValueError("the guard is the batch's first part")
        return self._add(("guard", None, (), sql, (), True), [], params)

    def update(
        self,
        model: type[models.Model],
        fields: dict[str, Any],
        *,
        where: str,
        params: list[Any],
        increments: tuple[str, ...] = (),
    ) -> int:
        names = tuple(fields)
        values = _adapt(model, names, fields.values())
        return self._add(("update", model, names, where, increments, True), values, params)

    def insert(self, model: type[models.Model], fields: dict[str, Any], *, returning: bool = True) -> int:
        names = tuple(fields)
        return self._add(("insert", model, names, "", (), returning), _adapt(model, names, fields.values()), [])

    def returning(self, sql: str, params: list[Any], *, value: str) -> int:
        """An UPDATE whose WHERE clause ends ``sql``, gated on the primary part; its result is ``value`` of the row
        it updated."""
        return self._add(("returning", None, (), sql, (value,), True), [], params)

    def _add(self, part: _Part, values: list[Any], params: list[Any]) -> int:
        self._parts.append(part)
        self._values.append((values, params))
        return len(self._parts) - 1

    def run(self) -> list[Any]:
        if connection.vendor == "postgresql":
            return self._run_as_one()
        results: list[Any] = []
        primary = _primary(self._parts)
        with connection.cursor() as cursor:
            for index, (part, (values, params)) in enumerate(zip(self._parts, self._values, strict=True)):
                kind, model, names, where, extra, returning = part
                gate = None if index == 0 else 0 if index == primary else primary
                if gate is not None and not _matched(self._parts[gate][0], results[gate]):
                    results.append(0 if kind == "update" else None)
                    continue
                if kind == "guard":
                    cursor.execute(where, params)
                    row = cursor.fetchone()
                    results.append(None if row is None else row[0])
                elif kind == "returning":
                    cursor.execute(f"{where} RETURNING {extra[0]}", params)
                    row = cursor.fetchone()
                    results.append(None if row is None else row[0])
                elif kind == "update":
                    cursor.execute(_update_sql(_table(model), names, where, extra), [*values, *params])
                    results.append(int(cursor.rowcount))
                    if index > primary and results[-1] != 1:
                        raise PartRefused(index)
                else:
                    cursor.execute(_insert_sql(_table(model), names, returning), values)
                    results.append(int(cursor.fetchone()[0]) if returning else 1)
        return results

    def _run_as_one(self) -> list[Any]:
        shape = tuple(self._parts)
        params: list[Any] = []
        for values, where_params in self._values:
            params += [*values, *where_params]
        try:
            with step_cursor() as cursor:
                cursor.execute(_batch_sql(shape), params)
                row = cursor.fetchone()[1:]
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != REFUSED:
                raise
            raise PartRefused(int(str(exc.__cause__.diag.message_primary or "").rsplit(" ", 1)[-1])) from exc  # type: ignore[union-attr]
        return [
            value if kind in ("guard", "returning") or value is None else int(value)
            for (kind, *_rest), value in zip(self._parts, row, strict=True)
        ]


def _primary(parts: "list[_Part] | tuple[_Part, ...]") -> int:
    """The index of the primary part: the first after the guard, if there is one."""
    return 1 if parts and parts[0][0] == "guard" else 0


def _table(model: type[models.Model] | None) -> type[models.Model]:
    if model is None:  # pragma: no cover - only guard and returning parts have none
        raise ValueError("this part writes no model's row")
    return model


def _matched(kind: str, result: Any) -> bool:
    return result == 1 if kind == "update" else result is not None


@cache
def _batch_sql(parts: tuple[_Part, ...]) -> str:
    primary = _primary(parts)
    ctes, selects, refusals = [], [], []
    for index, (kind, model, names, where, extra, _returning) in enumerate(parts):
        gate = "" if index == 0 else f"EXISTS (SELECT 1 FROM p{0 if index == primary else primary})"  # noqa: S608
        if kind == "guard":
            ctes.append(f"p{index} AS MATERIALIZED ({where})")
            selects.append(f"(SELECT * FROM p{index})")  # noqa: S608
            continue
        if kind == "returning":
            statement = f"{where} AND {gate} RETURNING {extra[0]} AS x"
            selects.append(f"(SELECT x FROM p{index})")  # noqa: S608
        elif kind == "update":
            gated = f"{where} AND {gate}" if gate else where
            statement = _update_sql(_table(model), names, gated, extra) + " RETURNING 1 AS x"
            selects.append(f"(SELECT count(*) FROM p{index})")  # noqa: S608
            if index > primary:
                refusals.append(
                    f"WHEN (SELECT count(*) FROM p{index}) <> 1 THEN reckon_refuse('batch part {index}')"  # noqa: S608
                )
        else:
            model = _table(model)
            columns = ", ".join(_quote(column) for column, _field in _columns(model, names))
            # INSERT … SELECT types its values on their own, not from the columns: say each column's type.
            values = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for _column, field in _columns(model, names))
            gate_where = f" WHERE {gate}" if gate else ""
            pk = _quote(str(model._meta.pk.column))
            table = _quote(model._meta.db_table)
            statement = f"INSERT INTO {table} ({columns}) SELECT {values}{gate_where} RETURNING {pk} AS x"
            selects.append(f"(SELECT x FROM p{index})")  # noqa: S608
        ctes.append(f"p{index} AS ({statement})")
    # First column: the check that every update gated on the primary matched its row once the primary did; else the
    # statement aborts, and with it everything the CTEs wrote.
    check = f"CASE WHEN NOT EXISTS (SELECT 1 FROM p{primary}) THEN 0 {' '.join(refusals)} ELSE 0 END"  # noqa: S608
    return "WITH " + ", ".join(ctes) + f" SELECT {check}, " + ", ".join(selects)
