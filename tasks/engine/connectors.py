"""The connector contract: what the step protocol needs from any external system.

    outcome = connector.submit(op.op_key, op.request)   # send one write, exactly once per op key
    outcome = connector.lookup(op_key)                  # reconcile: what became of that op key?
    version = connector.current_version(locator)        # re-check an input ref before a node runs
    outcome = connector.delete(op_key, locator)         # remove one object (a temp copy), an operation of its own
    outcome = connector.compensate(op_key, request)     # a node's declared compensation, chosen explicitly

A connector never raises for a remote's answer: it returns an Outcome (tasks/core/outcomes.py) and classifies a failure
once, as DESIGN §6 says, so the protocol's branch depends on the class and never on the transport.

Two ways to be idempotent: the remote's own idempotency key (the op key), or, for a remote without one, the local
op-key registry plus a reconciliation query (a tag carrying the op key) that a write consults before it sends. A
remote that can neither dedupe nor be queried makes an unknown operation Unprovable: the task pauses for a person,
and nothing is ever resent blindly.
"""

from typing import Any, Protocol, runtime_checkable

from tasks.core.outcomes import Outcome


class SourceNotFound(LookupError):
    """The external system knows no source at this locator."""


@runtime_checkable
class Connector(Protocol):
    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        """Send ``request`` (an Operation.request: ``{"action", "input"}``) once, keyed by ``op_key``.

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
