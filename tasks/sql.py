"""The step's writes as plain SQL, compiled once per shape: the ORM's query compiler cost more CPU per step than the
database did (profile in the README). Only the compare-and-set uses this, for rows of known models and fields;
values are adapted by each model field (``get_db_prep_save``), so they are stored exactly as the ORM stores them.
"""

from collections.abc import Iterable
from functools import cache
from typing import Any

from django.db import connection, models


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


def _adapt(model: type[models.Model], names: tuple[str, ...], values: Iterable[Any]) -> list[Any]:
    return [
        field.get_db_prep_save(value, connection)
        for (_column, field), value in zip(_columns(model, names), values, strict=True)
    ]


@cache
def _update_sql(model: type[models.Model], names: tuple[str, ...], where: str, increments: tuple[str, ...]) -> str:
    sets = [f"{_quote(column)} = %s" for column, _field in _columns(model, names)]
    sets += [f"{_quote(column)} = {_quote(column)} + 1" for column in increments]
    return f"UPDATE {_quote(model._meta.db_table)} SET {', '.join(sets)} WHERE {where}"  # noqa: S608


def update(
    model: type[models.Model],
    fields: dict[str, Any],
    *,
    where: str,
    params: list[Any],
    increments: tuple[str, ...] = (),
) -> int:
    """``UPDATE <model> SET fields… [, column = column + 1…] WHERE <where>``; the row count. ``where`` is SQL with
    ``%s`` placeholders, written in this codebase (never text from outside), its values in ``params``."""
    names = tuple(fields)
    sql = _update_sql(model, names, where, increments)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*_adapt(model, names, fields.values()), *params])
        return int(cursor.rowcount)


@cache
def _insert_sql(model: type[models.Model], names: tuple[str, ...], returning: bool) -> str:
    columns = ", ".join(_quote(column) for column, _field in _columns(model, names))
    values = ", ".join(["%s"] * len(names))
    tail = f" RETURNING {_quote(str(model._meta.pk.column))}" if returning else ""
    return f"INSERT INTO {_quote(model._meta.db_table)} ({columns}) VALUES ({values}){tail}"  # noqa: S608


def insert(model: type[models.Model], fields: dict[str, Any], *, returning: bool = True) -> int | None:
    """``INSERT INTO <model> (fields…) VALUES (…) [RETURNING id]``; the new primary key when asked."""
    names = tuple(fields)
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(model, names, returning), _adapt(model, names, fields.values()))
        return int(cursor.fetchone()[0]) if returning else None


def row_values(instance: models.Model, names: Iterable[str]) -> dict[str, Any]:
    """The instance's values for ``names`` (attribute names: ``node_id`` for a foreign key)."""
    return {name: getattr(instance, name) for name in names}
