"""What an agent author writes: one connector per external system, three calls (``compensate`` optional).

    class Store:                                      # satisfies Connector
        def submit(self, op_key, request): ...        # send request["input"] for request["action"], keyed by op_key
        def lookup(self, op_key): ...                 # what became of op_key? Committed / Accepted / NotFound / …
        def current_version(self, locator): ...       # an input ref's version now (raise OSError if unreachable)

``request`` is the operation Reckon registered before the call: ``{"action": …, "input": …}`` with every input
resolved. The op key is the remote's idempotency key: sending the same op key twice must not write twice.
``lookup`` that cannot reach the remote returns ``Failed("connection_interrupted")``: the run stops and the next
one asks again.
"""

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from reckon_client.outcomes import Outcome


@runtime_checkable
class Connector(Protocol):
    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome: ...
    def lookup(self, op_key: str) -> Outcome: ...
    def current_version(self, locator: str) -> str: ...


@runtime_checkable
class AsyncConnector(Protocol):
    async def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome: ...
    async def lookup(self, op_key: str) -> Outcome: ...
    async def current_version(self, locator: str) -> str: ...
