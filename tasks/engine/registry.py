"""Task kinds and the connector that drives each, registered by the app that owns the kind at start-up (the
reference agents: ``reference/apps.py``). The domain never imports an agent: a worker asks ``connector_for(kind)``.

    register_kind("migrate_project", connector=lambda: ObjectStoreConnector(settings.RECKON_OBJECTSTORE_URL))
    connector = connector_for(task.kind)  # a fresh connector from the kind's factory; UnknownTaskKind if none

The actions a plan may name are registered the same way, with ``tasks.core.actions.register_action``.
"""

from collections.abc import Callable
from dataclasses import dataclass

from tasks.core import kinds
from tasks.core.errors import UnknownTaskKind
from tasks.engine.connectors import Connector


@dataclass(frozen=True)
class KindSpec:
    kind: str
    connector: Callable[[], Connector]  # a factory: called once per wake-up, so settings are read when it runs


_KINDS: dict[str, KindSpec] = kinds.SERVED  # one table: tasks.core.kinds reads its names


def register_kind(kind: str, *, connector: Callable[[], Connector]) -> KindSpec:
    """Register (or replace) ``kind`` with the factory of its connector."""
    if not kind:
        raise ValueError("a task kind must not be empty")
    spec = KindSpec(kind=kind, connector=connector)
    _KINDS[kind] = spec
    return spec


def connector_for(kind: str) -> Connector:
    """A connector for a task of ``kind``, built by the registered factory; UnknownTaskKind if none is."""
    spec = _KINDS.get(kind)
    if spec is None:
        raise UnknownTaskKind(f"no connector is registered for task kind {kind!r}", kind=kind)
    return spec.connector()


def known_kinds() -> list[str]:
    return sorted(_KINDS)
