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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from audit.hygiene import NODE_INPUT_CAP_BYTES, PLAN_CAP_BYTES, canonical_json, check_payload
from tasks.core.actions import get_action, known_actions
from tasks.core.budget import PLAN_KEY, budget_ceiling, stated_budget
from tasks.core.errors import PlanInvalid
from tasks.core.failures import ALLOWED_DESTINATIONS, resolved_destinations
from tasks.core.inputs import EACH_VALUES, REF_FIELDS, VERSIONED_REF, input_problems, node_output_value
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import RECEIPT_FIELDS

KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")


# The most nodes a plan has once its fan-out nodes are expanded: a task's nodes are rows, read by position; no event
# lists them (plan_accepted names the plan's digest, the nodes derive from the stored document).
MAX_NODES = 20_000  # a million objects in batches of 100 is 10,003 nodes


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
    "fan_out",
}

# A fan-out node stands for one node per batch of a counted source: ``"fan_out": {"total": 1000000, "batch": 100}``
# is 10,000 nodes ``<key>-1`` … ``<key>-10000``, each with the input given, where a value ``{"each": "index"}`` is
# the batch's number (from 1), ``{"each": "offset"}`` its first item (from 0) and ``{"each": "size"}`` its size (the
# last batch holds the rest). A node that depends on the fan-out node's key depends on every one of them. The
# expansion is a function of the document, so the document (stored once, by digest) defines every node.


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
        raise PlanInvalid([_too_many(len(raw_nodes))])
    raw_nodes = _expanded(raw_nodes)
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
    ancestors = _Ancestors(by_key, order)
    approvals = ancestors.mask(
        key for key, raw in by_key.items() if (a := get_action(raw["action"])) and a.kind == "approval"
    )
    fields: list[tuple[str, str]] = []
    for key, raw in by_key.items():
        problems.extend(_input_problems(key, raw.get("input", {}), ancestors.of(key)))
        for name, wrong in _action_input_problems(raw):
            problems.append(f"node {key}: input {name} {wrong}")
            fields.append((f"nodes[{key}].input.{name}", f"{name} {wrong}"))
        problems.extend(_evidence_problems(key, raw.get("evidence", {}), raw.get("input", {})))
        action = get_action(raw["action"])
        if action is not None and action.kind == "approval" and raw.get("irreversible"):
            problems.append(f"node {key}: an approval node has no side effect to be irreversible")
        if raw.get("irreversible") and not raw.get("compensation") and not ancestors.bits[key] & approvals:
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


def _too_many(nodes: int) -> str:
    return (
        f"a plan has at most {MAX_NODES} nodes, this one has {nodes}: give each node more to do (a larger batch, "
        "where the remote allows it) or split the work into several tasks"
    )


def _expanded(raw_nodes: list[Any]) -> list[Any]:
    """The plan's nodes with each fan-out node replaced by its members (the module's ``EACH_VALUES``), and every
    ``depends_on`` naming a fan-out node by the names of its members. Counted before anything is built: a fan-out
    past the node cap is refused by its size."""
    members: dict[str, list[str]] = {}
    total = 0
    problems: list[str] = []
    for index, raw in enumerate(raw_nodes):
        spec = raw.get("fan_out") if isinstance(raw, dict) else None
        if spec is None:
            total += 1
            continue
        key = raw.get("key")
        count = _fan_out_count(spec)
        if isinstance(count, str):
            problems.append(f"node {key if isinstance(key, str) else f'#{index}'}: fan_out {count}")
            continue
        total += count
        if isinstance(key, str) and KEY_PATTERN.match(key):
            members[key] = [f"{key}-{n}" for n in range(1, count + 1)]
    if problems:
        raise PlanInvalid(problems)
    if total > MAX_NODES:
        raise PlanInvalid([_too_many(total)])
    if not members:
        return raw_nodes
    expanded: list[Any] = []
    for raw in raw_nodes:
        if isinstance(raw, dict) and isinstance(raw.get("depends_on"), list):
            deps = [member for dep in raw["depends_on"] for member in members.get(dep, [dep])]
            raw = {**raw, "depends_on": deps}
        spec = raw.get("fan_out") if isinstance(raw, dict) else None
        if spec is None or raw.get("key") not in members:
            expanded.append(raw)
            continue
        template = {name: value for name, value in raw.items() if name != "fan_out"}
        inputs = template.get("input", {})
        size, batch = spec["total"], spec["batch"]
        for n, member in enumerate(members[raw["key"]], start=1):
            each = {"index": n, "offset": (n - 1) * batch, "size": min(batch, size - (n - 1) * batch)}
            if isinstance(inputs, dict):
                template["input"] = {name: _each_value(value, each) for name, value in inputs.items()}
            expanded.append({**template, "key": member})
    return expanded


def _fan_out_count(spec: Any) -> int | str:
    """How many nodes a fan-out stands for, or what is wrong with it."""
    if not isinstance(spec, dict) or set(spec) != {"total", "batch"}:
        return 'must be {"total": <items>, "batch": <items per node>}'
    for name in ("total", "batch"):
        value = spec[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} must be a whole number of at least 1, not {value!r}"
    total, batch = int(spec["total"]), int(spec["batch"])
    return -(-total // batch)


def _each_value(value: Any, each: dict[str, int]) -> Any:
    if isinstance(value, dict) and set(value) == {"each"} and value["each"] in each:
        return each[value["each"]]
    return value


def _topological_order(by_key: dict[str, dict[str, Any]]) -> list[str] | None:
    """Kahn's algorithm in layers, each in document order (a node comes in the layer after its last dependency's);
    None when there is a cycle. Linear in nodes and edges."""
    index = {key: n for n, key in enumerate(by_key)}
    waiting: dict[str, int] = {}
    dependents: dict[str, list[str]] = {key: [] for key in by_key}
    for key, raw in by_key.items():
        deps = set(raw.get("depends_on", []))
        waiting[key] = len(deps)
        for dep in deps:
            dependents[dep].append(key)
    layer = [key for key in by_key if not waiting[key]]
    order: list[str] = []
    while layer:
        order += layer
        ready = []
        for key in layer:
            for dependent in dependents[key]:
                waiting[dependent] -= 1
                if not waiting[dependent]:
                    ready.append(dependent)
        layer = sorted(ready, key=index.__getitem__)
    return order if len(order) == len(by_key) else None


class _Ancestors:
    """Every node's ancestors as a bit set (bit n: the n-th node of the document): a chain of 10,000 nodes holds
    10,000 sets of up to 10,000 bits, not 50 million strings (the plan cap holds about 2,800 chained nodes)."""

    def __init__(self, by_key: dict[str, dict[str, Any]], order: list[str]) -> None:
        self.index = {key: n for n, key in enumerate(by_key)}
        self.bits: dict[str, int] = {}
        for key in order:
            found = 0
            for dep in by_key[key].get("depends_on", []):
                found |= 1 << self.index[dep] | self.bits[dep]
            self.bits[key] = found

    def mask(self, keys: Any) -> int:
        found = 0
        for key in keys:
            found |= 1 << self.index[key]
        return found

    def of(self, key: str) -> Callable[[Any], bool]:
        bits, index = self.bits[key], self.index
        return lambda other: isinstance(other, str) and other in index and bool(bits >> index[other] & 1)


def _input_problems(key: str, inputs: dict[str, Any], is_ancestor: Callable[[Any], bool]) -> list[str]:
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
        elif isinstance(value, dict) and set(value) == {"each"}:
            problems.append(
                f'node {key}: input {name}: {{"each": …}} is a fan-out node\'s batch value, one of '
                f"{', '.join(EACH_VALUES)} (this node has no fan_out, or names another)"
            )
        elif isinstance(value, dict) and "from" in value:
            source, field_name = value.get("from"), value.get("field")
            if not is_ancestor(source):
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
        "fan_out": {
            "type": "object",
            "description": "One node per batch: total items in batches of batch, nodes <key>-1 … <key>-n, each with "
            'this input where a value {"each": "index"|"offset"|"size"} is the batch\'s number (from 1), first item '
            "(from 0) or size. A node depending on this key depends on all of them; at most "
            f"{MAX_NODES} nodes in the plan once expanded.",
            "properties": {"total": {"type": "integer", "minimum": 1}, "batch": {"type": "integer", "minimum": 1}},
            "required": ["total", "batch"],
            "additionalProperties": False,
        },
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
    """The plan's versioned refs, each once, named by the first input that reads it (``<node>.<input>``): what an
    agent handed a task back confirms the versions of. A ref 10,000 batches read is one ref to confirm."""
    refs: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for spec in specs:
        for name, value in spec.input.items():
            if isinstance(value, dict) and "ref" in value:
                ref = dict(value["ref"])
                identity = canonical_json(ref)
                if identity not in seen:
                    seen.add(identity)
                    refs[f"{spec.key}.{name}"] = ref
    return refs


def kept_keys(specs: list[NodeSpec], succeeded: Mapping[str, str]) -> set[str]:
    """THE rule of what a newly accepted plan keeps of the one before: a node whose previous plan's node of the same
    key succeeded with the same definition (``succeeded``: key → its definition digest), and whose dependencies are
    all kept too, keeps its status and output — its side effect happened and is not redone. A node downstream of a
    redone one is redone: its receipt proved the old inputs. ``specs`` in dependency order."""
    kept: set[str] = set()
    for spec in specs:
        if succeeded.get(spec.key) == spec.definition_digest and all(dep in kept for dep in spec.depends_on):
            kept.add(spec.key)
    return kept
