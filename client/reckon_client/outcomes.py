"""What an external system said about one operation: the shapes of the contract's Outcome (docs/api.md).

A connector returns one of these and never raises for a remote's answer; the client posts it as the operation's
outcome. ``Failed("connection_interrupted")`` means "unknown": Reckon settles it later by a lookup by op key, never
by sending again blindly."""

from dataclasses import dataclass, field
from typing import Any, Literal

type FailureClass = Literal[
    "invalid_params", "permission_revoked", "dependency_unavailable", "connection_interrupted", "conflict"
]


@dataclass(frozen=True)
class Committed:
    """The remote committed the write; the fields are the receipt (checked against the node's evidence spec)."""

    remote_id: str
    remote_version: str = ""
    count: int | None = None
    digest: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Accepted:
    """The remote accepted the write and is still running it: Reckon polls it later by op key."""

    remote_id: str


@dataclass(frozen=True)
class Failed:
    """A classified failure (DESIGN §6). ``connection_interrupted``: the write may or may not have happened."""

    failure_class: FailureClass
    detail: str = ""


@dataclass(frozen=True)
class NotFound:
    """A query by op key found no trace yet: the write has not taken effect (it may be sent again, same op key; a
    cancel closes it only once the request's deadline has passed)."""


@dataclass(frozen=True)
class Fenced:
    """The answer to ``fence``: the remote took no effect under the op key and refuses it from now on (final)."""


@dataclass(frozen=True)
class Unprovable:
    """The remote can neither dedupe nor be queried: a person decides."""

    detail: str = ""


type Outcome = Committed | Accepted | Failed | NotFound | Fenced | Unprovable
OUTCOME_TYPES = (Committed, Accepted, Failed, NotFound, Fenced, Unprovable)

# What a receipt shows: the fields of ``Committed`` but its data. The server names them too
# (tasks.core.outcomes.RECEIPT_FIELDS); the client imports nothing of the server, and a test of the server's
# (tests/test_receipt_fields.py) holds the two equal.
RECEIPT_FIELDS = ("remote_id", "remote_version", "count", "digest")


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as the body of ``POST …/operations/{op_key}/outcome``."""
    match outcome:
        case Committed():
            # The remote id always; every other receipt field only when given.
            receipt = {name: getattr(outcome, name) for name in RECEIPT_FIELDS}
            body: dict[str, Any] = {"result": "committed"} | {
                name: value for name, value in receipt.items() if name == "remote_id" or value not in (None, "")
            }
            if outcome.data:
                body["data"] = outcome.data
            return body
        case Accepted():
            return {"result": "accepted", "remote_id": outcome.remote_id}
        case Failed():
            failed: dict[str, Any] = {"result": "failed", "failure_class": outcome.failure_class}
            return failed | ({"detail": outcome.detail} if outcome.detail else {})
        case NotFound():
            return {"result": "not_found"}
        case Fenced():
            return {"result": "fenced"}
        case Unprovable():
            return {"result": "unprovable"} | ({"detail": outcome.detail} if outcome.detail else {})
    raise TypeError(f"a connector must return an Outcome, not {type(outcome).__name__}")
