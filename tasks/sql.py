"""The step's writes as plain SQL, compiled once per shape: the ORM's query compiler cost more CPU per step than the
database did (profile in the README). Only the compare-and-set uses this, for rows of known models and fields;
values are adapted by each model field (``get_db_prep_save``), so they are stored exactly as the ORM stores them.
"""

import copy
from collections.abc import Iterable
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models

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


@cache
def _plain(model: type[models.Model], names: tuple[str, ...]) -> tuple[bool, ...]:
    return tuple(field.get_internal_type() in _PLAIN_FIELDS for _column, field in _columns(model, names))


def _adapt(model: type[models.Model], names: tuple[str, ...], values: Iterable[Any]) -> list[Any]:
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: every attribute read through the proxy costs a lookup
    return [
        value
        if plain and type(value) in _PLAIN_VALUES
        else str(value)
        if isinstance(value, RawJSON)
        else field.get_db_prep_save(value, db)
        for (_column, field), plain, value in zip(_columns(model, names), _plain(model, names), values, strict=True)
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


def clone[M: models.Model](instance: M) -> M:
    """A copy of a model instance, as ``copy.copy`` makes it (its own state and relation cache) without the pickle
    protocol ``copy.copy`` goes through: the step copies rows it must not change under its caller."""
    new = instance.__class__.__new__(instance.__class__)
    new.__dict__ = instance.__dict__.copy()
    new._state = copy.copy(instance._state)
    new._state.fields_cache = instance._state.fields_cache.copy()
    return new


def row_values(instance: models.Model, names: Iterable[str]) -> dict[str, Any]:
    """The instance's values for ``names`` (attribute names: ``node_id`` for a foreign key)."""
    return {name: getattr(instance, name) for name in names}


class Batch:
    """The writes of one compare-and-set, gated on the first (the task row's conditional UPDATE): on PostgreSQL one
    statement of data-modifying CTEs — every later part runs only if the first matched its row — so a step's commit
    costs one round trip after the lease check; elsewhere the parts run one by one, stopping if the first matched
    nothing. ``run`` gives per part the row count (updates) or the new id (inserts; None when gated out)."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, type[models.Model], tuple[str, ...], str, tuple[str, ...], bool]] = []
        self._values: list[tuple[list[Any], list[Any]]] = []

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
        self._parts.append(("update", model, names, where, increments, True))
        self._values.append((_adapt(model, names, fields.values()), params))
        return len(self._parts) - 1

    def insert(self, model: type[models.Model], fields: dict[str, Any], *, returning: bool = True) -> int:
        names = tuple(fields)
        self._parts.append(("insert", model, names, "", (), returning))
        self._values.append((_adapt(model, names, fields.values()), []))
        return len(self._parts) - 1

    def run(self) -> list[int | None]:
        if connection.vendor == "postgresql":
            return self._run_as_one()
        results: list[int | None] = []
        with connection.cursor() as cursor:
            for index, ((kind, model, names, where, increments, returning), (values, params)) in enumerate(
                zip(self._parts, self._values, strict=True)
            ):
                if index and results[0] != 1:
                    results.append(None if kind == "insert" else 0)
                    continue
                if kind == "update":
                    cursor.execute(_update_sql(model, names, where, increments), [*values, *params])
                    results.append(int(cursor.rowcount))
                else:
                    cursor.execute(_insert_sql(model, names, returning), values)
                    results.append(int(cursor.fetchone()[0]) if returning else 1)
        return results

    def _run_as_one(self) -> list[int | None]:
        shape = tuple(self._parts)
        params: list[Any] = []
        for (kind, *_rest), (values, where_params) in zip(self._parts, self._values, strict=True):
            params += [*values, *where_params] if kind == "update" else values
        with step_cursor() as cursor:
            cursor.execute(_batch_sql(shape), params)
            row = cursor.fetchone()
        return [None if value is None else int(value) for value in row]


@cache
def _batch_sql(shape: tuple[tuple[str, type[models.Model], tuple[str, ...], str, tuple[str, ...], bool], ...]) -> str:
    ctes, selects = [], []
    for index, (kind, model, names, where, increments, _returning) in enumerate(shape):
        gate = "" if index == 0 else " AND EXISTS (SELECT 1 FROM p0)"
        if kind == "update":
            statement = _update_sql(model, names, where + gate if gate else where, increments) + " RETURNING 1 AS x"
            selects.append(f"(SELECT count(*) FROM p{index})")  # noqa: S608
        else:
            columns = ", ".join(_quote(column) for column, _field in _columns(model, names))
            # INSERT … SELECT types its values on their own, not from the columns: say each column's type.
            values = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for _column, field in _columns(model, names))
            gate_where = " WHERE EXISTS (SELECT 1 FROM p0)" if index else ""
            pk = _quote(str(model._meta.pk.column))
            table = _quote(model._meta.db_table)
            statement = f"INSERT INTO {table} ({columns}) SELECT {values}{gate_where} RETURNING {pk} AS x"
            selects.append(f"(SELECT x FROM p{index})")  # noqa: S608
        ctes.append(f"p{index} AS ({statement})")
    return "WITH " + ", ".join(ctes) + " SELECT " + ", ".join(selects)
