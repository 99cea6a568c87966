"""The actions a plan may name. A plan naming anything else is refused (UnknownAction via PlanInvalid).

``kind`` is ``effect`` (one bounded external write through a connector) or ``approval`` (a confirmation
point: a person's approval is its receipt). Connectors that perform effects arrive with the runtime.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ActionSpec:
    name: str
    kind: str  # "effect" | "approval"
    description: str


_ACTIONS: dict[str, ActionSpec] = {}


def register_action(name: str, *, kind: str = "effect", description: str = "") -> ActionSpec:
    if kind not in ("effect", "approval"):
        raise ValueError(f"unknown action kind {kind!r}")
    spec = ActionSpec(name=name, kind=kind, description=description)
    _ACTIONS[name] = spec
    return spec


def get_action(name: str) -> ActionSpec | None:
    return _ACTIONS.get(name)


def known_actions() -> list[str]:
    return sorted(_ACTIONS)


register_action("approval", kind="approval", description="a person confirms before what follows may start")
# The object-store migration of the reference agent (see README).
register_action("store.prepare_target", description="create the target bucket/prefix for a project")
register_action("store.copy_batch", description="copy one batch of objects, bounded by the remote's transaction")
register_action("store.verify_digests", description="verify the digests of copied objects")
register_action("store.switch_reference", description="point the project's reference at the new location")
register_action("store.restore_reference", description="point the reference back (compensation of switch)")
register_action("store.delete_objects", description="delete objects by locator (cleanup, irreversible)")
