"""The actions a plan may name. A plan naming anything else is refused (UnknownAction via PlanInvalid).

``kind`` is ``effect`` (one bounded external write through a connector) or ``approval`` (a confirmation
point: a person's approval is its receipt). The domain registers only ``approval``; the apps that own the effects
register theirs at start-up (the reference agent's ``store.*``: ``reference/apps.py``), with their task kinds and
connectors (``tasks/engine/registry.py``).

An action declares the fields of a node's input it takes (``inputs``, tasks/core/inputs.py): a plan naming it with
anything else is refused, naming the node and the field. One that declares none takes any object.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from tasks.core.inputs import InputField, inputs_json_schema


@dataclass(frozen=True)
class ActionSpec:
    name: str
    kind: Literal["effect", "approval"]
    description: str
    inputs: Mapping[str, InputField] | None = None

    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of a node's ``input`` for this action."""
        return inputs_json_schema(self.inputs)


_ACTIONS: dict[str, ActionSpec] = {}


def register_action(
    name: str, *, kind: str = "effect", description: str = "", inputs: Mapping[str, InputField] | None = None
) -> ActionSpec:
    """Register (or replace) the action ``name``; ``inputs``: the fields of a node's input it takes (None: any)."""
    if kind not in ("effect", "approval"):
        raise ValueError(f"unknown action kind {kind!r}")
    spec = ActionSpec(name=name, kind=cast(Literal["effect", "approval"], kind), description=description, inputs=inputs)
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


def action_specs() -> list[ActionSpec]:
    """Every registered action, by name: what a plan of any task kind may name."""
    return [_ACTIONS[name] for name in known_actions()]


def approval_actions() -> tuple[str, ...]:
    """The registered actions of kind approval, sorted."""
    return tuple(name for name in known_actions() if is_approval(name))


register_action("approval", kind="approval", description="a person confirms before what follows may start")
