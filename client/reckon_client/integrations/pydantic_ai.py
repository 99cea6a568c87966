"""Pydantic AI: a side-effecting tool as a Reckon-guarded tool. Each call — keyed by the model's tool call id
(``RunContext.tool_call_id``) — is its own Reckon task (``reckon_client.tools``): a run resumed from its message
history re-issues the same call id, finds the same task and gets the output without the tool running again.

    calls = ToolCalls(reckon, session=conversation_id, journal="tool-calls.sqlite3")

    @reckon_tool(calls, lookup=find_payment, approval=True)
    def pay(to: str, amount: int, *, op_key: str) -> dict:
        \"\"\"Pay ``amount`` to ``to``.\"\"\"
        return payments.post(..., headers={"Idempotency-Key": op_key}).json()

    agent = Agent(model, tools=[pay], output_type=[str, DeferredToolRequests])

``op_key`` is Reckon's, never the model's (it is not in the tool's schema): pass it on as the remote's idempotency
key. The arguments registered (what a person approves, what the function is given) are the tool's validated
arguments in their JSON form.

A call that needs a person is one of Pydantic AI's deferred tool calls, and the run ends with
``DeferredToolRequests`` (each call's ``metadata``: ``PersonNeeded.payload()`` — the task, and for an approval the
digest the person approves):

- an approval of its exact arguments not given yet raises Pydantic AI's ``ApprovalRequired``: the call is in
  ``requests.approvals``. Once the person has approved on Reckon's console, resume the run with its message history
  and ``DeferredToolResults(approvals={call_id: True})`` (``deferred_results(requests)``): the tool asks Reckon
  again and runs only if Reckon's approval binds its request — Pydantic AI's approval alone grants nothing, the call
  is deferred for approval again;
- an outcome no one can prove raises ``CallDeferred`` (external: a person settles it on the console): the call is in
  ``requests.calls``; ``deferred_results(requests)`` asks Reckon what the person recorded and answers it as the
  call's result (it raises the call's end state while a person has not acted).

The other end states are raised out of the run (``ToolCallStopped``, ``ToolCallFailed``, ``ToolCallHeld``, …).
"""

import inspect
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import pydantic_ai
from pydantic_ai import CallDeferred, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_core import to_jsonable_python

from reckon_client.tools import ApprovalRequired, Tool, ToolCalls, ToolCallUnprovable, ToolOutputLost

OP_KEY = "op_key"
CONTEXT = "reckon_run_context"


class _Bound:
    def __init__(self, calls: ToolCalls, spec: Tool) -> None:
        self.calls, self.spec = calls, spec


_BOUND: "WeakKeyDictionary[Callable[..., Any], _Bound]" = WeakKeyDictionary()


def reckon_tool(
    calls: ToolCalls,
    *,
    lookup: Callable[[str], Any] | None = None,
    approval: bool = False,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], pydantic_ai.Tool[Any]]:
    """Decorate a function taking the model's arguments and a keyword ``op_key`` into a Pydantic AI ``Tool`` whose
    every call is a Reckon task. ``lookup(op_key)``: what became of a call (its output, ``NotFound()`` or
    ``Unprovable()``); without one, an unknown outcome is left to a person. ``approval``: every call waits for a
    person's approval of its exact arguments."""

    def wrap(function: Callable[..., Any]) -> pydantic_ai.Tool[Any]:
        tool_name = name or function.__name__

        def send(op_key: str, arguments: dict[str, Any]) -> Any:
            return function(**arguments, op_key=op_key)

        spec = Tool(tool_name, send=send, lookup=lookup, approval=approval)
        facing = [p for p in inspect.signature(function, eval_str=True).parameters.values() if p.name != OP_KEY]
        context = inspect.Parameter(CONTEXT, inspect.Parameter.POSITIONAL_ONLY, annotation=RunContext[Any])

        def run(context: RunContext[Any], /, **given: Any) -> Any:
            call_id = str(context.tool_call_id)
            try:
                return calls.call(spec, call_id, to_jsonable_python(given))
            except ApprovalRequired as needed:
                raise pydantic_ai.ApprovalRequired(metadata=needed.payload()) from needed
            except ToolCallUnprovable as needed:
                raise CallDeferred(metadata=needed.payload()) from needed

        run.__signature__ = inspect.Signature([context, *facing])  # type: ignore[attr-defined]
        run.__annotations__ = {CONTEXT: RunContext[Any]} | {p.name: p.annotation for p in facing}
        run.__name__ = run.__qualname__ = tool_name
        run.__doc__ = inspect.getdoc(function)
        _BOUND[run] = _Bound(calls, spec)
        return pydantic_ai.Tool(run, takes_ctx=True, name=tool_name, description=description)

    return wrap


def deferred_results(requests: DeferredToolRequests, tools: list[pydantic_ai.Tool[Any]]) -> DeferredToolResults:
    """The ``DeferredToolResults`` that resume a run ended with ``requests``, once a person has acted on Reckon's
    console: every approval asked "approved" (the tool asks Reckon again: only Reckon's approval lets it run), and
    every external call answered with what Reckon recorded for it. Raises a call's end state (``PersonNeeded``
    while the person has not acted yet); a call of a tool that is not Reckon's is left out."""
    bound = {tool.name: _BOUND.get(tool.function) for tool in tools}
    results = DeferredToolResults(approvals={part.tool_call_id: True for part in requests.approvals})
    for part in requests.calls:
        reckon = bound.get(part.tool_name)
        if reckon is None:
            continue
        arguments = requests.validated_args.get(part.tool_call_id, part.args_as_dict())
        try:
            results.calls[part.tool_call_id] = reckon.calls.call(reckon.spec, part.tool_call_id, arguments)
        except ToolOutputLost as lost:
            results.calls[part.tool_call_id] = (
                f"{part.tool_name} completed once (Reckon task {lost.task_id}); its output was not recorded"
            )
    return results
