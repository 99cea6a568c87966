"""Plans: validation (every rule, each tried against what should break it), creation, proposal, acceptance, replan."""

from collections.abc import Callable
from typing import Any

import pytest

from leases.errors import LeaseExpired
from leases.models import Lease
from tasks.core.errors import (
    InvalidTransition,
    OperationsOpen,
    PlanInvalid,
    TaskError,
    TaskNotRunnable,
    VersionConflict,
)
from tasks.core.failures import ALLOWED_DESTINATIONS
from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, PauseReason, TaskStatus
from tasks.core.outcomes import Committed, Failed, Outcome, Unprovable
from tasks.core.plan import MAX_NODES, validate_plan
from tasks.engine.events import find_log_problem
from tasks.engine.plans import plan_accept, plan_propose, task_create
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.engine.verification import task_verify_log
from tasks.models import Event, Node, Operation, PlanRevision, ProposalStatus, Task
from tests.conftest import chain_plan, effect_node, snapshot

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}

type Refuse = Callable[..., PlanInvalid]


def approval(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}, **extra}


def plan_of(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": list(nodes)}


@pytest.fixture
def refuse(make_task, clock) -> Refuse:
    """task_create must refuse ``plan`` with PlanInvalid, name every fragment, and write nothing.

    Another task already exists, so "nothing written" is checked against a non-empty database.
    """
    make_task(title="a bystander task")

    def check(plan: Any, *fragments: str) -> PlanInvalid:
        before = snapshot()
        with pytest.raises(PlanInvalid) as caught:
            task_create(kind="test", title="refused", plan=plan, created_by="agent:tester")
        assert snapshot() == before
        problems = " | ".join(caught.value.problems)
        assert problems, "a refusal must say what is wrong"
        for fragment in fragments:
            assert fragment in problems, problems
        return caught.value

    return check


def current(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def run_node(task: Task, lease: Lease, outcome: Outcome) -> Operation:
    """Take the next directive through the step protocol; every write bumps the version by exactly one."""
    directive = next_directive(task_id=task.pk, lease=lease)
    assert directive.kind == "execute", directive
    version = directive.task_version
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=version), directive.node_key, lease=lease
    ).operation
    assert current(task).version == version + 1
    op = record_outcome(
        snapshot_at(task_id=op.task_id, lease=lease, expected_version=version + 1), op.op_key, outcome, lease=lease
    ).operation
    assert current(task).version == version + 2
    return op


def nodes_of(task: Task, plan_version: int) -> dict[str, Node]:
    return {n.key: n for n in Node.objects.filter(task=task, plan_version=plan_version)}


def pause_on_invalid_params(task: Task, lease: Lease) -> None:
    run_node(task, lease, Failed(FailureClass.INVALID_PARAMS, "the remote said 400: bad prefix"))
    paused = current(task)
    assert (paused.status, paused.status_reason) == (TaskStatus.PAUSED, PauseReason.NEEDS_REPLAN)


# --- validate_plan: the document and node keys ---------------------------------------------------------------


@pytest.mark.parametrize("document", [None, [], "nodes", {}, {"nodes": []}, {"nodes": {"a": {}}}, {"steps": []}])
def test_it_refuses_a_document_without_a_list_of_nodes(refuse: Refuse, document: Any) -> None:
    refuse(document, "non-empty list 'nodes'")


def test_it_refuses_a_node_that_is_not_an_object(refuse: Refuse) -> None:
    refuse({"nodes": [effect_node("a"), "b"]}, "node #1 is not an object")


def test_it_refuses_duplicate_node_keys(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a"), effect_node("b", depends_on=["a"]), effect_node("a")), "node a: duplicate key")


@pytest.mark.parametrize("key", ["", "Copy", "-copy", "copy batch", "x" * 101, 7, None, ["a"]])
def test_it_refuses_a_malformed_node_key(refuse: Refuse, key: Any) -> None:
    refuse(plan_of({"key": key, "action": "store.copy_batch"}), "node #0: key")


def test_it_refuses_unknown_node_fields(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", retries=3, note="x")), "node a: unknown fields ['note', 'retries']")


def test_it_refuses_more_than_the_maximum_number_of_nodes(refuse: Refuse) -> None:
    refuse(plan_of(*(effect_node(f"n{i}") for i in range(MAX_NODES + 1))), f"at most {MAX_NODES} nodes")


def test_it_lists_every_problem_found(refuse: Refuse) -> None:
    refused = refuse(
        plan_of(effect_node("a", action="store.teleport"), effect_node("b", depends_on=["ghost"], max_attempts=0)),
        "node a: unknown action 'store.teleport'",
        "node b: depends on unknown node 'ghost'",
        "node b: max_attempts",
    )
    assert len(refused.problems) == 3


# --- depends_on: known keys, no cycles -----------------------------------------------------------------------


def test_it_refuses_a_node_that_depends_on_itself(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a"), effect_node("b", depends_on=["a", "b"])), "node b: depends on itself")


def test_it_refuses_a_two_node_cycle(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", depends_on=["b"]), effect_node("b", depends_on=["a"])), "cycle")


def test_it_refuses_a_long_cycle_behind_a_valid_prefix(refuse: Refuse) -> None:
    plan = chain_plan("root", "a", "b", "c", "d")
    plan["nodes"][1]["depends_on"] = ["root", "d"]  # a ← d ← c ← b ← a, all reachable from a valid root
    refuse(plan, "cycle")


def test_it_refuses_a_cycle_that_no_node_starts(refuse: Refuse) -> None:
    plan = chain_plan("a", "b", "c")
    plan["nodes"][0]["depends_on"] = ["c"]
    refuse(plan, "cycle")


def test_it_refuses_a_dependency_on_an_unknown_node(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a"), effect_node("b", depends_on=["a", "A"])), "node b: depends on unknown node 'A'")


@pytest.mark.parametrize("depends_on", ["a", [["a"]], [1], {"a": True}, None])
def test_it_refuses_depends_on_that_is_not_a_list_of_keys(refuse: Refuse, depends_on: Any) -> None:
    refuse(plan_of(effect_node("a"), effect_node("b", depends_on=depends_on)), "node b: depends_on must be a list")


# --- actions -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["store.teleport", "", None, 3, "Store.copy_batch", ["store.copy_batch"]])
def test_it_refuses_an_unknown_action(refuse: Refuse, action: Any) -> None:
    refuse(plan_of(effect_node("a", action=action)), "node a: unknown action")


def test_it_refuses_a_node_without_an_action(refuse: Refuse) -> None:
    refuse(plan_of({"key": "a"}), "node a: unknown action None")


# --- evidence specs ----------------------------------------------------------------------------------------------


def test_it_refuses_an_unknown_evidence_key(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", evidence={"remote_id": True, "status": "ok"})), "node a: evidence 'status' unknown")


@pytest.mark.parametrize("value", [False, 1, "true", "yes", None, {"input": "x"}])
def test_it_refuses_remote_id_evidence_that_is_not_true(refuse: Refuse, value: Any) -> None:
    refuse(plan_of(effect_node("a", evidence={"remote_id": value})), "node a: evidence remote_id is always required")


@pytest.mark.parametrize("count", [-1, True, False, "100", 1.5, None, [100]])
def test_it_refuses_a_count_that_is_not_a_non_negative_integer(refuse: Refuse, count: Any) -> None:
    refuse(plan_of(effect_node("a", evidence={"remote_id": True, "count": count})), "node a: evidence count must be")


@pytest.mark.parametrize("name", ["digest", "remote_version"])
@pytest.mark.parametrize("value", ["", 7, None, True, ["sha256:ab"]])
def test_it_refuses_a_literal_digest_or_version_that_is_not_a_non_empty_string(
    refuse: Refuse, name: str, value: Any
) -> None:
    refuse(plan_of(effect_node("a", evidence={name: value})), f"node a: evidence {name} must be a non-empty string")


def test_it_refuses_evidence_that_is_not_an_object(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", evidence=["remote_id"])), "node a: evidence must be an object")


def without_evidence(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k != "evidence"}


@pytest.mark.parametrize(
    "node", [without_evidence(effect_node("a")), {"key": "a", "action": "approval"}], ids=["effect", "approval"]
)
def test_it_refuses_a_node_without_an_evidence_spec(refuse: Refuse, node: dict[str, Any]) -> None:
    """The design note: every node has its completion evidence, approval nodes too."""
    refuse(plan_of(node), "node a: no evidence spec")


@pytest.mark.parametrize(
    "evidence", [{}, {"count": 100}, {"digest": "sha256:" + "ab" * 32}], ids=["empty", "count-only", "digest-only"]
)
def test_it_refuses_an_evidence_spec_that_does_not_ask_for_the_remote_id(refuse: Refuse, evidence: Any) -> None:
    refuse(plan_of(effect_node("a", evidence=evidence)), "node a: evidence remote_id is always required")


def test_it_refuses_an_approval_that_does_not_ask_for_the_approval_record(refuse: Refuse) -> None:
    refuse(plan_of({"key": "ok", "action": "approval", "evidence": {}}), "node ok: evidence remote_id")


def test_an_approval_node_may_also_pin_what_was_approved(make_task, clock) -> None:
    """An approval's evidence is the id of the person's approval record; it may also pin the version approved."""
    evidence = {"remote_id": True, "remote_version": {"input": "source", "field": "version"}}
    node = approval("ok", input={"source": {"ref": SOURCE}}, evidence=evidence)
    task = make_task(plan_of(node, effect_node("switch", depends_on=["ok"])))
    assert nodes_of(task, 1)["ok"].evidence == evidence


def test_it_refuses_evidence_that_reads_an_unknown_input(refuse: Refuse) -> None:
    node = effect_node("a", input={"source": {"ref": SOURCE}}, evidence={"digest": {"input": "src", "field": "digest"}})
    refuse(plan_of(node), "node a: evidence digest reads unknown input 'src'")


def test_it_refuses_evidence_that_names_no_input(refuse: Refuse) -> None:
    node = effect_node("a", input={"source": {"ref": SOURCE}}, evidence={"digest": {"field": "digest"}})
    refuse(plan_of(node), "node a: evidence digest reads unknown input None")


@pytest.mark.parametrize("bad_input", [["source"], {"name": "source"}])
def test_it_refuses_evidence_that_names_its_input_with_something_other_than_a_string(
    refuse: Refuse, bad_input: Any
) -> None:
    node = effect_node("a", input={"source": {"ref": SOURCE}}, evidence={"digest": {"input": bad_input}})
    refuse(plan_of(node), "node a: evidence digest reads unknown input")


@pytest.mark.parametrize("field", [None, "remote_id", "checksum", ""])
def test_it_refuses_evidence_from_a_ref_without_a_ref_field(refuse: Refuse, field: Any) -> None:
    spec: dict[str, Any] = {"input": "source"} if field is None else {"input": "source", "field": field}
    node = effect_node("a", input={"source": {"ref": SOURCE}}, evidence={"digest": spec})
    refuse(plan_of(node), "node a: evidence digest from ref source needs field")


def test_it_refuses_evidence_from_a_literal_input_that_names_a_field(refuse: Refuse) -> None:
    node = effect_node("a", input={"limit": 100}, evidence={"count": {"input": "limit", "field": "value"}})
    refuse(plan_of(node), "node a: evidence count from a non-ref input takes no field")


def test_it_accepts_evidence_read_from_a_ref_field_and_from_a_literal_input(make_task, clock) -> None:
    node = effect_node(
        "a",
        input={"source": {"ref": SOURCE}, "limit": 100},
        evidence={
            "remote_id": True,
            "count": {"input": "limit"},
            "digest": {"input": "source", "field": "digest"},
            "remote_version": {"input": "source", "field": "version"},
        },
    )
    task = make_task(plan_of(node))
    assert nodes_of(task, 1)["a"].evidence == node["evidence"]


# --- input refs and inputs from earlier nodes --------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["source", "locator", "version"])
def test_it_refuses_a_ref_without_source_locator_or_version(refuse: Refuse, missing: str) -> None:
    ref = {k: v for k, v in SOURCE.items() if k != missing}
    refuse(
        plan_of(effect_node("a", input={"src": {"ref": ref}})), f"node a: input src: ref needs a non-empty {missing}"
    )


@pytest.mark.parametrize("field", ["source", "locator", "version"])
@pytest.mark.parametrize("value", ["", 7, None, ["v7"]])
def test_it_refuses_a_ref_whose_required_field_is_empty_or_not_a_string(refuse: Refuse, field: str, value: Any) -> None:
    ref = SOURCE | {field: value}
    refuse(plan_of(effect_node("a", input={"src": {"ref": ref}})), f"node a: input src: ref needs a non-empty {field}")


@pytest.mark.parametrize("ref", [SOURCE | {"token": "x"}, SOURCE | {"etag": "e1"}, "store:projects/acme@7", None])
def test_it_refuses_a_ref_that_is_not_the_four_ref_fields(refuse: Refuse, ref: Any) -> None:
    refuse(plan_of(effect_node("a", input={"src": {"ref": ref}})), "node a: input src: ref has fields")


def test_it_refuses_input_that_is_not_an_object(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", input=[{"ref": SOURCE}])), "node a: input must be an object")


def test_it_refuses_an_input_read_from_a_sibling(refuse: Refuse) -> None:
    plan = plan_of(
        effect_node("root"),
        effect_node("left", depends_on=["root"]),
        effect_node("right", depends_on=["root"], input={"target": {"from": "left", "field": "remote_id"}}),
    )
    refuse(plan, "node right: input target reads from 'left', which is not a node it depends on")


def test_it_refuses_an_input_read_from_a_descendant(refuse: Refuse) -> None:
    plan = chain_plan("a", "b", "c")
    plan["nodes"][0]["input"] = {"target": {"from": "c", "field": "remote_id"}}
    refuse(plan, "node a: input target reads from 'c'")


def test_it_refuses_an_input_read_from_the_node_itself(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", input={"target": {"from": "a", "field": "remote_id"}})), "reads from 'a'")


def test_it_refuses_an_input_read_from_an_unknown_node(refuse: Refuse) -> None:
    plan = chain_plan("a", "b")
    plan["nodes"][1]["input"] = {"target": {"from": "ghost", "field": "remote_id"}}
    refuse(plan, "node b: input target reads from 'ghost'")


@pytest.mark.parametrize("source", [["a"], {"key": "a"}])
def test_it_refuses_an_input_read_from_something_other_than_a_node_key(refuse: Refuse, source: Any) -> None:
    plan = chain_plan("a", "b")
    plan["nodes"][1]["input"] = {"target": {"from": source, "field": "remote_id"}}
    refuse(plan, "node b: input target reads from")


@pytest.mark.parametrize("field", ["output", "remote-id", None, "", ["remote_id"]])
def test_it_refuses_an_input_read_from_an_unknown_output_field(refuse: Refuse, field: Any) -> None:
    plan = chain_plan("a", "b")
    plan["nodes"][1]["input"] = {"target": {"from": "a", "field": field}}
    refuse(plan, "node b: input target: field must be one of remote_id, remote_version, count, digest")


def test_it_accepts_an_input_read_from_a_distant_ancestor(make_task, clock) -> None:
    plan = chain_plan("a", "b", "c", "d")
    plan["nodes"][3]["input"] = {"target": {"from": "a", "field": "remote_id"}, "n": {"from": "b", "field": "count"}}
    task = make_task(plan)
    assert nodes_of(task, 1)["d"].input == plan["nodes"][3]["input"]


# --- irreversible effects need a compensation or an approval before them ----------------------------------------


def test_it_refuses_an_irreversible_node_without_compensation_or_approval(refuse: Refuse) -> None:
    plan = plan_of(effect_node("copy"), effect_node("delete", depends_on=["copy"], irreversible=True))
    refuse(plan, "node delete: irreversible without a compensation needs an approval node before it")


def test_it_refuses_an_irreversible_node_whose_approval_is_only_a_sibling(refuse: Refuse) -> None:
    plan = plan_of(
        effect_node("copy"),
        approval("ok", depends_on=["copy"]),
        effect_node("delete", depends_on=["copy"], irreversible=True),
    )
    refuse(plan, "node delete: irreversible without a compensation")


def test_it_refuses_an_irreversible_node_whose_approval_comes_after_it(refuse: Refuse) -> None:
    plan = plan_of(effect_node("delete", irreversible=True), approval("ok", depends_on=["delete"]))
    refuse(plan, "node delete: irreversible without a compensation")


def test_it_refuses_an_irreversible_node_after_an_effect_with_an_approval_like_key(refuse: Refuse) -> None:
    plan = plan_of(effect_node("approval"), effect_node("delete", depends_on=["approval"], irreversible=True))
    refuse(plan, "node delete: irreversible without a compensation")


def test_it_accepts_an_irreversible_node_after_an_approval_among_its_ancestors(make_task, clock) -> None:
    plan = plan_of(
        effect_node("copy"),
        approval("ok", depends_on=["copy"]),
        effect_node("verify", depends_on=["ok"]),
        effect_node("delete", depends_on=["verify"], irreversible=True),
    )
    task = make_task(plan)
    assert nodes_of(task, 1)["delete"].irreversible is True


def test_it_accepts_an_irreversible_node_with_a_compensation(make_task, clock) -> None:
    switch = effect_node("switch", irreversible=True, compensation="store.restore_reference")
    task = make_task(plan_of(switch))
    node = nodes_of(task, 1)["switch"]
    assert (node.irreversible, node.compensation) == (True, "store.restore_reference")


@pytest.mark.parametrize("compensation", ["store.undo_everything", 5, True, ["store.restore_reference"]])
def test_it_refuses_a_compensation_that_is_not_a_known_action(refuse: Refuse, compensation: Any) -> None:
    plan = plan_of(effect_node("switch", irreversible=True, compensation=compensation))
    refuse(plan, "node switch: compensation names unknown action")


def test_it_refuses_an_approval_as_the_compensation_of_an_irreversible_node(refuse: Refuse) -> None:
    """A confirmation point has no side effect: it cannot undo one, so it cannot stand in for an approval before."""
    plan = plan_of(effect_node("delete", action="store.delete_objects", irreversible=True, compensation="approval"))
    refuse(plan, "node delete")


def test_it_refuses_an_irreversible_approval_node(refuse: Refuse) -> None:
    refuse(plan_of(approval("ok", irreversible=True)), "node ok: an approval node has no side effect")


@pytest.mark.parametrize("value", ["yes", 1, None, "false"])
def test_it_refuses_irreversible_that_is_not_a_boolean(refuse: Refuse, value: Any) -> None:
    refuse(plan_of(effect_node("a", irreversible=value)), "node a: irreversible must be true or false")


# --- failure destinations ----------------------------------------------------------------------------------------

DESTINATIONS = ("pause", "fail_task", "retry", "reconcile", "ignore", "complete")
DISALLOWED = [
    (cls.value, dest) for cls in FailureClass for dest in DESTINATIONS if dest not in ALLOWED_DESTINATIONS[cls]
]
ALLOWED = [(cls.value, dest) for cls in FailureClass for dest in ALLOWED_DESTINATIONS[cls]]


@pytest.mark.parametrize(("failure_class", "destination"), DISALLOWED)
def test_it_refuses_a_failure_destination_the_class_does_not_allow(
    refuse: Refuse, failure_class: str, destination: str
) -> None:
    plan = plan_of(effect_node("a", on_failure={failure_class: destination}))
    refuse(plan, f"node a: on_failure {failure_class} → {destination!r} not allowed")


def test_a_connection_interrupted_failure_can_only_be_reconciled(refuse: Refuse) -> None:
    assert ALLOWED_DESTINATIONS[FailureClass.CONNECTION_INTERRUPTED] == ("reconcile",)
    for destination in ("retry", "pause", "fail_task"):
        refuse(
            plan_of(effect_node("a", on_failure={"connection_interrupted": destination})),
            "(allowed: reconcile)",
        )


DEFAULTS = {cls.value: ALLOWED_DESTINATIONS[cls][0] for cls in FailureClass}


@pytest.mark.parametrize(("failure_class", "destination"), ALLOWED)
def test_it_accepts_every_allowed_failure_destination(make_task, clock, failure_class: str, destination: str) -> None:
    task = make_task(plan_of(effect_node("a", on_failure={failure_class: destination})))
    assert nodes_of(task, 1)["a"].on_failure == DEFAULTS | {failure_class: destination}


def test_every_node_stores_the_destination_of_every_failure_class(make_task, clock) -> None:
    """The accepted plan says, for every node and every failure class, where a failure goes: the node's own
    choice or the default (tasks/core/failures.py) — so the console shows it, and nothing is left implicit."""
    task = make_task(
        plan_of(
            effect_node("a"),
            approval("ok", depends_on=["a"]),
            effect_node("b", depends_on=["ok"], on_failure={"invalid_params": "fail_task"}),
        )
    )
    nodes = nodes_of(task, 1)
    assert set(DEFAULTS) == {cls.value for cls in FailureClass}
    assert nodes["a"].on_failure == DEFAULTS
    assert nodes["ok"].on_failure == DEFAULTS
    assert nodes["b"].on_failure == DEFAULTS | {"invalid_params": "fail_task"}
    assert DEFAULTS["invalid_params"] == "pause"


def test_the_resolved_destinations_are_part_of_the_verified_definition(make_task, clock) -> None:
    """verify_log re-derives every node from the accepted document: a node stored without its resolved
    destinations (or with another one) differs from its accepted definition."""
    task = make_task(plan_of(effect_node("a", on_failure={"invalid_params": "fail_task"}), effect_node("b")))
    assert task_verify_log(task_id=task.pk, quarantine=False).problem is None
    for stored in ({}, DEFAULTS | {"invalid_params": "fail_task"}):
        Node.objects.filter(task=task, key="b").update(on_failure=stored)
        problem = task_verify_log(task_id=task.pk, quarantine=False).problem or ""
        assert "node b of plan 1 differs from its accepted definition" in problem, stored


def test_a_replan_that_only_spells_out_a_default_keeps_the_node(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    pause_on_invalid_params(task, lease)
    replan = chain_plan("a", "b")
    replan["nodes"][0]["on_failure"] = {"invalid_params": "pause", "conflict": "pause"}
    plan_accept(revision_id=propose(task, lease, replan).pk, expected_version=current(task).version, lease=lease)
    assert nodes_of(task, 2)["a"].status == NodeStatus.SUCCEEDED


@pytest.mark.parametrize("destination", [None, 1, ["pause"], {"to": "pause"}, "", "PAUSE"])
def test_it_refuses_a_failure_destination_that_is_not_a_known_name(refuse: Refuse, destination: Any) -> None:
    refuse(plan_of(effect_node("a", on_failure={"invalid_params": destination})), "node a: on_failure invalid_params")


@pytest.mark.parametrize("failure_class", ["timeout", "INVALID_PARAMS", "unprovable", ""])
def test_it_refuses_an_unknown_failure_class(refuse: Refuse, failure_class: str) -> None:
    plan = plan_of(effect_node("a", on_failure={failure_class: "pause"}))
    refuse(plan, f"node a: on_failure names unknown failure class {failure_class!r}")


def test_it_refuses_on_failure_that_is_not_an_object(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", on_failure=["pause"])), "node a: on_failure must be an object")


# --- attempts ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_attempts", [0, -1, 101, 10_000, True, "3", 2.5, None])
def test_it_refuses_max_attempts_out_of_bounds(refuse: Refuse, max_attempts: Any) -> None:
    refuse(
        plan_of(effect_node("a", max_attempts=max_attempts)), "node a: max_attempts must be an integer from 1 to 100"
    )


@pytest.mark.parametrize("max_attempts", [1, 100])
def test_it_accepts_max_attempts_at_the_bounds(make_task, clock, max_attempts: int) -> None:
    task = make_task(plan_of(effect_node("a", max_attempts=max_attempts)))
    assert nodes_of(task, 1)["a"].max_attempts == max_attempts


def test_it_refuses_a_rerun_that_is_not_a_sentence(refuse: Refuse) -> None:
    refuse(plan_of(effect_node("a", rerun=["idempotent"])), "node a: rerun must be a sentence")


@pytest.mark.parametrize("budget", [0, -5])
def test_it_refuses_a_task_attempt_budget_below_one(make_task, clock, budget: int) -> None:
    make_task(title="a bystander task")
    before = snapshot()
    with pytest.raises(PlanInvalid, match="attempt_budget must be at least 1"):
        task_create(kind="test", title="t", plan=chain_plan("a"), created_by="agent:tester", attempt_budget=budget)
    assert snapshot() == before


def test_validate_plan_returns_the_nodes_in_dependency_order(db) -> None:
    plan = plan_of(
        effect_node("c", depends_on=["b", "a"]),
        effect_node("b", depends_on=["a"]),
        effect_node("a"),
        effect_node("z"),
    )
    specs = validate_plan(plan)
    assert [s.key for s in specs] == ["a", "z", "b", "c"]
    assert [s.position for s in specs] == [0, 1, 2, 3]


# --- task_create: the first plan, accepted ----------------------------------------------------------------------


def test_task_create_stores_plan_revision_1_proposed_by_the_creator_and_accepted(make_task, clock) -> None:
    plan = chain_plan("a", "b")
    task = make_task(plan, created_by="agent:planner")
    revision = PlanRevision.objects.get(task=task)
    assert (revision.number, revision.status, revision.proposed_by) == (1, ProposalStatus.ACCEPTED, "agent:planner")
    assert revision.document == plan
    assert revision.decided_at is not None
    assert revision.digest.startswith("sha256:")


def test_task_create_creates_the_nodes_of_plan_version_1_in_dependency_order(make_task, clock) -> None:
    plan = plan_of(
        effect_node("c", depends_on=["b"], max_attempts=7, rerun="idempotent by op key"),
        effect_node("b", depends_on=["a"]),
        effect_node("a", input={"source": {"ref": SOURCE}}),
    )
    task = make_task(plan)
    assert task.plan_version == 1
    nodes = list(Node.objects.filter(task=task).order_by("position"))
    assert [(n.key, n.position, n.plan_version, n.status) for n in nodes] == [
        ("a", 0, 1, NodeStatus.PENDING),
        ("b", 1, 1, NodeStatus.PENDING),
        ("c", 2, 1, NodeStatus.PENDING),
    ]
    c = nodes[2]
    assert (c.depends_on, c.max_attempts, c.rerun, c.attempts, c.output) == (["b"], 7, "idempotent by op key", 0, {})
    assert nodes[0].input == {"source": {"ref": SOURCE}}


def test_task_create_records_task_created_then_plan_accepted(make_task, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    events = list(Event.objects.filter(task=task).order_by("seq"))
    assert [(e.seq, e.type) for e in events] == [(1, "task_created"), (2, "plan_accepted")]
    assert task.version == 2
    assert task.status == TaskStatus.PENDING
    assert events[1].payload["data"]["plan_revision"] == 1
    assert events[1].payload["data"]["nodes"] == 2
    # No event carries the plan: the nodes derive from the document the digest names, and the fold derives them.
    assert events[1].payload["data"]["plan_digest"] == PlanRevision.objects.get(task=task).digest
    assert "nodes" not in events[1].payload and "input_refs" not in events[1].payload["task"]
    assert find_log_problem(task) is None


def test_task_create_collects_the_input_refs_of_every_node(make_task, clock) -> None:
    other = SOURCE | {"locator": "projects/acme/manifest", "version": "3"}
    plan = chain_plan("a", "b")
    plan["nodes"][0]["input"] = {"source": {"ref": SOURCE}, "limit": 10}
    plan["nodes"][1]["input"] = {"manifest": {"ref": other}, "target": {"from": "a", "field": "remote_id"}}
    task = make_task(plan)
    assert task.input_refs == {"a.source": SOURCE, "b.manifest": other}


# --- plan_propose: a proposal only --------------------------------------------------------------------------------


def test_plan_propose_stores_a_proposal_and_changes_no_node(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    nodes_before = list(Node.objects.filter(task=task).values())
    proposal = chain_plan("a", "b", "c")
    revision = plan_propose(
        task_id=task.pk, plan=proposal, proposed_by="agent:model", expected_version=task.version, lease=lease
    )
    assert (revision.number, revision.status, revision.proposed_by) == (2, ProposalStatus.PROPOSED, "agent:model")
    assert revision.document == proposal
    assert revision.decided_at is None
    after = current(task)
    assert (after.version, after.plan_version, after.status) == (task.version + 1, 1, TaskStatus.PENDING)
    assert list(Node.objects.filter(task=task).values()) == nodes_before
    assert Event.objects.get(task=task, seq=after.version).type == "plan_proposed"
    assert find_log_problem(after) is None


def test_plan_propose_refuses_an_invalid_plan_and_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    before = snapshot()
    with pytest.raises(PlanInvalid, match="cycle"):
        plan_propose(
            task_id=task.pk,
            plan=plan_of(effect_node("a", depends_on=["b"]), effect_node("b", depends_on=["a"])),
            proposed_by="agent:model",
            expected_version=task.version,
            lease=lease,
        )
    assert snapshot() == before


def test_plan_propose_refuses_a_stale_version_and_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    before = snapshot()
    with pytest.raises(VersionConflict):
        plan_propose(task_id=task.pk, plan=chain_plan("x"), proposed_by="agent:model", expected_version=1, lease=lease)
    assert snapshot() == before


def test_plan_propose_refuses_an_expired_lease_and_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    clock.advance(lease.expires_at - clock.now())
    before = snapshot()
    with pytest.raises(LeaseExpired):
        plan_propose(
            task_id=task.pk, plan=chain_plan("x"), proposed_by="agent:model", expected_version=task.version, lease=lease
        )
    assert snapshot() == before


# --- plan_accept: only the scheduler, only while nobody advances the old plan -----------------------------------


def propose(task: Task, lease: Lease, plan: dict[str, Any]) -> PlanRevision:
    return plan_propose(
        task_id=task.pk, plan=plan, proposed_by="agent:model", expected_version=current(task).version, lease=lease
    )


def test_plan_accept_makes_the_proposal_the_tasks_plan(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    revision = propose(task, lease, chain_plan("a", "b", "c"))
    version = current(task).version
    accepted = plan_accept(revision_id=revision.pk, expected_version=version, lease=lease)
    assert (accepted.version, accepted.plan_version, accepted.status) == (version + 1, 2, TaskStatus.PENDING)
    revision.refresh_from_db()
    assert revision.status == ProposalStatus.ACCEPTED
    assert revision.decided_at is not None
    assert set(nodes_of(task, 2)) == {"a", "b", "c"}
    assert set(nodes_of(task, 1)) == {"a", "b"}, "the old plan's nodes stay as history"
    assert Event.objects.get(task=task, seq=accepted.version).type == "plan_accepted"
    assert find_log_problem(accepted) is None


def test_plan_accept_returns_a_paused_task_to_pending(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    pause_on_invalid_params(task, lease)
    revision = propose(task, lease, chain_plan("a2"))
    accepted = plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    assert (accepted.status, accepted.status_reason, accepted.status_detail) == (TaskStatus.PENDING, "", "")
    assert next_directive(task_id=task.pk, lease=lease).node_key == "a2"


def test_plan_accept_refuses_a_running_task(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    assert current(task).status == TaskStatus.RUNNING
    revision = propose(task, lease, chain_plan("a", "c"))
    before = snapshot()
    with pytest.raises((TaskNotRunnable, InvalidTransition)):
        plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    assert snapshot() == before


def test_plan_accept_refuses_a_completed_task(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    assert current(task).status == TaskStatus.COMPLETED
    before = snapshot()
    with pytest.raises(TaskNotRunnable):  # an ended task takes no new plan: not even a proposal lands
        propose(task, lease, chain_plan("a", "b"))
    assert snapshot() == before


def test_plan_accept_refuses_while_an_operation_is_open(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    op = run_node(task, lease, Unprovable("the remote can neither dedupe nor be queried"))
    paused = current(task)
    assert (paused.status, op.status) == (TaskStatus.PAUSED, OperationStatus.UNKNOWN)
    revision = propose(task, lease, chain_plan("x"))
    before = snapshot()
    with pytest.raises(OperationsOpen):
        plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    assert snapshot() == before


def test_plan_accept_refuses_a_revision_already_accepted(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    revision = propose(task, lease, chain_plan("x"))
    plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    before = snapshot()
    with pytest.raises(InvalidTransition):
        plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    with pytest.raises(InvalidTransition):
        plan_accept(revision_id=PlanRevision.objects.get(task=task, number=1).pk, expected_version=0, lease=lease)
    assert snapshot() == before


def test_plan_accept_refuses_a_stale_version_and_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    revision = propose(task, lease, chain_plan("x"))
    before = snapshot()
    with pytest.raises(VersionConflict):
        plan_accept(revision_id=revision.pk, expected_version=current(task).version - 1, lease=lease)
    assert snapshot() == before


def test_plan_accept_refuses_a_proposal_older_than_the_current_plan(make_task, agent_lease, clock) -> None:
    """Plan versions only grow: once revision 3 is the plan, the superseded proposal 2 cannot replace it."""
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    older = propose(task, lease, chain_plan("b"))
    newer = propose(task, lease, chain_plan("c"))
    plan_accept(revision_id=newer.pk, expected_version=current(task).version, lease=lease)
    assert current(task).plan_version == 3
    before = snapshot()
    with pytest.raises(TaskError):
        plan_accept(revision_id=older.pk, expected_version=current(task).version, lease=lease)
    assert snapshot() == before
    assert current(task).plan_version == 3


# --- replan: what succeeded is kept, what changed starts again ---------------------------------------------------


def test_a_replan_keeps_an_identical_succeeded_node_and_does_not_redo_its_effect(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    pause_on_invalid_params(task, lease)
    replan = chain_plan("a", "b")
    replan["nodes"][1]["input"] = {"prefix": "fixed/"}
    revision = propose(task, lease, replan)
    accepted = plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    old, new = nodes_of(task, 1), nodes_of(task, 2)
    assert new["a"].status == NodeStatus.SUCCEEDED
    assert new["a"].output == old["a"].output
    assert new["a"].output["remote_id"] == "r-a"
    assert (new["b"].status, new["b"].output, new["b"].attempts) == (NodeStatus.PENDING, {}, 0)
    assert find_log_problem(accepted) is None

    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.node_key) == ("execute", "b")
    op = run_node(task, lease, Committed(remote_id="r-b"))
    assert "-p2-b-" in op.op_key
    assert Operation.objects.filter(task=task, node__key="a").count() == 1, "a's side effect is not redone"
    done = current(task)
    assert done.status == TaskStatus.COMPLETED
    assert find_log_problem(done) is None


def test_a_replan_resets_a_succeeded_node_whose_definition_changed(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    pause_on_invalid_params(task, lease)
    replan = chain_plan("a", "b")
    replan["nodes"][0]["max_attempts"] = 5
    revision = propose(task, lease, replan)
    plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    new = nodes_of(task, 2)
    assert (new["a"].status, new["a"].output, new["a"].attempts) == (NodeStatus.PENDING, {}, 0)
    assert next_directive(task_id=task.pk, lease=lease).node_key == "a"


def test_a_replan_resets_a_failed_node_even_when_unchanged(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    pause_on_invalid_params(task, lease)
    revision = propose(task, lease, chain_plan("a", "b"))
    plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    new = nodes_of(task, 2)
    assert (new["a"].status, new["b"].status) == (NodeStatus.SUCCEEDED, NodeStatus.PENDING)


def test_a_replan_does_not_keep_a_node_whose_input_comes_from_a_node_that_is_redone(
    make_task, agent_lease, clock
) -> None:
    """b copied into a's old target. If a is redone (a new target), b's old receipt proves nothing about it."""
    plan = chain_plan("a", "b", "c")
    plan["nodes"][1]["input"] = {"target": {"from": "a", "field": "remote_id"}}
    task = make_task(plan)
    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="target-1"))
    run_node(task, lease, Committed(remote_id="copy-into-target-1"))
    pause_on_invalid_params(task, lease)
    replan = chain_plan("a", "b", "c")
    replan["nodes"][0]["input"] = {"prefix": "elsewhere/"}
    replan["nodes"][1]["input"] = {"target": {"from": "a", "field": "remote_id"}}
    revision = propose(task, lease, replan)
    plan_accept(revision_id=revision.pk, expected_version=current(task).version, lease=lease)
    new = nodes_of(task, 2)
    assert new["a"].status == NodeStatus.PENDING
    assert new["b"].status == NodeStatus.PENDING, "b must run again against a's new output"


# --- re-plan by a person: their identity, their permission, their audit; the agent's lease checks unchanged ------


def _operator(task: Task) -> Any:
    from tasks.access.permissions import permission_grant
    from tests.conftest import person

    root = person("root", "admin")
    ann = person("ann", "operator")
    permission_grant(actor=root, user=ann.user, task=task)
    return ann


def _holding(task: Task, agent_lease: Callable[..., Lease]) -> tuple[Any, Lease]:
    """A task that succeeded a, then paused needs_replan; ann took it over."""
    from tasks.people.takeover import takeover_claim

    lease = agent_lease(task)
    run_node(task, lease, Committed(remote_id="r-a"))
    pause_on_invalid_params(task, lease)
    from leases.services import lease_release

    lease_release(lease=lease)
    ann = _operator(task)
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert claim.lease is not None
    return ann, claim.lease


def test_a_person_proposes_and_accepts_as_themselves_and_hands_the_task_back(
    make_task, agent_lease, clock, django_capture_on_commit_callbacks
) -> None:
    from audit.models import AuditEvent
    from leases.services import lease_open
    from tasks.people.replan import plan_accept_by_person, plan_propose_by_person

    task = make_task(chain_plan("a", "b"))
    ann, _lease = _holding(task, agent_lease)
    revision = plan_propose_by_person(
        actor=ann,
        task_id=task.pk,
        plan=chain_plan("a", "b"),
        expected_version=current(task).version,
        reason="b's prefix was wrong: same plan, b again",
    )
    assert revision.proposed_by == "user:ann"
    proposed = AuditEvent.objects.order_by("-seq").first()
    assert proposed is not None and (proposed.action, proposed.actor_id) == ("plan_proposed", "ann")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        after = plan_accept_by_person(actor=ann, revision_id=revision.pk, expected_version=current(task).version)
    assert (after.status, after.plan_version) == (TaskStatus.PENDING, 2)
    assert nodes_of(task, 2)["a"].status == NodeStatus.SUCCEEDED, "a's receipt is kept"
    assert lease_open(task.pk) is None and len(callbacks) == 1
    accepted = AuditEvent.objects.order_by("-seq").first()
    assert accepted is not None and (accepted.action, accepted.actor_id) == ("plan_accepted_after_replan", "ann")
    assert PlanRevision.objects.get(pk=revision.pk).decision_reason == "accepted by user:ann"


def test_a_person_may_not_propose_without_holding_the_task(make_task, agent_lease, clock) -> None:
    from tasks.access.permissions import PermissionDenied
    from tasks.people.replan import plan_propose_by_person

    task = make_task(chain_plan("a", "b"))
    ann = _operator(task)
    before = snapshot()
    with pytest.raises(PermissionDenied):
        plan_propose_by_person(
            actor=ann,
            task_id=task.pk,
            plan=chain_plan("a"),
            expected_version=current(task).version,
            reason="a reason long enough",
        )
    assert snapshot() == before


def test_an_auditor_may_not_propose_or_accept(make_task, agent_lease, clock) -> None:
    from tasks.access.permissions import PermissionDenied
    from tasks.people.replan import plan_accept_by_person, plan_propose_by_person
    from tests.conftest import person

    task = make_task(chain_plan("a", "b"))
    ann, _lease = _holding(task, agent_lease)
    revision = plan_propose_by_person(
        actor=ann,
        task_id=task.pk,
        plan=chain_plan("a", "b"),
        expected_version=current(task).version,
        reason="a reason long enough",
    )
    auditor = person("aud", "auditor")
    before = snapshot()
    with pytest.raises(PermissionDenied):
        plan_propose_by_person(
            actor=auditor,
            task_id=task.pk,
            plan=chain_plan("a"),
            expected_version=current(task).version,
            reason="a reason long enough",
        )
    with pytest.raises(PermissionDenied):
        plan_accept_by_person(actor=auditor, revision_id=revision.pk, expected_version=current(task).version)
    assert snapshot() == before


def test_a_stale_person_replan_is_refused_with_the_changes_since(make_task, agent_lease, clock) -> None:
    from tasks.people.replan import plan_accept_by_person, plan_propose_by_person

    task = make_task(chain_plan("a", "b"))
    seen = current(task).version
    ann, _lease = _holding(task, agent_lease)
    before = snapshot()
    with pytest.raises(VersionConflict) as caught:
        plan_propose_by_person(
            actor=ann, task_id=task.pk, plan=chain_plan("a"), expected_version=seen, reason="a reason long enough"
        )
    assert caught.value.details["changes"], "the refusal lists what changed since"
    revision = plan_propose_by_person(
        actor=ann,
        task_id=task.pk,
        plan=chain_plan("a", "b"),
        expected_version=current(task).version,
        reason="a reason long enough",
    )
    before = snapshot()
    with pytest.raises(VersionConflict):
        plan_accept_by_person(actor=ann, revision_id=revision.pk, expected_version=seen)
    assert snapshot() == before


def test_the_agent_path_keeps_its_lease_checks(make_task, agent_lease, clock) -> None:
    """A person's path is its own: an agent still cannot propose while a person holds the task."""
    task = make_task(chain_plan("a", "b"))
    agent = agent_lease(task)
    run_node(task, agent, Committed(remote_id="r-a"))
    pause_on_invalid_params(task, agent)
    from leases.errors import LeaseLost
    from leases.services import lease_release

    lease_release(lease=agent)
    _holding_after_release(task)
    before = snapshot()
    with pytest.raises((LeaseLost, LeaseExpired, TaskNotRunnable)):
        propose(task, agent, chain_plan("a", "b"))
    assert snapshot() == before


def _holding_after_release(task: Task) -> None:
    from tasks.people.takeover import takeover_claim

    assert takeover_claim(actor=_operator(task), task_id=task.pk).granted


# --- fan-out: one node per batch, defined by the document -----------------------------------------------------------


def fan_out_plan(total: int, batch: int) -> dict[str, Any]:
    return plan_of(
        effect_node("prepare"),
        effect_node(
            "copy",
            depends_on=["prepare"],
            fan_out={"total": total, "batch": batch},
            input={
                "n": {"each": "index"},
                "first": {"each": "offset"},
                "size": {"each": "size"},
                "target": {"from": "prepare", "field": "remote_id"},
                "source": {"ref": SOURCE},
            },
            evidence={"remote_id": True, "count": {"input": "size"}},
        ),
        effect_node("verify", depends_on=["copy"]),
    )


def test_a_fan_out_node_is_one_node_per_batch_the_last_holding_the_rest(make_task, clock) -> None:
    task = make_task(fan_out_plan(total=1005, batch=100))
    nodes = {n.key: n for n in Node.objects.filter(task=task)}
    assert sorted(nodes, key=lambda k: nodes[k].position) == [
        "prepare",
        *[f"copy-{n}" for n in range(1, 12)],
        "verify",
    ]
    assert nodes["copy-1"].input | {"target": None, "source": None} == {
        "n": 1,
        "first": 0,
        "size": 100,
        "target": None,
        "source": None,
    }
    assert (nodes["copy-11"].input["n"], nodes["copy-11"].input["first"], nodes["copy-11"].input["size"]) == (
        11,
        1000,
        5,
    )
    assert nodes["copy-11"].depends_on == ["prepare"]
    assert nodes["verify"].depends_on == [f"copy-{n}" for n in range(1, 12)]
    # One ref, read by eleven nodes: one input ref to confirm. The stored document is the one sent (not expanded).
    assert task.input_refs == {"copy-1.source": SOURCE}
    assert PlanRevision.objects.get(task=task).document == fan_out_plan(total=1005, batch=100)
    assert task.attempt_budget == 2 * 13
    assert find_log_problem(task) is None


@pytest.mark.parametrize(
    ("fan_out", "fragment"),
    [
        ({"total": 0, "batch": 1}, "fan_out total must be a whole number of at least 1"),
        ({"total": 10, "batch": True}, "fan_out batch must be a whole number of at least 1"),
        ({"total": 10}, 'fan_out must be {"total"'),
        ({"total": 10, "batch": 1, "by": "x"}, 'fan_out must be {"total"'),
        ([10], 'fan_out must be {"total"'),
    ],
)
def test_a_malformed_fan_out_is_refused_by_name(refuse, fan_out: Any, fragment: str) -> None:
    refuse(plan_of(effect_node("copy", fan_out=fan_out)), f"node copy: {fragment}")


def test_a_batch_value_outside_a_fan_out_node_or_unknown_is_refused(refuse) -> None:
    refuse(plan_of(effect_node("a", input={"n": {"each": "index"}})), 'node a: input n: {"each": …} is a fan-out')
    refuse(
        plan_of(effect_node("a", fan_out={"total": 2, "batch": 1}, input={"n": {"each": "count"}})),
        'node a-1: input n: {"each": …} is a fan-out',
    )


def test_fan_out_members_colliding_with_a_node_are_refused(refuse) -> None:
    refuse(plan_of(effect_node("a-2"), effect_node("a", fan_out={"total": 3, "batch": 1})), "node a-2: duplicate key")


def test_a_refusal_of_thousands_of_problems_names_the_first_and_counts_the_rest(refuse) -> None:
    caught = refuse(
        plan_of(effect_node("a", fan_out={"total": 5000, "batch": 1}, input={"n": {"each": "nope"}})),
        "and 4950 more problems like these",
    )
    assert len(caught.problems) == PlanInvalid.SHOWN + 1


def test_a_long_chain_validates_with_its_ancestry(clock) -> None:
    """A chain of 2,000 nodes (about as long as the plan document's cap holds), the last reading the first's output:
    every node's ancestry is a bit set (sets of keys held two million strings here), and a read from a node that is
    no ancestor is still refused."""
    plan = chain_plan(*[f"n{i}" for i in range(2000)])
    plan["nodes"][-1]["input"] = {"target": {"from": "n0", "field": "remote_id"}}
    specs = validate_plan(plan)
    assert [spec.key for spec in specs[:2]] == ["n0", "n1"] and specs[-1].position == 1999
    plan["nodes"][0]["input"] = {"target": {"from": "n1999", "field": "remote_id"}}
    with pytest.raises(PlanInvalid, match="n0: input target reads from 'n1999', which is not a node it depends on"):
        validate_plan(plan)
