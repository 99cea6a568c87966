"""A Pydantic AI agent whose side-effecting tool is Reckon-guarded: killed anywhere and started again with the same
session, it pays once; a call that needs approval is deferred until a person approves it on Reckon's console.

    python examples/langgraph_agent.py remote --port 8200            # the payments service (counts every payment)
    python examples/pydantic_ai_agent.py --url http://127.0.0.1:8000 --token rk_… --remote http://127.0.0.1:8200 \\
        --session s1 --state ./s1 --to bob --amount 5 [--tool pay|pay_approved|email] [--approve]

The model is Pydantic AI's ``FunctionModel`` (no network, no API key): its first turn calls the tool, its second
answers. The call id is new in every process (as a real model's would be), so a restarted agent re-issues the same
call only because the run's message history is kept in the state directory (``messages.json``, written after every
step of ``Agent.iter``: the model's turn is on disk before its tool runs) and the run goes on from it. A run that
ended with ``DeferredToolRequests`` keeps them there (``deferred.json``); ``--approve`` resumes it with
``deferred_results`` — which pays only once Reckon's approval binds the call. ``pay`` posts to the payments service
with the op key as its Idempotency-Key and can look a payment up by it; ``pay_approved`` is the same behind a
person's approval; ``email`` can neither dedupe nor be asked (a lost answer is left to a person). The last line
printed is the run's JSON summary.
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
from pydantic import TypeAdapter
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from reckon_client import NotFound, Reckon
from reckon_client.integrations.pydantic_ai import deferred_results, reckon_tool
from reckon_client.tools import ToolCallError, ToolCalls, ToolReceipt

REQUESTS = TypeAdapter(DeferredToolRequests)


def scripted_model(tool: str, arguments: dict[str, Any]) -> FunctionModel:
    """Turn 1: call ``tool`` with ``arguments`` (a fresh call id); once a tool answered: "Done."."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(part, ToolReturnPart) for message in messages for part in message.parts):
            return ModelResponse(parts=[TextPart("Done.")])
        return ModelResponse(parts=[ToolCallPart(tool, arguments, tool_call_id=f"call_{uuid.uuid4().hex[:12]}")])

    return FunctionModel(respond)


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
        "pay": reckon_tool(calls, lookup=find_payment, name="pay")(send_payment),
        "pay_approved": reckon_tool(calls, lookup=find_payment, approval=True, name="pay_approved")(send_payment),
        "email": reckon_tool(calls, name="email")(send_email),  # no lookup: an unknown outcome goes to a person
    }


def kept(path: Path, data: bytes) -> None:
    fresh = path.with_name(path.name + ".tmp")
    fresh.write_bytes(data)
    os.replace(fresh, path)  # whole or not at all: a process killed mid-write keeps the last one


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the session's run, or go on from its history; the summary of where it stands."""
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    done, history_file, deferred = state / "done.json", state / "messages.json", state / "deferred.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    with Reckon(args.url, args.token) as reckon:
        calls = ToolCalls(reckon, session=args.session, journal=state / "tool-calls.sqlite3", lease_ttl=args.lease_ttl)
        tool = tools_of(calls, args.remote)[args.tool]
        arguments = {"to": args.to, "amount": args.amount} if args.tool != "email" else {"to": args.to, "subject": "hi"}
        agent = Agent(scripted_model(tool.name, arguments), tools=[tool], output_type=[str, DeferredToolRequests])
        history = ModelMessagesTypeAdapter.validate_json(history_file.read_bytes()) if history_file.exists() else None
        prompt: str | None = None if history else f"{args.tool} {json.dumps(arguments)}"
        results: DeferredToolResults | None = None
        if deferred.exists():
            requests = REQUESTS.validate_json(deferred.read_bytes())
            if not args.approve:
                return {"status": "deferred", "deferred": requests.metadata}
            try:
                results = await asyncio.to_thread(deferred_results, requests, [tool])
            except ToolCallError as ended:
                return {"status": type(ended).__name__, "task_id": ended.task_id, "reason": ended.reason}
        try:
            async with agent.iter(prompt, message_history=history, deferred_tool_results=results) as running:
                async for _ in running:  # each step's history on disk before the next step runs
                    kept(history_file, ModelMessagesTypeAdapter.dump_json(running.all_messages()))
                finished = running.result
        except ToolCallError as ended:
            return {"status": type(ended).__name__, "task_id": ended.task_id, "reason": ended.reason}
    if finished is None:
        raise RuntimeError("the run ended without a result")
    kept(history_file, ModelMessagesTypeAdapter.dump_json(finished.all_messages()))
    if isinstance(finished.output, DeferredToolRequests):
        kept(deferred, REQUESTS.dump_json(finished.output))
        return {"status": "deferred", "deferred": finished.output.metadata}
    deferred.unlink(missing_ok=True)
    returns = [p for m in finished.new_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    summary = {
        "status": "done",
        "answer": finished.output,
        "tool_output": [p.content for p in returns],
        "tool_call_ids": [p.tool_call_id for p in returns],
    }
    done.write_text(json.dumps(summary, default=str))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default=os.environ.get("RECKON_TOKEN", ""))
    parser.add_argument("--remote", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--state", required=True, help="a directory: the run's message history and the journal")
    parser.add_argument("--tool", choices=("pay", "pay_approved", "email"), default="pay")
    parser.add_argument("--to", default="bob")
    parser.add_argument("--amount", type=int, default=5)
    parser.add_argument("--approve", action="store_true", help="resume a deferred run once a person has acted")
    parser.add_argument("--lease-ttl", type=int, default=30)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), default=str), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
