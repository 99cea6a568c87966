"""What an external call (or a query by op key) can say. Connectors return these; record_outcome takes them."""

from dataclasses import dataclass, field
from typing import Any

from tasks.core.lifecycle import FailureClass


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
    """A query by op key found no trace of the write: it never took effect."""


@dataclass(frozen=True)
class Unprovable:
    """The remote can neither dedupe nor be queried: a person must decide."""

    detail: str = ""


type Outcome = Committed | Accepted | Failed | NotFound | Unprovable


# What a receipt shows, named here once: the receipt row, the log's summary of it, a node's output, a plan's
# evidence spec and a node's output reference all hold these four.
RECEIPT_FIELDS = ("remote_id", "remote_version", "count", "digest")
