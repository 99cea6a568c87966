"""The receipt's fields are named once, tasks.core.outcomes.RECEIPT_FIELDS: every other place that names them is
built from that tuple, or — where a declaration has to spell them out (a dataclass, a model, the API's pydantic
schema, the Python client, which imports nothing of the server) — held to it here. A copy that drifts (a field
added to the tuple and not to a form, the client's list left behind) fails one of these.

Each round trip sends a receipt with every field given (``GIVEN``) through a place and reads it back whole."""

import dataclasses
from typing import Any

import pytest
import reckon_client.outcomes as client_outcomes
from django.test import Client
from ninja import Schema

from api.schemas import NodeReceiptOut, OutcomeIn
from console.forms.reconcile import SettleForm
from console.forms.takeover import ResultForm
from tasks.core import outcomes
from tasks.core.outcomes import RECEIPT_FIELDS, Committed
from tasks.core.plan import EVIDENCE_KEYS, OUTPUT_FIELDS
from tasks.decide.receipts import receipt_of, receipt_summary
from tasks.models import Node, Operation, Receipt
from tasks.people.approvals import node_approve
from tasks.people.settlement import outcome_summary
from tasks.people.takeover import NodeResult, takeover_claim
from tests.conftest import person
from tests.steps import asked, version

# One value per receipt field; a field added to RECEIPT_FIELDS needs one here (the first test says so).
GIVEN: dict[str, Any] = {"remote_id": "r-1", "remote_version": "7", "count": 3, "digest": "sha256:" + "ab" * 32}


def test_every_receipt_field_has_a_value_to_send_through_the_round_trips() -> None:
    assert tuple(GIVEN) == RECEIPT_FIELDS, "give the new receipt field a value in GIVEN"


def test_the_client_names_the_receipt_fields_as_the_server_does() -> None:
    assert client_outcomes.RECEIPT_FIELDS == RECEIPT_FIELDS


@pytest.mark.parametrize(
    "declared",
    [outcomes.Committed, client_outcomes.Committed, NodeResult],
    ids=["server-committed", "client-committed", "takeover-result"],
)
def test_each_dataclass_of_a_receipt_declares_the_receipt_fields_in_order(declared: type) -> None:
    names = [f.name for f in dataclasses.fields(declared)]
    assert [n for n in names if n in RECEIPT_FIELDS] == list(RECEIPT_FIELDS), names


def test_the_receipt_row_has_a_column_for_each_receipt_field() -> None:
    columns = [f.name for f in Receipt._meta.concrete_fields]
    assert [n for n in columns if n in RECEIPT_FIELDS] == list(RECEIPT_FIELDS), columns


def test_a_plan_reads_and_pins_the_receipt_fields() -> None:
    assert OUTPUT_FIELDS == RECEIPT_FIELDS
    assert EVIDENCE_KEYS == RECEIPT_FIELDS


@pytest.mark.parametrize("schema", [OutcomeIn, NodeReceiptOut], ids=["outcome-in", "node-receipt-out"])
def test_the_apis_schemas_of_a_receipt_declare_the_receipt_fields_in_order(schema: type[Schema]) -> None:
    names = list(schema.model_fields)
    assert [n for n in names if n in RECEIPT_FIELDS] == list(RECEIPT_FIELDS), names


@pytest.mark.django_db
def test_the_openapi_document_shows_the_receipt_fields_in_the_outcome(client: Client) -> None:
    document = client.get("/api/v1/openapi.json").json()
    properties = list(document["components"]["schemas"]["StepOutcomeIn"]["properties"])
    assert [n for n in properties if n in RECEIPT_FIELDS] == list(RECEIPT_FIELDS), properties


def test_a_receipt_sent_by_the_client_reaches_the_server_whole() -> None:
    body = client_outcomes.outcome_json(client_outcomes.Committed(**GIVEN))
    assert {k: v for k, v in body.items() if k != "result"} == GIVEN
    outcome = OutcomeIn(**body).outcome()
    assert isinstance(outcome, Committed)
    assert receipt_summary(outcome) == GIVEN


def test_a_receipt_field_in_an_outcome_other_than_committed_is_refused() -> None:
    for name in RECEIPT_FIELDS:
        if name != "remote_id":
            with pytest.raises(ValueError, match="a committed outcome's receipt"):
                OutcomeIn(result="not_found", **{name: GIVEN[name]})


def test_the_receipt_row_and_the_audits_summary_hold_every_receipt_field() -> None:
    op = Operation(pk=1, op_key="rk-test", action="store.copy_batch", request={})
    assert receipt_summary(receipt_of(op, Committed(**GIVEN))) == GIVEN
    assert outcome_summary(Committed(**GIVEN)) == {"outcome": "committed", **GIVEN}


def test_the_settle_form_asks_for_the_receipt_fields_in_order_and_gives_them_back() -> None:
    form = SettleForm(
        {"version": 3, "resolution": "done", "reason": "looked at the store's console", "confirm": "9", **GIVEN},
        can_compensate=True,
        expected="9",
    )
    assert [n for n in form.fields if n in RECEIPT_FIELDS] == list(RECEIPT_FIELDS)
    assert form.is_valid(), form.errors
    receipt = form.receipt()
    assert receipt is not None and receipt_summary(receipt) == GIVEN


def test_the_takeover_result_asks_for_each_receipt_field_the_evidence_pins_and_gives_them_back() -> None:
    evidence = {name: True if name == "remote_id" else value for name, value in GIVEN.items()}
    node = Node(pk=1, task_id=1, plan_version=1, key="a", position=0, action="store.copy_batch", evidence=evidence)
    data = {"expected_version": 3, "epoch": 1, "stage": "review", "decision": "resume_agent"}
    form = ResultForm(data | {f"n-a-{name}": value for name, value in GIVEN.items()}, nodes=[node], all_nodes=[node])
    [fields] = form.node_fields
    assert [n for n in fields.names if n in RECEIPT_FIELDS] == list(RECEIPT_FIELDS)
    assert form.is_valid(), form.errors
    [result] = form.results({})
    assert receipt_summary(result) == GIVEN


@pytest.mark.django_db
def test_an_approval_states_every_receipt_field_its_evidence_pins(make_task, clock) -> None:
    evidence = {name: True if name == "remote_id" else value for name, value in GIVEN.items()}
    task = make_task({"nodes": [{"key": "ok", "action": "approval", "evidence": evidence}]})
    root = person("root", "admin")
    assert takeover_claim(actor=root, task_id=task.pk).granted
    node_approve(
        actor=root, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok")
    )
    receipt = Receipt.objects.get(operation__node__task=task)
    assert {k: v for k, v in receipt_summary(receipt).items() if k != "remote_id"} == {
        k: v for k, v in GIVEN.items() if k != "remote_id"
    }
