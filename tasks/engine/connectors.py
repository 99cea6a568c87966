"""The connector contract: what the step protocol needs from any external system.

    outcome = connector.submit(op.op_key, op.request)   # send one write, exactly once per op key
    outcome = connector.lookup(op_key)                  # reconcile: what became of that op key?
    outcome = connector.fence(op_key)                   # the same, final: if nothing, refuse op_key from now on
    version = connector.current_version(locator)        # re-check an input ref before a node runs
    outcome = connector.delete(op_key, locator)         # remove one object (a temp copy), an operation of its own
    outcome = connector.compensate(op_key, request)     # a node's declared compensation, chosen explicitly

A connector never raises for a remote's answer: it returns an Outcome (tasks/core/outcomes.py) and classifies a failure
once, as DESIGN §6 says, so the protocol's branch depends on the class and never on the transport.

Two ways to be idempotent: the remote's own idempotency key (the op key), or, for a remote without one, the local
op-key registry plus a reconciliation query (a tag carrying the op key) that a write consults before it sends. A
remote that can neither dedupe nor be queried makes an unknown operation Unprovable: the task pauses for a person,
and nothing is ever resent blindly.

A final "not found" (docs/design.md): a request may still be in flight when a lookup finds nothing. Before a cancel or
a person closes an operation as never done, the "not found" must be final, in one of two ways:

- ``fence(op_key)`` (the ``Fencing`` protocol, optional): atomically at the remote, what became of op_key — and if
  nothing, a tombstone that refuses any later request under it. Its ``Fenced`` answer is final at once.
- the deadline: every request carries ``request["not_after"]`` (ISO 8601, the database clock at its send plus
  RECKON_REQUEST_DEADLINE); the remote refuses a request that arrives after it. A ``NotFound`` is final once the
  database clock is past it plus RECKON_REMOTE_CLOCK_SKEW. A connector without ``fence`` relies on this, so its
  remote must honour the deadline.
"""

from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from tasks.core.outcomes import Outcome


class SourceNotFound(LookupError):
    """The external system knows no source at this locator."""


@runtime_checkable
class Connector(Protocol):
    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        """Send ``request`` (an Operation.request: ``{"action", "input"}``, with ``"not_after"``, the deadline the
        remote must refuse it after) once, keyed by ``op_key``.

        Committed or Accepted on success; Failed with its class otherwise. ``connection_interrupted`` means the
        outcome is unknown: settle it with ``lookup``, never by sending again blindly.
        """
        ...

    def lookup(self, op_key: str) -> Outcome:
        """What the remote holds for ``op_key``: Committed, Accepted, NotFound (it never took effect) or
        Unprovable (the remote cannot be queried). A lookup that itself fails returns
        Failed(connection_interrupted): still unknown, ask again later."""
        ...

    def current_version(self, locator: str) -> str:
        """The version the external system holds now for an input ref's locator; SourceNotFound if none."""
        ...

    def delete(self, op_key: str, locator: str) -> Outcome:
        """Delete the one object at ``locator`` (exactly that key, never a prefix), as the operation ``op_key``.

        Idempotent: ``Committed(remote_id=locator, count=<number removed>)``, and ``count=0`` when it was already
        gone. Exactly once per op key, settled with ``lookup`` like ``submit``; failures are classified like
        ``submit``'s (a malformed locator is ``invalid_params``).
        """
        ...

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        """Send a compensation under its own ``op_key``: ``request`` is ``{"action": <the node's declared
        compensation action>, "input": <the original node's resolved input>}``.

        Same semantics as ``submit`` (exactly once per op key, the same failure classes, an action the remote does
        not know is ``invalid_params``). Only ever called by an explicit choice; the connector never retries it.
        """
        ...


@runtime_checkable
class Fencing(Protocol):
    """A connector whose remote can fence an op key (a tombstone checked in the same step as a write)."""

    def fence(self, op_key: str) -> Outcome:
        """What became of ``op_key``, final: Committed / Accepted when it took effect (as ``lookup``); otherwise the
        remote refuses ``op_key`` from now on and this answers ``Fenced``. ``Failed(connection_interrupted)`` when
        the fence got no answer (still unknown: ask again); a remote that turns out unable to fence answers as
        ``lookup`` does (a ``NotFound`` is then final only past the deadline)."""
        ...


def send_view(request: dict[str, Any], not_after: datetime | None) -> dict[str, Any]:
    """What a connector is handed for a write: the operation's request and, when it has one, its deadline."""
    return request | {"not_after": not_after.isoformat()} if not_after is not None else request


def reconcile(connector: Connector, op_key: str, *, fence: bool) -> Outcome:
    """Ask the remote what became of ``op_key``: fenced when a final answer is needed and the connector can fence,
    looked up otherwise (a ``NotFound`` then waits for the deadline)."""
    if fence and isinstance(connector, Fencing):
        return connector.fence(op_key)
    return connector.lookup(op_key)
