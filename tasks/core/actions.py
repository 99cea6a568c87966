"""The actions a plan may name. A plan naming anything else is refused (UnknownAction via PlanInvalid).

``kind`` is ``effect`` (one bounded external write through a connector) or ``approval`` (a confirmation
point: a person's approval is its receipt). The domain registers only ``approval``; the apps that own the effects
register theirs at start-up (the reference agent's ``store.*``: ``agents/apps.py``), with their task kinds and
connectors (``tasks/engine/registry.py``).
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


def is_approval(action: str) -> bool:
    """Whether a node naming ``action`` is an approval (a person's approval record is its receipt)."""
    spec = _ACTIONS.get(action)
    return spec is not None and spec.kind == "approval"


def known_actions() -> list[str]:
    return sorted(_ACTIONS)


def approval_actions() -> tuple[str, ...]:
    """The registered actions of kind approval, sorted."""
    return tuple(name for name in known_actions() if is_approval(name))


register_action("approval", kind="approval", description="a person confirms before what follows may start")
