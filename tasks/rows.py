"""Rows as the step makes and names them, below every service: an unsaved row made without Model.__init__'s
general path, a copy of one, rows read by hand-written SQL made instances as the ORM makes them, a node's name in
the log, the task row or TaskNotFound."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, ClassVar

from django.db import DEFAULT_DB_ALIAS, connection, models
from django.db.models import signals
from django.db.models.base import ModelState

from tasks.core.errors import TaskNotFound
from tasks.models import Node, Task


def clone[M: models.Model](instance: M) -> M:
    """A copy of a model instance, as ``copy.copy`` makes it (its own state and relation cache, no peers) without
    the pickle protocol ``copy.copy`` goes through (a third of the time): the step copies rows it must not change
    under its caller."""
    new = instance.__class__.__new__(instance.__class__)
    new.__dict__ = instance.__dict__.copy()
    state = ModelState.__new__(ModelState)
    values = instance._state.__dict__.copy()
    values.pop("peers", None)  # as ModelState.__getstate__: weak references to the rows fetched with it
    values["fields_cache"] = instance._state.fields_cache.copy()
    state.__dict__ = values
    new._state = state
    return new


@cache
def _blank(model: type[models.Model]) -> tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    """A new row's values before any is given, as Model.__init__ takes them: fixed defaults, and the fields whose
    default is made anew for every row (``default=dict``)."""
    fixed: dict[str, Any] = {}
    made: list[tuple[str, Callable[[], Any]]] = []
    for field in model._meta.concrete_fields:
        if field.has_default() and callable(field.default):
            made.append((field.attname, field.default))
        else:
            fixed[field.attname] = field.get_default()
    return fixed, tuple(made)


def new_row[M: models.Model](
    model: type[M], values: dict[str, Any], related: dict[str, models.Model] | None = None
) -> M:
    """An unsaved row as ``model(**values)`` makes it, without Model.__init__'s general path (keyword matching,
    descriptors, signals: several times the cost, for rows the step makes on every commit). ``values`` by attribute
    name (``node_id``, not ``node``); ``related``: the rows behind foreign keys, cached as assigning them would.
    A model something listens to the init signals of is made by Model.__init__."""
    if (signals.pre_init.receivers or signals.post_init.receivers) and (
        signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model)
    ):
        row = model(**values)
        for name, value in (related or {}).items():
            setattr(row, name, value)
        return row
    fixed, made = _blank(model)
    row = model.__new__(model)
    fields = row.__dict__
    fields.update(fixed)
    for name, make in made:
        if name not in values:
            fields[name] = make()
    fields.update(values)
    row._state = ModelState()
    if related:
        row._state.fields_cache.update(related)
    return row


class Columns[M: models.Model]:
    """A model's concrete columns in order, and rows of them (read by hand-written SQL) turned into instances as the
    ORM turns them: each value through the converters the backend and the field apply (the ORM's compiler does the
    same)."""

    _made: ClassVar[dict[type[models.Model], "Columns[Any]"]] = {}

    def __init__(self, model: type[M]) -> None:
        self.model = model
        self.fields = tuple(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.converters = []
        for field in self.fields:
            col = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            self.converters.append((found, col))

    @classmethod
    def of(cls, model: type[M]) -> "Columns[M]":
        rows = cls._made.get(model)
        if rows is None:
            rows = cls._made[model] = cls(model)
        return rows

    def columns(self, alias: str) -> str:
        return ", ".join(f"{alias}.{connection.ops.quote_name(str(f.column))}" for f in self.fields)

    def instance(self, row: Sequence[Any]) -> M:
        values = [_converted(value, *found) for value, found in zip(row, self.converters, strict=False)]
        return self.model.from_db(DEFAULT_DB_ALIAS, self.attnames, values)

    def loaded(self, values: Mapping[str, Any]) -> M:
        """An instance with only ``values`` loaded (by attribute name, as the database gave them), each through its
        column's converters; any other field is read when first used, as ``QuerySet.only`` leaves it."""
        names, converted = [], []
        for attname, found in zip(self.attnames, self.converters, strict=True):  # from_db takes the model's order
            if attname in values:
                names.append(attname)
                converted.append(_converted(values[attname], *found))
        return self.model.from_db(DEFAULT_DB_ALIAS, names, converted)


def _converted(value: Any, converters: list[Any], col: Any) -> Any:
    for converter in converters:
        value = converter(value, col, connection)
    return value


def row_values(instance: models.Model, names: Iterable[str]) -> dict[str, Any]:
    """The instance's values for ``names`` (attribute names: ``node_id`` for a foreign key)."""
    return {name: getattr(instance, name) for name in names}


def node_ref(node: Node) -> str:
    return f"p{node.plan_version}/{node.key}"


def get_task(task_id: int) -> Task:
    """The task row, or TaskNotFound."""
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    return task
