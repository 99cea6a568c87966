"""The contract an agent writes its plans against: the plan's JSON Schema in the OpenAPI document and the actions of a
task kind with their input schemas (``GET /api/v1/kinds/{kind}/actions``). Each is made from the code that checks a
plan (tasks/core/plan.py, tasks/core/inputs.py), and these tests hold the two together: what the served schema
refuses the check refuses too, what the check takes the schema takes — so the document cannot say one thing while
the server does another."""

from typing import Any

import jsonschema_rs
import pytest
from django.test import Client

from api.api import api
from api.tokens import api_token_issue
from reference import migrate_project
from tasks.core.actions import get_action, known_actions
from tasks.core.errors import PlanInvalid
from tasks.core.failures import ALLOWED_DESTINATIONS
from tasks.core.inputs import node_output_value
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import RECEIPT_FIELDS
from tasks.core.plan import EVIDENCE_KEYS, MAX_NODES, NODE_KEYS, plan_json_schema, validate_plan
from tests.conftest import EFFECT, chain_plan, effect_node, person, snapshot
from tests.test_api_steps import Agent

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "a" * 64}
PREP = {"key": "prep", "action": "store.prepare_target", "input": {"project": "acme"}, "evidence": {"remote_id": True}}
PLAN_SCHEMA = jsonschema_rs.validator_for(plan_json_schema())


def migration() -> dict[str, Any]:
    return migrate_project.plan("acme", objects=5, source=SOURCE, max_batch=2, confirm_switch=True)


def test_the_openapi_document_carries_the_plan_schema_the_code_makes() -> None:
    schemas = api.get_openapi_schema(path_prefix="/api/v1")["components"]["schemas"]
    assert schemas["TaskCreateIn"]["properties"]["plan"] == plan_json_schema()
    assert schemas["PlanIn"]["properties"]["plan"] == plan_json_schema()
    jsonschema_rs.meta.validate(plan_json_schema())  # a well-formed JSON Schema (2020-12)


def test_the_schema_names_every_field_the_check_knows() -> None:
    node = plan_json_schema()["properties"]["nodes"]["items"]
    assert set(node["properties"]) == NODE_KEYS
    assert tuple(node["properties"]["evidence"]["properties"]) == EVIDENCE_KEYS
    assert set(node["properties"]["on_failure"]["properties"]) == {cls.value for cls in FailureClass}
    for cls in FailureClass:
        assert node["properties"]["on_failure"]["properties"][cls.value]["enum"] == list(ALLOWED_DESTINATIONS[cls])
    assert node_output_value()["properties"]["field"]["enum"] == list(RECEIPT_FIELDS)  # what a "from" may read


@pytest.mark.parametrize(
    "plan",
    [migration(), chain_plan("a", "b", "c"), migrate_project.plan("p", objects=1, source=SOURCE, max_batch=1)],
    ids=["migration-with-approval", "chain", "one-batch"],
)
def test_a_plan_the_check_takes_the_schema_takes(plan: dict[str, Any]) -> None:
    validate_plan(plan)
    assert PLAN_SCHEMA.is_valid(plan), list(PLAN_SCHEMA.iter_errors(plan))[:3]


def _node(**change: Any) -> dict[str, Any]:
    node = effect_node("a", input={"n": 1})
    for name, value in change.items():
        if value is _DROP:
            node.pop(name)
        else:
            node[name] = value
    return node


_DROP = object()
REFUSED_BY_BOTH: dict[str, Any] = {
    "no nodes": {"nodes": []},
    "nodes not a list": {"nodes": {"a": {}}},
    "too many nodes": chain_plan(*[f"n{i}" for i in range(MAX_NODES + 1)]),
    "an unknown field": {"nodes": [_node(timeout=5)]},
    "a key against the pattern": {"nodes": [_node(key="A b")]},
    "no evidence spec": {"nodes": [_node(evidence=_DROP)]},
    "remote_id not required": {"nodes": [_node(evidence={"remote_id": False})]},
    "an unknown evidence field": {"nodes": [_node(evidence={"remote_id": True, "rows": 3})]},
    "a negative count": {"nodes": [_node(evidence={"remote_id": True, "count": -1})]},
    "an empty digest": {"nodes": [_node(evidence={"remote_id": True, "digest": ""})]},
    "zero attempts": {"nodes": [_node(max_attempts=0)]},
    "101 attempts": {"nodes": [_node(max_attempts=101)]},
    "attempts as text": {"nodes": [_node(max_attempts="3")]},
    "a destination not allowed": {"nodes": [_node(on_failure={"permission_revoked": "retry"})]},
    "an unknown failure class": {"nodes": [_node(on_failure={"teapot": "pause"})]},
    "irreversible as text": {"nodes": [_node(irreversible="yes")]},
    "input not an object": {"nodes": [_node(input=[1])]},
    "depends_on not a list": {"nodes": [_node(depends_on="b")]},
    "a ref without its version": {"nodes": [_node(input={"s": {"ref": {"source": "s", "locator": "l"}}})]},
    "a ref with a field of its own": {"nodes": [_node(input={"s": {"ref": {**SOURCE, "etag": "x"}}})]},
    "a ref's digest not a string": {"nodes": [_node(input={"s": {"ref": {**SOURCE, "digest": 7}}})]},
    "an output field no receipt has": {
        "nodes": [PREP, _node(depends_on=["prep"], input={"t": {"from": "prep", "field": "rows"}})]
    },
}


@pytest.mark.parametrize("plan", REFUSED_BY_BOTH.values(), ids=REFUSED_BY_BOTH.keys())
def test_a_plan_the_schema_refuses_the_check_refuses(plan: dict[str, Any], settings: Any) -> None:
    assert not PLAN_SCHEMA.is_valid(plan)
    with pytest.raises(PlanInvalid):
        validate_plan(plan)


# --- the actions' inputs ------------------------------------------------------------------------------------------


def copy_node(**input_: Any) -> dict[str, Any]:
    node = {"key": "copy", "action": "store.copy_batch", "depends_on": ["prep"], "evidence": {"remote_id": True}}
    fields = {"target": {"from": "prep", "field": "remote_id"}, "source": {"ref": SOURCE}, "batch": 1, "limit": 2}
    node["input"] = {k: v for k, v in (fields | input_).items() if v is not None}
    return node


# (what is wrong, the node's input change, the field named)
WRONG_INPUTS = [
    ("a required field missing", {"limit": None}, "limit"),
    ("a literal of the wrong type", {"batch": "one"}, "batch"),
    ("an integer under its minimum", {"limit": 0}, "limit"),
    ("true is no integer", {"batch": True}, "batch"),
    ("a field the action does not take", {"colour": "red"}, "colour"),
    ("a literal where a ref is needed", {"source": "projects/acme"}, "source"),
    ("a ref where a string is needed", {"target": {"ref": SOURCE}}, "target"),
    ("an output of the wrong type", {"target": {"from": "prep", "field": "count"}}, "target"),
]


@pytest.mark.parametrize(("change", "field"), [w[1:] for w in WRONG_INPUTS], ids=[w[0] for w in WRONG_INPUTS])
def test_an_input_the_action_does_not_take_is_refused_naming_the_node_and_the_field(
    change: dict[str, Any], field: str
) -> None:
    plan = {"nodes": [PREP, copy_node(**change)]}
    with pytest.raises(PlanInvalid) as refused:
        validate_plan(plan)
    assert [where for where, _ in refused.value.fields] == [f"nodes[copy].input.{field}"]
    assert f"node copy: input {field} " in str(refused.value)
    # The schema served for the action refuses it too.
    schema = jsonschema_rs.validator_for(get_action("store.copy_batch").input_schema())  # type: ignore[union-attr]
    assert not schema.is_valid(plan["nodes"][1]["input"])


def test_the_served_input_schemas_take_the_reference_agents_plan() -> None:
    for node in migration()["nodes"]:
        spec = get_action(node["action"])
        assert spec is not None
        assert jsonschema_rs.validator_for(spec.input_schema()).is_valid(node.get("input", {})), node["key"]


def test_an_unknown_action_is_refused_with_the_known_ones() -> None:
    with pytest.raises(PlanInvalid) as refused:
        validate_plan({"nodes": [effect_node("a", action="store.teleport")]})
    assert "unknown action 'store.teleport' (known: " + ", ".join(known_actions()) + ")" in str(refused.value)


# --- over the API -------------------------------------------------------------------------------------------------


@pytest.fixture
def agent(client: Client, db: None) -> Agent:
    return Agent(client, api_token_issue(actor=person("root", "admin"), agent_id="a7", kinds=["copy"], projects=[])[1])


def test_a_create_with_a_wrong_input_is_a_422_naming_the_node_and_the_field_and_writes_nothing(agent: Agent) -> None:
    agent.call("get", "/tasks")  # the token's last-use hint, written once a minute: out of the snapshots
    before = snapshot()
    refused = agent.create({"nodes": [PREP, copy_node(limit="two")]})
    assert refused.status_code == 422 and refused["Content-Type"] == "application/problem+json"
    body = refused.json()
    assert body["code"] == "plan_invalid" and "node copy: input limit must be an integer, not 'two'" in body["detail"]
    assert body["errors"] == [
        {
            "field": "plan.nodes[copy].input.limit",
            "code": "input_invalid",
            "message": "limit must be an integer, not 'two'",
        }
    ]
    assert snapshot() == before


def test_the_actions_of_a_kind_come_with_their_input_schemas(agent: Agent, client: Client) -> None:
    answer = agent.call("get", "/kinds/copy/actions")
    assert answer.status_code == 200, answer.content
    actions = {a["name"]: a for a in answer.json()["actions"]}
    assert answer.json()["kind"] == "copy" and sorted(actions) == known_actions()
    assert actions["approval"]["kind"] == "approval" and actions[EFFECT]["input_schema"]["type"] == "object"
    # A token with projects may create a task of any kind in them: every kind is in its scope.
    projects = api_token_issue(actor=person("root2", "admin"), agent_id="a8", kinds=[], projects=["acme"])[1]
    assert Agent(client, projects).call("get", "/kinds/elsewhere/actions").status_code == 200
    copy_schema = actions["store.copy_batch"]["input_schema"]
    assert copy_schema == get_action("store.copy_batch").input_schema()  # type: ignore[union-attr]
    assert copy_schema["required"] == ["target", "source", "batch", "limit"] and not copy_schema["additionalProperties"]


def test_a_kind_outside_the_scope_is_answered_as_one_that_cannot_exist(agent: Agent, client: Client) -> None:
    agent.call("get", "/tasks")  # the token's last-use hint, written once a minute: out of the snapshots
    before = snapshot()
    outside = agent.call("get", "/kinds/elsewhere/actions")
    name = "x" * 101  # longer than any kind
    unknown = agent.call("get", f"/kinds/{name}/actions")
    assert outside.status_code == unknown.status_code == 404
    assert outside.json()["code"] == "kind_not_found"
    said = outside.content.decode().replace("elsewhere", "K")
    assert said == unknown.content.decode().replace(name, "K").replace(name[:100], "K")
    assert {k: v for k, v in outside.items() if k != "Content-Length"} == {
        k: v for k, v in unknown.items() if k != "Content-Length"
    }
    assert snapshot() == before
