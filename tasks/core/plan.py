"""The plan document: its schema and its validation, pure (no database). Proposing and accepting a plan:
tasks/engine/plans.py.

A plan document::

    {"nodes": [{"key": "copy-1", "action": "store.copy_batch", "depends_on": ["prepare"],
                "input": {"source": {"ref": {"source": "store", "locator": "proj/a", "version": "7", "digest": "…"}},
                          "target": {"from": "prepare", "field": "remote_id"}, "limit": 100},
                "evidence": {"remote_id": true, "count": 100, "digest": {"input": "source", "field": "digest"},
                             "remote_version": {"input": "source", "field": "version"}},
                "on_failure": {"invalid_params": "fail_task"}, "irreversible": false, "compensation": "",
                "rerun": "idempotent by op key", "max_attempts": 3}]}

Input values are literals, versioned references to external snapshots (``ref``: version required), or an
earlier node's structured output (``from`` an ancestor, ``field`` of its receipt) resolved by the
scheduler — never re-extracted from text. A node's input is capped (``NODE_INPUT_CAP_BYTES``): a reference,
not the content.

Every node states its evidence spec, ``"remote_id": true`` at least — approval nodes too: an approval's
receipt is the person's approval record (submitted with ``takeover_submit``), its remote id names that
record, and the spec may also pin what was approved (e.g. the source's version). ``on_failure`` may be left
out: the accepted node stores, for every failure class, the destination that applies — the node's own choice
or the default of ``tasks/core/failures.py``.
"""

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from audit.hygiene import NODE_INPUT_CAP_BYTES, PLAN_CAP_BYTES, canonical_json, check_payload
from tasks.core.actions import get_action, known_actions
from tasks.core.budget import PLAN_KEY, budget_ceiling, stated_budget
from tasks.core.errors import PlanInvalid
from tasks.core.failures import ALLOWED_DESTINATIONS, resolved_destinations
from tasks.core.inputs import REF_FIELDS, VERSIONED_REF, input_problems, node_output_value
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import RECEIPT_FIELDS

KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")


# Bounded so that the plan_accepted event (one entry per node) stays under the event payload cap.
MAX_NODES = 100


# What a later node may read of an earlier one's output (``from`` … ``field``): the receipt's fields.
OUTPUT_FIELDS = RECEIPT_FIELDS


# What a node's evidence spec may pin: the receipt's fields, the same names.
EVIDENCE_KEYS = RECEIPT_FIELDS


NODE_KEYS = {
    "key",
    "action",
    "depends_on",
    "input",
    "evidence",
    "on_failure",
    "irreversible",
    "compensation",
    "rerun",
    "max_attempts",
}


@dataclass(frozen=True)
class NodeSpec:
    key: str
    position: int
    action: str
    depends_on: list[str]
    input: dict[str, Any]
    evidence: dict[str, Any]
    on_failure: dict[str, str]
    irreversible: bool
    compensation: str
    rerun: str
    max_attempts: int

    @property
    def definition_digest(self) -> str:
        body = canonical_json({k: v for k, v in self.__dict__.items() if k != "position"})
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def validate_plan(document: Any) -> list[NodeSpec]:
    """Return the nodes in a dependency order, or raise PlanInvalid listing every problem found."""
    problems: list[str] = []
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list) or not document["nodes"]:
        raise PlanInvalid(["a plan is an object with a non-empty list 'nodes'"])
    raw_nodes: list[Any] = document["nodes"]
    if len(raw_nodes) > MAX_NODES:
        raise PlanInvalid(
            [
                f"a plan has at most {MAX_NODES} nodes, this one has {len(raw_nodes)}: give each node more to do (a "
                "larger batch, where the remote allows it) or split the work into several tasks"
            ]
        )
    by_key: dict[str, dict[str, Any]] = {}
    for index, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            problems.append(f"node #{index} is not an object")
            continue
        key = raw.get("key")
        if not isinstance(key, str) or not KEY_PATTERN.match(key):
            problems.append(f"node #{index}: key {key!r} must match {KEY_PATTERN.pattern}")
            continue
        if key in by_key:
            problems.append(f"node {key}: duplicate key")
            continue
        unknown = set(raw) - NODE_KEYS
        if unknown:
            problems.append(f"node {key}: unknown fields {sorted(unknown)}")
        by_key[key] = raw
    if problems:
        raise PlanInvalid(problems)

    for key, raw in by_key.items():
        problems.extend(_node_shape_problems(key, raw, by_key))
    if problems:
        raise PlanInvalid(problems)

    order = _topological_order(by_key)
    if order is None:
        raise PlanInvalid(["the plan has a cycle in depends_on"])
    ancestors = _ancestors(by_key, order)
    fields: list[tuple[str, str]] = []
    for key, raw in by_key.items():
        problems.extend(_input_problems(key, raw.get("input", {}), ancestors[key]))
        for name, wrong in _action_input_problems(raw):
            problems.append(f"node {key}: input {name} {wrong}")
            fields.append((f"nodes[{key}].input.{name}", f"{name} {wrong}"))
        problems.extend(_evidence_problems(key, raw.get("evidence", {}), raw.get("input", {})))
        action = get_action(raw["action"])
        if action is not None and action.kind == "approval" and raw.get("irreversible"):
            problems.append(f"node {key}: an approval node has no side effect to be irreversible")
        if raw.get("irreversible") and not raw.get("compensation"):
            confirmed = any((a := get_action(by_key[k]["action"])) and a.kind == "approval" for k in ancestors[key])
            if not confirmed:
                problems.append(
                    f"node {key}: irreversible without a compensation needs an approval node before it (in depends_on)"
                )
    try:
        stated_budget(document, len(by_key))
    except PlanInvalid as refused:
        problems.extend(refused.problems)
        fields.extend((PLAN_KEY, problem) for problem in refused.problems)
    if problems:
        raise PlanInvalid(problems, fields)
    try:
        # The plan revision's document, under its own larger cap: its events carry its digest only.
        check_payload(document, what="plan document", cap=PLAN_CAP_BYTES)
    except Exception as exc:
        raise PlanInvalid([str(exc)]) from exc
    default_attempts: int = settings.RECKON_DEFAULT_NODE_ATTEMPTS
    return [
        NodeSpec(
            key=key,
            position=position,
            action=by_key[key]["action"],
            depends_on=list(by_key[key].get("depends_on", [])),
            input=dict(by_key[key].get("input", {})),
            evidence=dict(by_key[key].get("evidence", {})),
            on_failure=resolved_destinations(by_key[key].get("on_failure", {})),
            irreversible=bool(by_key[key].get("irreversible", False)),
            compensation=by_key[key].get("compensation") or "",
            rerun=by_key[key].get("rerun") or "",
            max_attempts=int(by_key[key].get("max_attempts", default_attempts)),
        )
        for position, key in enumerate(order)
    ]


def _node_shape_problems(key: str, raw: dict[str, Any], by_key: dict[str, Any]) -> list[str]:
    problems = []
    action = raw.get("action")
    if not isinstance(action, str) or get_action(action) is None:
        problems.append(f"node {key}: unknown action {action!r} (known: {', '.join(known_actions())})")
    depends_on = raw.get("depends_on", [])
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        problems.append(f"node {key}: depends_on must be a list of node keys")
    else:
        for dep in depends_on:
            if dep == key:
                problems.append(f"node {key}: depends on itself")
            elif dep not in by_key:
                problems.append(f"node {key}: depends on unknown node {dep!r}")
    inputs = raw.get("input", {})
    if not isinstance(inputs, dict):
        problems.append(f"node {key}: input must be an object")
    elif (size := len(canonical_json(inputs).encode())) > NODE_INPUT_CAP_BYTES:
        problems.append(
            f"node {key}: input is {size} bytes, over the {NODE_INPUT_CAP_BYTES}-byte node input cap: "
            "give a versioned ref (or an earlier node's output), not the content"
        )
    if "evidence" not in raw:
        problems.append(f'node {key}: no evidence spec: say what its receipt must show, at least {{"remote_id": true}}')
    elif not isinstance(raw["evidence"], dict):
        problems.append(f"node {key}: evidence must be an object")
    on_failure = raw.get("on_failure", {})
    if not isinstance(on_failure, dict):
        problems.append(f"node {key}: on_failure must be an object")
    else:
        for cls, dest in on_failure.items():
            if cls not in FailureClass.__members__.values():
                problems.append(f"node {key}: on_failure names unknown failure class {cls!r}")
            elif not isinstance(dest, str) or dest not in ALLOWED_DESTINATIONS[FailureClass(cls)]:
                allowed = ALLOWED_DESTINATIONS[FailureClass(cls)]
                problems.append(f"node {key}: on_failure {cls} → {dest!r} not allowed (allowed: {', '.join(allowed)})")
    if not isinstance(raw.get("irreversible", False), bool):
        problems.append(f"node {key}: irreversible must be true or false")
    compensation = raw.get("compensation") or ""
    if compensation:
        compensating = get_action(compensation) if isinstance(compensation, str) else None
        if compensating is None:
            problems.append(f"node {key}: compensation names unknown action {compensation!r}")
        elif compensating.kind != "effect":
            problems.append(f"node {key}: compensation {compensation!r} has no side effect: it cannot undo anything")
    max_attempts = raw.get("max_attempts", 1)
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= 100:
        problems.append(f"node {key}: max_attempts must be an integer from 1 to 100")
    if not isinstance(raw.get("rerun", ""), str):
        problems.append(f"node {key}: rerun must be a sentence saying what running it again does")
    return problems


def _action_input_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, what is wrong) for the node's input against what its action takes (tasks/core/inputs.py)."""
    action = get_action(raw["action"])
    inputs = raw.get("input", {})
    if action is None or not isinstance(inputs, dict):
        return []
    return input_problems(action.inputs, inputs)


def _topological_order(by_key: dict[str, dict[str, Any]]) -> list[str] | None:
    """Kahn's algorithm, stable in document order; None when there is a cycle."""
    remaining = {key: set(raw.get("depends_on", [])) for key, raw in by_key.items()}
    order: list[str] = []
    while remaining:
        ready = [key for key, deps in remaining.items() if not deps]
        if not ready:
            return None
        for key in ready:
            order.append(key)
            del remaining[key]
        for deps in remaining.values():
            deps.difference_update(ready)
    return order


def _ancestors(by_key: dict[str, dict[str, Any]], order: list[str]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for key in order:
        found: set[str] = set()
        for dep in by_key[key].get("depends_on", []):
            found |= {dep} | result[dep]
        result[key] = found
    return result


def _input_problems(key: str, inputs: dict[str, Any], ancestors: set[str]) -> list[str]:
    problems = []
    for name, value in inputs.items():
        if isinstance(value, dict) and "ref" in value:
            ref = value["ref"]
            if not isinstance(ref, dict) or set(ref) - set(REF_FIELDS):
                problems.append(f"node {key}: input {name}: ref has fields {', '.join(REF_FIELDS)} only")
                continue
            for required in ("source", "locator", "version"):
                if not isinstance(ref.get(required), str) or not ref.get(required):
                    problems.append(f"node {key}: input {name}: ref needs a non-empty {required} (refs carry versions)")
            if not isinstance(ref.get("digest", ""), str):
                problems.append(f"node {key}: input {name}: a ref's digest is a string")
        elif isinstance(value, dict) and "from" in value:
            source, field_name = value.get("from"), value.get("field")
            if not isinstance(source, str) or source not in ancestors:
                problems.append(f"node {key}: input {name} reads from {source!r}, which is not a node it depends on")
            if not isinstance(field_name, str) or field_name not in OUTPUT_FIELDS:
                problems.append(f"node {key}: input {name}: field must be one of {', '.join(OUTPUT_FIELDS)}")
    return problems


def _evidence_problems(key: str, evidence: dict[str, Any], inputs: dict[str, Any]) -> list[str]:
    problems = []
    if "remote_id" not in evidence:
        problems.append(f'node {key}: evidence remote_id is always required: write "remote_id": true')
    for name, expected in evidence.items():
        if name not in EVIDENCE_KEYS:
            problems.append(f"node {key}: evidence {name!r} unknown (known: {', '.join(EVIDENCE_KEYS)})")
        elif name == "remote_id":
            if expected is not True:
                problems.append(f'node {key}: evidence remote_id is always required: write "remote_id": true')
        elif isinstance(expected, dict):
            source = expected.get("input")
            if not isinstance(source, str) or source not in inputs:
                problems.append(f"node {key}: evidence {name} reads unknown input {source!r}")
            elif isinstance(inputs[source], dict) and "ref" in inputs[source]:
                if not isinstance(expected.get("field"), str) or expected.get("field") not in REF_FIELDS:
                    problems.append(f"node {key}: evidence {name} from ref {source} needs field in {REF_FIELDS}")
            elif set(expected) - {"input"}:
                problems.append(f"node {key}: evidence {name} from a non-ref input takes no field")
        elif name == "count" and (not isinstance(expected, int) or isinstance(expected, bool) or expected < 0):
            problems.append(f"node {key}: evidence count must be a non-negative integer")
        elif name in ("digest", "remote_version") and (not isinstance(expected, str) or not expected):
            problems.append(f"node {key}: evidence {name} must be a non-empty string or an input reference")
    return problems


def plan_json_schema() -> dict[str, Any]:
    """The plan document as JSON Schema (the OpenAPI document's plan), made from this module's definitions
    (``tests/test_plan_schema.py`` holds the two together). What a schema cannot say ``validate_plan`` checks, and a
    plan the schema takes may still be refused (422 ``plan_invalid``, naming each problem): ``depends_on`` names
    nodes of the plan and has no cycle, a ``from`` reads a node this one depends on, evidence read ``from`` an input
    names one of the node's inputs, an irreversible node has a compensation or an approval before it, the caps in
    bytes (``NODE_INPUT_CAP_BYTES`` per node input, ``PLAN_CAP_BYTES`` per plan), and each action's input fields
    (``GET /api/v1/kinds/{kind}/actions``)."""
    node_key = {"type": "string", "pattern": KEY_PATTERN.pattern}
    from_input = {
        "type": "object",
        "description": "The value of one of the node's inputs: a ref's field (``field``), or a literal input whole.",
        "properties": {"input": {"type": "string"}, "field": {"enum": list(REF_FIELDS)}},
        "required": ["input"],
        "additionalProperties": False,
    }
    pinned = {"anyOf": [{"type": "string", "minLength": 1}, from_input]}
    evidence = {
        "remote_id": {"const": True, "description": "always required: the receipt names the remote's id"},
        "remote_version": pinned,
        "count": {"anyOf": [{"type": "integer", "minimum": 0}, from_input]},
        "digest": pinned,
    }
    node = {
        "key": node_key,
        "action": {
            "type": "string",
            "description": "An action the server knows, with its input fields: GET /api/v1/kinds/{kind}/actions.",
        },
        "depends_on": {"type": "array", "items": node_key, "description": "Keys of nodes that must succeed first."},
        "input": {
            "type": "object",
            "description": "What the action is given: literals, versioned refs or an earlier node's output "
            f"(at most {NODE_INPUT_CAP_BYTES} bytes of canonical JSON: a reference, not the content).",
            # A value holding "ref" is a versioned ref, one holding "from" an earlier node's output; anything else a
            # literal.
            "additionalProperties": {
                "properties": {"ref": VERSIONED_REF},
                "if": {"type": "object", "required": ["from"]},
                "then": {
                    "properties": {"from": {"type": "string"}, "field": {"enum": list(OUTPUT_FIELDS)}},
                    "required": ["field"],
                },
            },
            "examples": [
                {
                    "source": {"ref": {"source": "store", "locator": "proj/a", "version": "7"}},
                    "target": node_output_value(),
                    "limit": 100,
                }
            ],
        },
        "evidence": {
            "type": "object",
            "description": "What a receipt must show for the node to count as done.",
            "properties": {name: evidence[name] for name in EVIDENCE_KEYS},
            "required": ["remote_id"],
            "additionalProperties": False,
        },
        "on_failure": {
            "type": "object",
            "description": "Where a failure of each class goes (left out: the default, the first allowed).",
            "properties": {cls.value: {"enum": list(ALLOWED_DESTINATIONS[cls])} for cls in FailureClass},
            "additionalProperties": False,
        },
        "irreversible": {"type": "boolean", "description": "Its effect cannot be undone by running it again."},
        "compensation": {"type": "string", "description": "The effect action that undoes it (an irreversible node)."},
        "rerun": {"type": "string", "description": "What running it again does, in a sentence."},
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100, "description": "The node's attempt budget."},
    }
    return {
        "type": "object",
        "title": "Plan",
        "description": "The task's state machine: its nodes, each one bounded step with its evidence spec.",
        "properties": {
            "nodes": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_NODES,
                "items": {
                    "type": "object",
                    "properties": {name: node[name] for name in sorted(NODE_KEYS)},
                    "required": ["key", "action", "evidence"],
                    "additionalProperties": False,
                },
            },
            PLAN_KEY: {
                "type": "integer",
                "minimum": 1,
                "description": "The task's attempt budget: how many attempts (op keys sent) all its nodes may spend "
                f"together. Left out: {settings.RECKON_TASK_ATTEMPTS_PER_NODE} per node, at least "
                f"{settings.RECKON_DEFAULT_TASK_ATTEMPTS}. This deployment's policy: at most "
                f"{settings.RECKON_MAX_TASK_ATTEMPTS_PER_NODE} per node, at least {budget_ceiling(0)} "
                f"({budget_ceiling(100)} for 100 nodes). Attempts spent stay spent: a later plan sets the budget it "
                "states, never below what the task has used.",
            },
        },
        "required": ["nodes"],
    }


def collect_input_refs(specs: list[NodeSpec]) -> dict[str, dict[str, str]]:
    refs: dict[str, dict[str, str]] = {}
    for spec in specs:
        for name, value in spec.input.items():
            if isinstance(value, dict) and "ref" in value:
                refs[f"{spec.key}.{name}"] = dict(value["ref"])
    return refs
