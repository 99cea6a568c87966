"""The OpenAI Agents SDK: a side-effecting function tool as a Reckon-guarded tool. Each call — keyed by the SDK's
tool call id (``ToolContext.tool_call_id``) — is its own Reckon task (``reckon_client.tools``): a run restarted with
the same model turn re-issues the same call id, finds the same task and gets the output without the tool running
again.

    calls = ToolCalls(reckon, session=conversation_id, journal="tool-calls.sqlite3")

    @reckon_function_tool(calls, lookup=find_payment, approval=True)
    def pay(to: str, amount: int, *, op_key: str) -> dict:
        \"\"\"Pay ``amount`` to ``to``.\"\"\"
        return payments.post(..., headers={"Idempotency-Key": op_key}).json()

    agent = Agent(name="payer", tools=[pay], ...)

``op_key`` is Reckon's, never the model's (it is not in the tool's schema): pass it on as the remote's idempotency
key. The arguments registered (what a person approves, what the function is given) are the model's own JSON
arguments for the call.

A call that needs a person — an approval of its exact arguments not given yet, or an outcome no one can prove, left
to a person — is the SDK's interruption: the tool's ``needs_approval`` asks Reckon (it registers the call's task
and reads it; it runs nothing) and the run stops with a ``ToolApprovalItem`` for it (``person_needed(item)`` says
what the person is asked, and on which task). Once the person has acted on Reckon's console the application approves
the item in the SDK (``RunState.approve``) and runs the state again: the tool then asks Reckon, and the call runs
only if Reckon's approval binds its request. The SDK's approval carries no authority of its own: without Reckon's,
the tool raises ``ApprovalRequired`` and the run ends with it (``end_state(error)`` finds it in what
``Runner.run`` raised). So do every other end state (``ToolCallUnprovable`` found only once the call is run,
``ToolCallStopped``, ``ToolCallFailed``, ``ToolCallHeld``, …) and an error of Reckon's client: they end the run,
never reach the model as a tool result (the function's own exceptions are Reckon's to settle: looked up by op key,
never re-sent); only arguments the SDK refuses are told to the model, as its default tool error.
"""

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from agents.exceptions import ModelBehaviorError
from agents.tool import default_tool_error_function, function_tool
from agents.tool_context import ToolContext

from reckon_client.tools import (
    ApprovalRequired,
    PersonNeeded,
    Tool,
    ToolCallConflict,
    ToolCallError,
    ToolCalls,
    ToolCallUnprovable,
)

OP_KEY = "op_key"
CONTEXT = "reckon_tool_context"


def reckon_function_tool(
    calls: ToolCalls,
    *,
    lookup: Callable[[str], Any] | None = None,
    approval: bool = False,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorate a function taking the model's arguments and a keyword ``op_key`` into the SDK's ``FunctionTool``
    whose every call is a Reckon task. ``lookup(op_key)``: what became of a call (its output, ``NotFound()`` or
    ``Unprovable()``); without one, an unknown outcome is left to a person. ``approval``: every call waits for a
    person's approval of its exact arguments."""

    def wrap(function: Callable[..., Any]) -> Any:
        tool_name = name or function.__name__

        def send(op_key: str, arguments: dict[str, Any]) -> Any:
            return function(**arguments, op_key=op_key)

        spec = Tool(tool_name, send=send, lookup=lookup, approval=approval)
        facing = [p for p in inspect.signature(function, eval_str=True).parameters.values() if p.name != OP_KEY]
        context = inspect.Parameter(CONTEXT, inspect.Parameter.POSITIONAL_ONLY, annotation=ToolContext[Any])

        def run(context: Any, *args: Any, **kwargs: Any) -> Any:
            # The registered arguments are the model's JSON as the SDK validated it (the probe's, the item's).
            return calls.call(spec, str(context.tool_call_id), json.loads(context.tool_arguments or "{}"))

        run.__signature__ = inspect.Signature([context, *facing])  # type: ignore[attr-defined]
        run.__annotations__ = {CONTEXT: ToolContext[Any]} | {p.name: p.annotation for p in facing}
        run.__name__ = run.__qualname__ = tool_name
        run.__doc__ = inspect.getdoc(function)
        return function_tool(
            run,
            name_override=tool_name,
            description_override=description,
            needs_approval=_Probe(calls, spec),
            failure_error_function=_reported,
        )

    return wrap


def person_needed(item: Any) -> PersonNeeded | None:
    """What a person is asked for one of a run's interruptions (a ``ToolApprovalItem``), read from Reckon now: the
    approval awaited (``ApprovalRequired``: its ``payload()`` names the task and the digest to approve) or the
    settlement of an unprovable call (``ToolCallUnprovable``); None once nothing waits for a person, or for an item
    that is not a Reckon tool's."""
    tool = next((t for t in getattr(item.agent, "tools", []) if getattr(t, "name", None) == item.name), None)
    probe = getattr(tool, "needs_approval", None)
    if not isinstance(probe, _Probe):
        return None
    return probe.needed(str(item.call_id), json.loads(item.arguments or "{}"))


def end_state(error: BaseException) -> ToolCallError | None:
    """The Reckon end state that ended a run (``Runner.run`` raises it wrapped in the SDK's ``UserError``)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ToolCallError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _reported(context: Any, error: Exception) -> Any:
    """The tool's failure policy: arguments the SDK refused before anything was registered are the SDK's default
    tool error, which the model reads; everything else ends the run (None re-raises it). A Reckon client error
    told to the model could make it call again under a new call id — a new task, a second effect — while the
    first call's operation may be in flight; a run restarted re-issues the same call id instead."""
    if isinstance(error, ModelBehaviorError):
        return default_tool_error_function(context, error)
    return None


class _Probe:
    """The tool's ``needs_approval``: whether the call must wait for a person, asked of its Reckon task
    (``ToolCalls.register``, as ``ToolCalls.call`` finds it). Runs nothing."""

    def __init__(self, calls: ToolCalls, spec: Tool) -> None:
        self.calls, self.spec = calls, spec

    async def __call__(self, context: Any, arguments: dict[str, Any], call_id: str) -> bool:
        return await asyncio.to_thread(self.needed, call_id, arguments) is not None

    def needed(self, call_id: str, arguments: Mapping[str, Any]) -> PersonNeeded | None:
        named: dict[str, Any] = {"tool": self.spec.name, "call_id": call_id}
        try:
            task = self.calls.register(self.spec, call_id, arguments)
        except ToolCallConflict:
            return None  # not that call: the tool raises ToolCallConflict and runs nothing
        named["task_id"] = task.id
        awaited = [a for a in task.raw.get("approvals") or [] if a.get("state") == "awaited"]
        if awaited:
            why = awaited[0].get("why") or "a person's approval of this exact call"
            return ApprovalRequired(
                f"{self.spec.name} {call_id} waits for approval on task {task.id}: {why}",
                approval=awaited[0],
                arguments=arguments,
                reason="awaiting_approval",
                **named,
            )
        if task.status == "paused" and task.status_reason == "unprovable":
            return ToolCallUnprovable(
                f"{self.spec.name} {call_id}: whether the call took effect is unknown and the tool cannot be asked; "
                f"a person settles task {task.id} on the console",
                reason="unprovable",
                **named,
            )
        return None
