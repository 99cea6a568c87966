"""An OpenAI Agents SDK agent whose side-effecting tool is Reckon-guarded: killed anywhere and started again with the
same session, it pays once; a call that needs approval interrupts the run until a person approves it on Reckon's
console.

    python examples/langgraph_agent.py remote --port 8200            # the payments service (counts every payment)
    python examples/openai_agents_agent.py --url http://127.0.0.1:8000 --token rk_… --remote http://127.0.0.1:8200 \\
        --session s1 --state ./s1 --to bob --amount 5 [--tool pay|pay_approved|email] [--approve]

The model is a scripted fake (the SDK's ``Model`` interface; no network, no API key, tracing off): its first turn
calls the tool, its second answers. The call id is new in every process (as a real model's would be), so a restarted
agent re-issues the same call only because the model's turn is kept in the state directory (``model-turns.json``,
as a durable-execution host records a model's answer). An interrupted run is kept there as the SDK's ``RunState``
(``run-state.json``); ``--approve`` approves its items in the SDK and runs it again — which pays only once Reckon's
approval binds the call. ``pay`` posts to the payments service with the op key as its Idempotency-Key and can look a
payment up by it; ``pay_approved`` is the same behind a person's approval; ``email`` can neither dedupe nor be asked
(a lost answer is left to a person). The last line printed is the run's JSON summary.
"""

import argparse
import asyncio
import json
import os
import sys
import uuid
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from agents.agent import Agent
from agents.items import ModelResponse, ToolCallOutputItem
from agents.models.interface import Model
from agents.run import Runner
from agents.run_state import RunState
from agents.tracing import set_tracing_disabled
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from reckon_client import NotFound, Reckon
from reckon_client.integrations.openai_agents import end_state, person_needed, reckon_function_tool
from reckon_client.tools import ToolCalls, ToolReceipt

# --------------------------------------------------------------------------------------------------- the model


class ScriptedModel(Model):
    """Turn 1: call ``tool`` with ``arguments`` (a fresh call id, kept in ``turns`` before it is answered, so a
    restarted process gives the same turn again); then: "Done."."""

    def __init__(self, tool: str, arguments: dict[str, Any], turns: Path) -> None:
        self.tool, self.arguments, self.turns = tool, arguments, turns

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        items = input if isinstance(input, list) else []
        if any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items):
            said = ResponseOutputText(type="output_text", text="Done.", annotations=[])
            message = ResponseOutputMessage(
                id="msg_done", type="message", role="assistant", status="completed", content=[said]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        return ModelResponse(output=[self._tool_call()], usage=Usage(), response_id=None)

    def _tool_call(self) -> ResponseFunctionToolCall:
        if not self.turns.exists():
            turn = {"call_id": f"call_{uuid.uuid4().hex[:12]}", "name": self.tool, "arguments": self.arguments}
            fresh = self.turns.with_name(self.turns.name + ".tmp")
            fresh.write_text(json.dumps(turn))
            os.replace(fresh, self.turns)  # whole or not at all
        turn = json.loads(self.turns.read_text())
        return ResponseFunctionToolCall(
            type="function_call", call_id=turn["call_id"], name=turn["name"], arguments=json.dumps(turn["arguments"])
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


# --------------------------------------------------------------------------------------------------- the agent


def tools_of(calls: ToolCalls, remote: str) -> dict[str, Any]:
    http = httpx.Client(base_url=remote, timeout=30)

    def send_payment(to: str, amount: int, *, op_key: str) -> ToolReceipt:
        """Pay ``amount`` to ``to``."""
        made = http.post("/payments", json={"to": to, "amount": amount}, headers={"Idempotency-Key": op_key})
        made.raise_for_status()
        return ToolReceipt(made.json(), remote_id=made.json()["id"])

    def find_payment(op_key: str) -> Any:
        found = http.get(f"/payments/by-key/{quote(op_key, safe='')}")  # an unreachable service raises: asked later
        if found.status_code == HTTPStatus.NOT_FOUND:
            return NotFound()
        found.raise_for_status()
        return ToolReceipt(found.json(), remote_id=found.json()["id"])

    def send_email(to: str, subject: str, *, op_key: str) -> dict[str, Any]:
        """Email ``to``."""
        sent = http.post("/emails", json={"to": to, "subject": subject})  # no key: this service cannot dedupe it
        sent.raise_for_status()
        return dict(sent.json())

    return {
        "pay": reckon_function_tool(calls, lookup=find_payment, name="pay")(send_payment),
        "pay_approved": reckon_function_tool(calls, lookup=find_payment, approval=True, name="pay_approved")(
            send_payment
        ),
        "email": reckon_function_tool(calls, name="email")(send_email),  # no lookup: an unknown outcome: a person
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the session's run, or go on with its interrupted state; the summary of where it stands."""
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    done, paused = state / "done.json", state / "run-state.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    with Reckon(args.url, args.token) as reckon:
        calls = ToolCalls(reckon, session=args.session, journal=state / "tool-calls.sqlite3", lease_ttl=args.lease_ttl)
        tool = tools_of(calls, args.remote)[args.tool]
        arguments = {"to": args.to, "amount": args.amount} if args.tool != "email" else {"to": args.to, "subject": "hi"}
        model = ScriptedModel(args.tool, arguments, state / "model-turns.json")
        agent = Agent(name="payer", instructions="Do what you are asked with your tool.", model=model, tools=[tool])
        given: Any = f"{args.tool} {json.dumps(arguments)}"
        if paused.exists():
            given = await RunState.from_string(agent, paused.read_text())
            if not args.approve:
                return await asyncio.to_thread(interrupted, given.get_interruptions())
            for item in given.get_interruptions():
                given.approve(item)  # the SDK's approval: the tool still asks Reckon's
        try:
            result = await Runner.run(agent, given)
        except Exception as error:
            ended = end_state(error)
            if ended is None:
                raise
            return {"status": type(ended).__name__, "task_id": ended.task_id, "reason": ended.reason}
        if result.interruptions:
            paused.write_text(result.to_state().to_string())
            return await asyncio.to_thread(interrupted, result.interruptions)
    outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    summary = {
        "status": "done",
        "answer": result.final_output,
        "tool_output": [item.output for item in outputs],
        "tool_call_ids": [item.call_id for item in outputs],
    }
    done.write_text(json.dumps(summary, default=str))
    paused.unlink(missing_ok=True)
    return summary


def interrupted(items: list[Any]) -> dict[str, Any]:
    """The run's interruptions, each with what Reckon says a person is asked now."""
    asked = []
    for item in items:
        needed = person_needed(item)
        asked.append(needed.payload() if needed else {"reckon": None, "tool": item.name, "call_id": item.call_id})
    return {"status": "interrupted", "interrupts": asked}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default=os.environ.get("RECKON_TOKEN", ""))
    parser.add_argument("--remote", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--state", required=True, help="a directory: the model's turn, the run state, the journal")
    parser.add_argument("--tool", choices=("pay", "pay_approved", "email"), default="pay")
    parser.add_argument("--to", default="bob")
    parser.add_argument("--amount", type=int, default=5)
    parser.add_argument("--approve", action="store_true", help="approve an interrupted run's items in the SDK")
    parser.add_argument("--lease-ttl", type=int, default=30)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    set_tracing_disabled(True)
    print(json.dumps(asyncio.run(run(args)), default=str), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
