"""A LangGraph ReAct-style agent whose side-effecting tool is Reckon-guarded: killed anywhere and started again with
the same session, it pays once.

    python examples/langgraph_agent.py remote --port 8200            # the payments service (counts every payment)
    python examples/langgraph_agent.py run --url http://127.0.0.1:8000 --token rk_… --remote http://127.0.0.1:8200 \\
        --session s1 --state ./s1 --to bob --amount 5 [--tool pay|pay_approved|email] [--resume]

The model is a fake chat model (no network, no API key): its first turn calls the tool, its second answers. The call
id is new in every process (as a real model's would be), so a restarted agent re-issues the same call only because
the graph's checkpoint (a file, ``FileSaver``) holds the model's turn. The tool ``pay`` posts to the payments
service with the op key as its Idempotency-Key and can look a payment up by it; ``pay_approved`` is the same behind
a person's approval (the graph interrupts until it is given on the console, then ``--resume``); ``email`` can neither
dedupe nor be asked (a lost answer is left to a person). The last line printed is the run's JSON summary.
"""

import argparse
import json
import os
import pickle
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import quote

import httpx
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command
from reckon_client import NotFound, Reckon
from reckon_client.integrations.langgraph import reckon_tool
from reckon_client.tools import ToolCallError, ToolCalls, ToolReceipt

# --------------------------------------------------------------------------------------------------- the remote


class Payments:
    """A payments service that counts what it does. ``POST /payments`` pays (once per Idempotency-Key, when one is
    sent); ``GET /payments/by-key/<key>`` answers the payment made under a key; ``POST /emails`` sends an email (no
    key, no query: every request is an email). ``hold`` seconds: the next write waits that long after it took
    effect before answering (a caller killed meanwhile never hears of it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.payments: dict[str, dict[str, Any]] = {}  # by key
        self.performed: list[dict[str, Any]] = []  # every payment and email made, in order
        self.requests = 0
        self.hold = 0.0

    def pay(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            if key and key in self.payments:
                return self.payments[key]
            made = {"id": f"pay-{len(self.performed) + 1}", "to": body.get("to"), "amount": body.get("amount")}
            self.performed.append(made | {"key": key, "what": "payment"})
            if key:
                self.payments[key] = made
            hold, self.hold = self.hold, 0.0
        time.sleep(hold)
        return made

    def email(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            made = {"id": f"mail-{len(self.performed) + 1}", "to": body.get("to")}
            self.performed.append(made | {"what": "email"})
            hold, self.hold = self.hold, 0.0
        time.sleep(hold)
        return made

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": self.requests, "performed": list(self.performed)}


def payments_server(port: int = 0) -> tuple[ThreadingHTTPServer, Payments]:
    """The service on 127.0.0.1:``port`` (0: a free one), serving in a daemon thread."""
    service = Payments()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return dict(json.loads(self.rfile.read(length) or b"{}"))

        def do_GET(self) -> None:
            if self.path == "/_stats":
                self._send(HTTPStatus.OK, service.stats())
            elif self.path.startswith("/payments/by-key/"):
                with service.lock:
                    found = service.payments.get(self.path.removeprefix("/payments/by-key/"))
                self._send(HTTPStatus.OK if found else HTTPStatus.NOT_FOUND, found or {"error": "not_found"})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": "not_found"})

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/payments":
                self._send(HTTPStatus.OK, service.pay(self.headers.get("Idempotency-Key") or "", body))
            elif self.path == "/emails":
                self._send(HTTPStatus.OK, service.email(body))
            elif self.path == "/_hold":
                service.hold = float(body.get("seconds", 0))
                self._send(HTTPStatus.OK, {"hold": service.hold})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": "not_found"})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="payments", daemon=True).start()
    return server, service


# --------------------------------------------------------------------------------------------- a file checkpointer


class FileSaver(InMemorySaver):  # type: ignore[misc]  # langgraph is read untyped here
    """LangGraph's in-memory checkpointer, written to one file after every change and read back at start: a process
    killed and started again resumes its threads from their last checkpoint. (For production: a Postgres or SQLite
    checkpointer.)"""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.lock = path, threading.Lock()  # LangGraph writes from its background threads
        if path.exists():
            # Our own file, written below by this agent: not data from elsewhere.
            storage, writes, blobs = pickle.loads(path.read_bytes())  # noqa: S301
            for thread, spaces in storage.items():
                self.storage[thread].update(spaces)
            self.writes.update(writes)
            self.blobs.update(blobs)

    def _save(self) -> None:
        with self.lock:
            storage = {thread: {ns: dict(c) for ns, c in spaces.items()} for thread, spaces in self.storage.items()}
            data = pickle.dumps((storage, {k: dict(v) for k, v in self.writes.items()}, dict(self.blobs)))
            fresh = self.path.with_name(self.path.name + ".tmp")
            fresh.write_bytes(data)
            os.replace(fresh, self.path)  # whole or not at all: a process killed mid-write keeps the last one

    def put(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> RunnableConfig:
        saved: RunnableConfig = super().put(config, checkpoint, metadata, new_versions)
        self._save()
        return saved

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        super().put_writes(config, writes, task_id, task_path)
        self._save()


# --------------------------------------------------------------------------------------------------- the agent


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


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


def graph_of(tool: Any, arguments: dict[str, Any], checkpoint: Path) -> CompiledStateGraph[Any, Any, Any, Any]:
    # The model's two turns. A fresh call id in each process: the same call comes back only from the checkpoint.
    turns: list[BaseMessage] = [
        AIMessage("", tool_calls=[{"name": tool.name, "args": arguments, "id": f"call_{uuid.uuid4().hex[:12]}"}]),
        AIMessage("Done."),
    ]
    model = FakeMessagesListChatModel(responses=turns)

    def agent(state: State) -> dict[str, list[AnyMessage]]:
        model.i = min(sum(isinstance(m, AIMessage) for m in state["messages"]), len(turns) - 1)  # its turn now
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=FileSaver(checkpoint))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the session's graph, or go on from its checkpoint; the summary of where it stands."""
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    with Reckon(args.url, args.token) as reckon:
        calls = ToolCalls(reckon, session=args.session, journal=state / "tool-calls.sqlite3", lease_ttl=args.lease_ttl)
        tool = tools_of(calls, args.remote)[args.tool]
        arguments = {"to": args.to, "amount": args.amount} if args.tool != "email" else {"to": args.to, "subject": "hi"}
        graph = graph_of(tool, arguments, state / "checkpoint.pickle")
        config: RunnableConfig = {"configurable": {"thread_id": args.session}}
        now = graph.get_state(config)
        given: Any
        if now.interrupts:
            given = Command(resume=args.resume or "asked again")
        elif now.next:
            given = None  # killed mid-graph: go on from the last checkpoint
        elif now.values:
            given = None
        else:
            given = {"messages": [HumanMessage(f"{args.tool} {json.dumps(arguments)}")]}
        finished = bool(now.values) and not now.next and not now.interrupts
        try:
            final = now.values if finished else graph.invoke(given, config)
        except ToolCallError as ended:
            return {"status": type(ended).__name__, "task_id": ended.task_id, "reason": ended.reason}
        paused = graph.get_state(config).interrupts
        if paused:
            return {"status": "interrupted", "interrupts": [p.value for p in paused]}
        tool_messages = [m for m in final["messages"] if m.type == "tool"]
        return {
            "status": "done",
            "answer": final["messages"][-1].content,
            "tool_output": [m.content for m in tool_messages],
            "tool_call_ids": [m.tool_call_id for m in tool_messages],
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    remote = commands.add_parser("remote", help="serve the payments service")
    remote.add_argument("--port", type=int, default=8200)
    agent = commands.add_parser("run", help="run (or go on with) the session's graph")
    agent.add_argument("--url", required=True)
    agent.add_argument("--token", default=os.environ.get("RECKON_TOKEN", ""))
    agent.add_argument("--remote", required=True)
    agent.add_argument("--session", required=True)
    agent.add_argument("--state", required=True, help="a directory: the graph's checkpoint and the tool journal")
    agent.add_argument("--tool", choices=("pay", "pay_approved", "email"), default="pay")
    agent.add_argument("--to", default="bob")
    agent.add_argument("--amount", type=int, default=5)
    agent.add_argument("--resume", default="", help="the resume value sent to an interrupted graph")
    agent.add_argument("--lease-ttl", type=int, default=30)
    args = parser.parse_args(argv)
    if args.command == "remote":
        server, _ = payments_server(args.port)
        print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
        threading.Event().wait()
    print(json.dumps(run(args)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
