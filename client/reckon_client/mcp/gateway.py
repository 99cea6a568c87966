"""The MCP gateway: Reckon in front of any MCP server's tools.

    python -m reckon_client.mcp gateway --url http://127.0.0.1:8000 --session run-42 \\
        --journal run-42.sqlite3 --approve transfer_funds -- python my_mcp_server.py

The agent connects to the gateway (stdio) instead of the server; the gateway starts the server (the command after
``--``) as its own client and offers the agent the server's tools under the same names and schemas. Each
``tools/call`` becomes one Reckon tool call (``reckon_client.tools``): a task of its own (``project``: the session)
whose operation — its op key — is registered before the call reaches the server, whose answer is the receipt, and
whose output is kept; with ``--approve``, a person approves the exact arguments on the console first.

**Which call is which.** An MCP request has no call id that survives the agent's restart. The gateway takes the call
id from the request's ``_meta["reckon/call_id"]`` when the agent gives one; otherwise it is the digest of the tool's
name and arguments: within a session, the same tool called with the same arguments is the same call — sent once,
its output answered again. An agent that means to make the same call twice names each with its own call id.

**What the agent reads back.** The server's answer (its content, structured content and error flag), unchanged. A
call that cannot give one now is an error result that says why and names the task: an approval awaited (with the
digest a person approves), a person needed to settle a call whose effect is unknown (an MCP server cannot be asked
what became of a call: after a crash mid-call the call is never sent again), an operator's stop, a refusal.
The server's own error result (``isError``) is taken as its refusal: the call's task fails, nothing is retried.
"""

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client, stdio_server
from mcp.server.lowlevel import Server

from reckon_client.outcomes import Failed
from reckon_client.sync import Reckon
from reckon_client.tools import ApprovalRequired, PersonNeeded, Tool, ToolCallError, ToolCalls

CALL_ID = "reckon/call_id"  # the key of a request's _meta naming its call
INSTRUCTIONS = """The tools of another MCP server, through Reckon: each call is registered before it is sent and sent
at most once per session — the same tool with the same arguments answers the first call's output again (name a
distinct call in _meta["reckon/call_id"] to make the same call twice). An error result that names a Reckon task
waits for a person (an approval, or a call whose effect is unknown): call again, with the same arguments, once they
have acted."""


class Gateway:
    """The gateway's handlers: the upstream server's tools, each call through ``calls``."""

    def __init__(
        self, calls: ToolCalls, upstream: ClientSession, tools: list[types.Tool], approve: frozenset[str]
    ) -> None:
        self.calls, self.upstream, self.approve = calls, upstream, approve
        self.tools = {tool.name: tool for tool in tools}
        unknown = sorted(approve - set(self.tools))
        if unknown:
            raise ValueError(f"--approve names tools the server does not offer: {', '.join(unknown)}")

    def server(self) -> Server[Any]:
        return Server(
            "reckon-gateway",
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self.tools.values()))

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        name, arguments = params.name, dict(params.arguments or {})
        if name not in self.tools:
            return _error(f"no tool {name!r} on this server: {', '.join(sorted(self.tools))}")
        tool = Tool(name, send=self._sender(name), lookup=None, approval=name in self.approve)
        call_id = call_id_of(name, arguments, params.meta)
        try:
            output = await anyio.to_thread.run_sync(lambda: self.calls.call(tool, call_id, arguments))
        except ApprovalRequired as waiting:
            said = waiting.payload()
            return _error(f"{waiting} — approve digest {said['digest']} on the console, then call again", said)
        except PersonNeeded as needed:
            return _error(str(needed), needed.payload())
        except ToolCallError as ended:
            return _error(str(ended), {"reckon": type(ended).__name__, "task_id": ended.task_id, "tool": name})
        return types.CallToolResult.model_validate(output)

    def _sender(self, name: str) -> Any:
        def send(op_key: str, arguments: dict[str, Any]) -> Any:
            """The call to the upstream server, on the gateway's event loop; an exception (the server died, the
            connection broke) leaves the call unknown: it is never sent again blindly."""
            result = anyio.from_thread.run(self.upstream.call_tool, name, arguments)
            if not isinstance(result, types.CallToolResult):
                raise TypeError(f"{name} answered {type(result).__name__}, not a tool result")
            if result.is_error:  # the server's refusal: taken as definite, the call's task fails
                return Failed("invalid_params", _text(result)[:500] or f"{name} answered an error")
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        return send


def serve(
    url: str, token: str, upstream: list[str], *, session: str, journal: str | None, approve: frozenset[str], ttl: int
) -> None:
    """Start the upstream server, then serve its tools through Reckon over stdio until the agent disconnects."""

    async def run() -> None:
        params = StdioServerParameters(command=upstream[0], args=upstream[1:])
        with Reckon(url, token) as reckon:
            calls = ToolCalls(reckon, session=session, journal=journal, lease_ttl=ttl)
            async with stdio_client(params) as (up_read, up_write), ClientSession(up_read, up_write) as client:
                await client.initialize()
                gateway = Gateway(calls, client, await _all_tools(client), approve)
                server = gateway.server()
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


async def _all_tools(client: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def call_id_of(tool: str, arguments: Mapping[str, Any], meta: Any) -> str:
    """The call's id: the agent's ``_meta["reckon/call_id"]``, else the digest of the tool and its arguments."""
    given = _meta(meta).get(CALL_ID)
    if isinstance(given, str) and given.strip():
        return given.strip()[:100]
    canonical = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return "args-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _meta(meta: Any) -> dict[str, Any]:
    if meta is None:
        return {}
    if isinstance(meta, Mapping):
        return dict(meta)
    dumped = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else {}
    return dict(dumped) | dict(getattr(meta, "model_extra", None) or {})


def _error(text: str, detail: Mapping[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"reckon": dict(detail)} if detail else None,
        is_error=True,
    )


def _text(result: types.CallToolResult) -> str:
    return " ".join(str(getattr(block, "text", "")) for block in result.content).strip()
