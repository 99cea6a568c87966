"""What an action takes as a node's input: its fields, declared once, checked when a plan is proposed and served as
JSON Schema (``GET /api/v1/kinds/{kind}/actions``). Pure: no database.

A node's input value is one of three forms (tasks/core/plan.py): a literal; ``{"ref": {source, locator, version,
digest?}}``, a versioned reference to an external snapshot; or ``{"from": <an earlier node>, "field": <a receipt
field>}``, an earlier node's structured output that the scheduler resolves. A field of type ``ref`` takes only a ref;
any other field takes a literal of its type or an earlier node's output of that type.

    inputs = {"target": InputField("string", "the target's id"), "source": InputField("ref", "what to copy"),
              "limit": InputField("integer", "objects in the batch", minimum=1)}
    input_problems(inputs, {"target": 3, "source": {"ref": {...}}})  # [("target", "must be a string, not 3"), ...]
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tasks.core.outcomes import RECEIPT_FIELD_TYPES

InputType = Literal["string", "integer", "boolean", "object", "ref"]

REF_FIELDS = ("source", "locator", "version", "digest")
REF_REQUIRED = ("source", "locator", "version")

# What a later node may read of an earlier one's output (``from`` … ``field``): the receipt's fields, with their type.
OUTPUT_TYPES: Mapping[str, InputType] = RECEIPT_FIELD_TYPES

_NAMED = {"string": "a string", "integer": "an integer", "boolean": "true or false", "object": "an object"}
_JSON_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
}


@dataclass(frozen=True)
class InputField:
    type: InputType
    description: str
    required: bool = True
    minimum: int | None = None  # integers only

    def json_schema(self) -> dict[str, Any]:
        if self.type == "ref":
            return {"description": self.description, **VERSIONED_REF_VALUE}
        literal: dict[str, Any] = {"type": self.type}
        if self.minimum is not None:
            literal["minimum"] = self.minimum
        outputs = [name for name, kind in OUTPUT_TYPES.items() if kind == self.type]
        forms = [literal] + ([node_output_value(outputs)] if outputs else [])
        if self.type == "integer":  # a fan-out node's input: each batch's own number (tasks/core/plan.py)
            forms.append(BATCH_VALUE)
        if len(forms) == 1:
            return {"description": self.description, **literal}
        return {"description": self.description, "anyOf": forms}


# A value a fan-out node's input gives each of its batches (tasks/core/plan.py): the batch's number (from 1), its
# first item (from 0) or its size.
EACH_VALUES = ("index", "offset", "size")
BATCH_VALUE: dict[str, Any] = {
    "type": "object",
    "description": "In a fan-out node's input: each batch's own number (index, from 1), first item (offset, from 0) "
    "or size.",
    "properties": {"each": {"enum": list(EACH_VALUES)}},
    "required": ["each"],
    "additionalProperties": False,
}


VERSIONED_REF: dict[str, Any] = {
    "type": "object",
    "description": "An immutable snapshot of an external source: its version is required (refs carry versions).",
    "properties": {
        name: {"type": "string", **({"minLength": 1} if name in REF_REQUIRED else {})} for name in REF_FIELDS
    },
    "required": list(REF_REQUIRED),
    "additionalProperties": False,
}
VERSIONED_REF_VALUE: dict[str, Any] = {
    "type": "object",
    "properties": {"ref": VERSIONED_REF},
    "required": ["ref"],
    "additionalProperties": False,
}


def node_output_value(fields: list[str] | None = None) -> dict[str, Any]:
    """The JSON Schema of ``{"from": <node key>, "field": <receipt field>}`` (``fields``: those allowed here)."""
    return {
        "type": "object",
        "description": "An earlier node's output (a node this one depends on, directly or not): its receipt's field.",
        "properties": {"from": {"type": "string"}, "field": {"enum": fields or list(OUTPUT_TYPES)}},
        "required": ["from", "field"],
        "additionalProperties": False,
    }


def inputs_json_schema(inputs: Mapping[str, InputField] | None) -> dict[str, Any]:
    """The JSON Schema of a node's ``input`` for an action taking ``inputs`` (None: it declares none, any object)."""
    if inputs is None:
        return {"type": "object", "description": "This action declares no input fields: any object is taken."}
    return {
        "type": "object",
        "properties": {name: field.json_schema() for name, field in inputs.items()},
        "required": [name for name, field in inputs.items() if field.required],
        "additionalProperties": False,
    }


def input_problems(inputs: Mapping[str, InputField] | None, values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, what is wrong) for each field of ``values`` that ``inputs`` does not take; empty when it takes them
    all. The forms themselves (a ref's fields, which node a ``from`` reads) are checked by tasks/core/plan.py."""
    if inputs is None:
        return []
    problems = [(name, "is required") for name, field in inputs.items() if field.required and name not in values]
    for name, value in values.items():
        field = inputs.get(name)
        if field is None:
            problems.append((name, f"is not an input of this action (its inputs: {', '.join(inputs) or 'none'})"))
        elif (wrong := _value_problem(field, value)) is not None:
            problems.append((name, wrong))
    return problems


def _value_problem(field: InputField, value: Any) -> str | None:
    is_ref = isinstance(value, dict) and "ref" in value
    if field.type == "ref":
        return None if is_ref else 'must be a versioned ref: {"ref": {"source", "locator", "version"}}'
    if is_ref:
        return f"must be {_NAMED[field.type]}, not a ref"
    if isinstance(value, dict) and "from" in value:
        read = value.get("field")
        if isinstance(read, str) and read in OUTPUT_TYPES and OUTPUT_TYPES[read] != field.type:
            return f"must be {_NAMED[field.type]}: the output field {read!r} is {_NAMED[OUTPUT_TYPES[read]]}"
        return None
    expected = _JSON_TYPES[field.type]
    if not isinstance(value, expected) or (field.type == "integer" and isinstance(value, bool)):
        return f"must be {_NAMED[field.type]}, not {_shown(value)}"
    if field.minimum is not None and isinstance(value, int) and value < field.minimum:
        return f"must be at least {field.minimum}, not {value}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
