"""LangGraph (and LangChain tools): a side-effecting tool as a Reckon-guarded tool. Each call — keyed by the
ToolCall's id, which ToolNode injects — is its own Reckon task (``reckon_client.tools``): a graph restarted from its
checkpoint re-issues the same call id, finds the same task and gets the output without the tool running again.

    calls = ToolCalls(reckon, session=thread_id, journal="tool-calls.sqlite3")

    @reckon_tool(calls, lookup=find_payment, approval=True)
    def pay(to: str, amount: int, *, op_key: str) -> dict:
        \"\"\"Pay ``amount`` to ``to``.\"\"\"
        return payments.post(..., headers={"Idempotency-Key": op_key}).json()

    graph = builder.add_node("tools", ToolNode([pay]))...

``op_key`` is Reckon's, never the model's (it is not in the tool's schema): pass it on as the remote's idempotency
key. A tool that needs a person — an approval of the exact call, or an outcome no one can prove — calls LangGraph's
``interrupt()`` with what the person is asked (``PersonNeeded.payload``): the graph pauses until it is resumed
(``Command(resume=…)``), then asks Reckon again. The resume value carries no authority: the call runs only once the
approval recorded on the console binds its exact arguments (Reckon checks it when the operation starts); otherwise it
interrupts again. The other end states are raised (``ToolCallStopped``, ``ToolCallFailed``, ``ToolCallHeld``, …).
"""

import inspect
from collections.abc import Callable
from typing import Annotated, Any

from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langchain_core.tools.base import create_schema_from_function
from langgraph.types import interrupt
from pydantic import create_model

from reckon_client.tools import PersonNeeded, Tool, ToolCalls

OP_KEY = "op_key"
CALL_ID = "tool_call_id"


def reckon_tool(
    calls: ToolCalls,
    *,
    lookup: Callable[[str], Any] | None = None,
    approval: bool = False,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any] | BaseTool], StructuredTool]:
    """Decorate a function taking the model's arguments and a keyword ``op_key`` (or wrap a LangChain tool, which
    is called without it) into a LangChain tool whose every call is a Reckon task. ``lookup(op_key)``: what became
    of a call (its output, ``NotFound()`` or ``Unprovable()``); without one, an unknown outcome is left to a
    person. ``approval``: every call waits for a person's approval of its exact arguments."""

    def wrap(target: Callable[..., Any] | BaseTool) -> StructuredTool:
        if isinstance(target, BaseTool):
            tool_name, about = name or target.name, description or target.description
            facing: Any = target.tool_call_schema

            def send(op_key: str, arguments: dict[str, Any]) -> Any:
                return target.invoke(arguments)

        else:
            function = target
            tool_name = name or function.__name__
            about = description or inspect.getdoc(function) or tool_name
            facing = create_schema_from_function(tool_name, function, filter_args=[OP_KEY, "run_manager", "callbacks"])

            def send(op_key: str, arguments: dict[str, Any]) -> Any:
                return function(**arguments, op_key=op_key)

        spec = Tool(tool_name, send=send, lookup=lookup, approval=approval)
        schema = create_model(
            f"{tool_name}_reckon",
            __base__=facing,
            **{CALL_ID: (Annotated[str, InjectedToolCallId], ...)},  # type: ignore[call-overload]
        )

        def run(**given: Any) -> Any:
            call_id = str(given.pop(CALL_ID))
            while True:
                try:
                    return calls.call(spec, call_id, given)
                except PersonNeeded as needed:
                    # Pauses the graph; once resumed, interrupt() answers the resume value and Reckon is asked again.
                    interrupt(needed.payload())

        return StructuredTool.from_function(
            func=run, name=tool_name, description=about, args_schema=schema, infer_schema=False
        )

    return wrap
