"""What an external call (or a query by op key) can say. Connectors return these; record_outcome takes them.
``operation_after`` is what each makes of its operation, for every caller that records one."""

from dataclasses import dataclass, field
from typing import Any, Literal

from tasks.core.lifecycle import FailureClass, OperationStatus


@dataclass(frozen=True)
class Committed:
    """The remote committed the write. The fields are the receipt."""

    remote_id: str
    remote_version: str = ""
    count: int | None = None
    digest: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Accepted:
    """The remote accepted the write and is still running it."""

    remote_id: str


@dataclass(frozen=True)
class Failed:
    """A classified failure. ``connection_interrupted`` means the outcome is unknown."""

    failure_class: FailureClass
    detail: str = ""


@dataclass(frozen=True)
class NotFound:
    """A query by op key found no trace of the write yet. Final only once its deadline has passed (a request still in
    flight may land until then, unless the remote refuses it): tasks/decide/decisions.py ``not_found_final``."""


@dataclass(frozen=True)
class Fenced:
    """The remote took no effect under the op key and, from now on, refuses it (a fence: ``Connector.fence``): the
    write never happened and never will. A final "not found"."""


@dataclass(frozen=True)
class Unprovable:
    """The remote can neither dedupe nor be queried: a person must decide."""

    detail: str = ""


type Outcome = Committed | Accepted | Failed | NotFound | Fenced | Unprovable


# What a receipt shows, named here once: the receipt row, the log's summary of it, a node's output, a plan's
# evidence spec and a node's output reference all hold these four, and the API's outcome, the console's forms and
# the Python client (its own copy: it imports nothing of the server) ask for them; tests/test_receipt_fields.py
# holds every declaration of them to this tuple. Each with its JSON type: what a later node reads of an earlier one's
# output (a plan's ``{"from": …, "field": …}``) has that type (tasks/core/inputs.py).
RECEIPT_FIELD_TYPES: dict[str, Literal["string", "integer"]] = {
    "remote_id": "string",
    "remote_version": "string",
    "count": "integer",
    "digest": "string",
}
RECEIPT_FIELDS = tuple(RECEIPT_FIELD_TYPES)


# An unknown operation's failure class while its "not found" is not final yet (a cancel waits for its deadline or a
# fence).
NOT_FOUND_NOT_FINAL = "not_found_not_final"
# An unknown operation that was sent and must be made final before anything else is decided about it: asked by a
# fence (or, at a remote that cannot fence, by a lookup after its deadline). A sent intent when a cancel came.
AWAITING_FINAL = "awaiting_final"


@dataclass(frozen=True)
class OperationAfter:
    """What an outcome makes of the open operation it answers: its status, and the failure class it records."""

    status: OperationStatus
    failure_class: str = ""

    def fields(self) -> dict[str, str]:
        """As the operation's row takes them (the failure class only when there is one)."""
        return {"status": self.status.value} | ({"failure_class": self.failure_class} if self.failure_class else {})


def operation_after(outcome: Outcome, *, may_send_again: bool = True, not_found_final: bool = True) -> OperationAfter:
    """The one mapping of an outcome to its operation's status, for every operation (an effect, a compensation, a
    cleanup's delete). A receipt commits it, but a ``Committed`` without the remote's id proves nothing: unknown.
    Accepted is still running. Not found has not taken effect: an intent, sent again under the same op key — or, when
    nothing may be sent again (a cancel is recorded), rejected as cancelled once the not found is final, and unknown
    until then (a late request may still land). Fenced never took effect and never will: rejected (as cancelled when
    nothing may be sent again). A dropped connection, or a remote that can neither dedupe nor be queried, leaves it
    unknown; any other failure rejects it."""
    match outcome:
        case Committed(remote_id=""):
            return OperationAfter(OperationStatus.UNKNOWN, "no_receipt")
        case Committed():
            return OperationAfter(OperationStatus.COMMITTED)
        case Accepted():
            return OperationAfter(OperationStatus.ACCEPTED)
        case NotFound():
            if may_send_again:
                return OperationAfter(OperationStatus.INTENT)
            if not not_found_final:
                return OperationAfter(OperationStatus.UNKNOWN, NOT_FOUND_NOT_FINAL)
            return OperationAfter(OperationStatus.REJECTED, "cancelled")
        case Fenced():
            return OperationAfter(OperationStatus.REJECTED, "fenced" if may_send_again else "cancelled")
        case Unprovable():
            return OperationAfter(OperationStatus.UNKNOWN, "unprovable")
        case Failed(failure_class=FailureClass.CONNECTION_INTERRUPTED):
            return OperationAfter(OperationStatus.UNKNOWN, FailureClass.CONNECTION_INTERRUPTED.value)
        case Failed():
            return OperationAfter(OperationStatus.REJECTED, str(outcome.failure_class))
    raise TypeError(f"an outcome is one of Committed, Accepted, Failed, NotFound, Fenced, Unprovable, not {outcome!r}")
