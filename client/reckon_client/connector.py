"""What an agent author writes: one connector per external system, three calls (``compensate``, ``fence`` and
``delete`` optional).

    class Store:                                      # satisfies Connector
        def submit(self, op_key, request): ...        # send request["input"] for request["action"], keyed by op_key
        def lookup(self, op_key): ...                 # what became of op_key? Committed / Accepted / NotFound / …
        def current_version(self, locator): ...       # an input ref's version now (raise OSError if unreachable)

``request`` is the operation Reckon registered before the call: ``{"action": …, "input": …}`` with every input
resolved. The op key is the remote's idempotency key: sending the same op key twice must not write twice.
``lookup`` that cannot reach the remote returns ``Failed("connection_interrupted")``: the run stops and the next
one asks again.

A final "not found" (docs/api.md): ``request["not_after"]`` is the request's deadline (ISO 8601, the server's
database clock); a remote that cannot fence must refuse a request that reaches it later — return that refusal as
``Failed("dependency_unavailable")`` (no effect, retried on the budget), never ``NotFound``. A connector whose
remote can fence adds ``fence(op_key)``: what became of op_key, and if nothing, refuse it from now on (``Fenced``)
— asked instead of ``lookup`` once a cancel is recorded, so the cancel need not wait for the deadline.

Temp resources (docs/api.md, "Cleanup"): a receipt may name what the write left behind (``data={"temp":
[locator, …]}``, a staging copy). Once the task has ended, Reckon tells the agent to delete each under an op key of
its own; a connector with ``delete(op_key, locator)`` (``Deleting``) does it. Without one the client stops at that
directive (``cleanup_unsupported``) and the temp resources are listed for a person.
"""

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from reckon_client.outcomes import Failed, Outcome


@runtime_checkable
class Connector(Protocol):
    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome: ...
    def lookup(self, op_key: str) -> Outcome: ...
    def current_version(self, locator: str) -> str: ...


@runtime_checkable
class Fencing(Protocol):
    def fence(self, op_key: str) -> Outcome: ...


@runtime_checkable
class Deleting(Protocol):
    """Delete exactly ``locator`` (a temp resource a receipt named in ``data["temp"]``) under ``op_key``, the
    remote's idempotency key: a second delete under the same op key deletes nothing more. Answers like ``submit``
    (``Committed`` with the remote's id is the cleanup receipt; a remote that cannot do it now,
    ``Failed("dependency_unavailable")``: Reckon backs off and spends no attempt)."""

    def delete(self, op_key: str, locator: str) -> Outcome: ...


@runtime_checkable
class AsyncConnector(Protocol):
    async def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome: ...
    async def lookup(self, op_key: str) -> Outcome: ...
    async def current_version(self, locator: str) -> str: ...


type Send = Callable[[str, dict[str, Any]], Outcome]


class Actions:
    """A connector made of one function per action, for an author who prefers decorators to a class:

        store = Actions(lookup=store_lookup, current_version=store_version)

        @store.action("store.copy_batch")
        def copy_batch(op_key: str, input: dict[str, Any]) -> Outcome:
            ...   # send input to the store with op_key as its idempotency key; return what it said

    An operation whose action has no function is answered ``Failed("invalid_params")``: nothing is sent.
    """

    def __init__(self, *, lookup: Callable[[str], Outcome], current_version: Callable[[str], str]) -> None:
        self._sends: dict[str, Send] = {}
        self._lookup, self._current_version = lookup, current_version

    def action(self, name: str) -> Callable[[Send], Send]:
        def register(send: Send) -> Send:
            self._sends[name] = send
            return send

        return register

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        action = str(request.get("action", ""))
        send = self._sends.get(action)
        if send is None:
            return Failed("invalid_params", f"no function for action {action!r}")
        return send(op_key, dict(request.get("input") or {}))

    def lookup(self, op_key: str) -> Outcome:
        return self._lookup(op_key)

    def current_version(self, locator: str) -> str:
        return self._current_version(locator)
