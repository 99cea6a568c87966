"""Does a receipt prove a node's side effect? The only judge of invariant 2."""

from typing import Any

from tasks.models import Node, Operation, Receipt


def expected_values(node: Node, request: dict[str, Any]) -> dict[str, Any]:
    """Resolve the node's evidence spec against the resolved input of its operation."""
    resolved_input: dict[str, Any] = request.get("input", {})
    expected: dict[str, Any] = {}
    for name, spec in node.evidence.items():
        if name == "remote_id":
            continue
        if isinstance(spec, dict):
            value = resolved_input.get(spec["input"])
            if isinstance(value, dict) and "field" in spec:
                value = value.get(spec["field"])
            expected[name] = value
        else:
            expected[name] = spec
    return expected


def evidence_problems(node: Node, operation: Operation, receipt: Receipt) -> list[str]:
    """Every way ``receipt`` falls short of ``node``'s evidence spec; empty when it proves the effect."""
    problems = []
    if not receipt.remote_id:
        problems.append("receipt has no remote id")
    for name, expected in expected_values(node, operation.request).items():
        actual = getattr(receipt, name)
        if name == "remote_version":
            expected = "" if expected is None else str(expected)
        if actual != expected:
            problems.append(f"receipt {name} is {actual!r}, the node expects {expected!r}")
    return problems
