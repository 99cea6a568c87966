"""A task kind registered for the length of a test: the registry as it was before comes back afterwards, so a test's
kind never leaks into the next (the registry itself has no way to forget a kind: nothing in production needs one)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tasks.engine import registry
from tasks.engine.connectors import Connector


@contextmanager
def kind_registered(kind: str, *, connector: Callable[[], Connector]) -> Iterator[None]:
    before = registry._KINDS.get(kind)
    registry.register_kind(kind, connector=connector)
    try:
        yield
    finally:
        if before is None:
            registry._KINDS.pop(kind, None)
        else:
            registry._KINDS[kind] = before
