"""A receipt: what the external system says it committed — the evidence of a side effect. Its fields are named
here once: the row, the log's summary of it and a node's output all hold the same four."""

from typing import Any

from audit.hygiene import check_payload
from tasks import rows
from tasks.core.errors import EvidenceInsufficient
from tasks.core.lifecycle import NodeStatus
from tasks.core.outcomes import RECEIPT_FIELDS, Committed
from tasks.models import Operation, Receipt


def receipt_of(op: Operation, outcome: Committed) -> Receipt:
    """The receipt row for what the remote committed (inserted by the recording compare-and-set): its data is not
    covered by an event's append (the event carries the receipt's fields only), so it is checked here, for every
    path that records a receipt (a node's settlement, a compensation, a temp resource's delete)."""
    check_payload(outcome.data, what="receipt data")
    values = {"operation_id": op.pk, **receipt_summary(outcome), "data": outcome.data}
    return rows.new_row(Receipt, values, {"operation": op})


def receipt_summary(receipt: Any) -> dict[str, Any]:
    """The receipt as the log records it, and as a node's output holds it (tasks/engine/verification.py compares)."""
    return {name: getattr(receipt, name) for name in RECEIPT_FIELDS}


def succeeded_fields(receipt: Receipt | Committed) -> dict[str, Any]:
    """A node's fields once a receipt proved its effect."""
    return {
        "status": NodeStatus.SUCCEEDED.value,
        "output": receipt_summary(receipt),
        "last_error_class": "",
        "next_allowed_action": "",
        "not_before": None,
    }


def temp_locators(outcome: Committed) -> list[str]:
    temp = outcome.data.get("temp", [])
    if not isinstance(temp, list) or not all(isinstance(t, str) and t and len(t) <= 500 for t in temp):
        raise EvidenceInsufficient("a receipt's temp resources must be a list of locators")
    return list(dict.fromkeys(temp))
