"""The connector contract: what the step protocol needs from any external system.

    outcome = connector.submit(op.op_key, op.request)   # the op key is the remote's idempotency key
    outcome = connector.lookup(op_key)                  # reconcile: what became of that op key?
    version = connector.current_version(locator)        # re-check an input ref before a node runs

A connector never raises for a remote's answer: it returns an Outcome (tasks/outcomes.py) and classifies a failure
once, as DESIGN §6 says, so the protocol's branch depends on the class and never on the transport.
"""

from typing import Any, Protocol, runtime_checkable

from tasks.outcomes import Outcome


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
