"""The task kinds a connector is registered for on this server, by name: the read vocabulary (tasks/querysets.py)
asks which kinds Reckon's own workers serve without importing the engine. ``tasks.engine.registry`` owns the
registrations; its table is this one (the same dict), so the two never disagree."""

from typing import Any

# kind → its KindSpec (tasks.engine.registry); only the keys are read here.
SERVED: dict[str, Any] = {}


def served_kinds() -> list[str]:
    """The kinds with a connector on this server (their tasks are driven and cleaned by its workers)."""
    return sorted(SERVED)
