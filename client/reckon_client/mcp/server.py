"""The MCP server of ``python -m reckon_client.mcp agent``: the agent protocol's tools (reckon_client.mcp.agent) on
the official SDK's ``MCPServer``, over stdio. Every tool answers a JSON object; a refusal (a report that answers
nothing pending, a task outside the token's scope, …) is the tool's error (``ToolError``: the agent reads why, the
server logs no crash) and changes nothing. Anything else is a crash: its text stays in the server's log."""

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from reckon_client.errors import ApiError
from reckon_client.mcp.agent import AgentRuns, ReportRefused, outcome_of
from reckon_client.sync import Reckon

INSTRUCTIONS = """Reckon keeps what is true about a long task that changes real systems. Create a task with a plan
(reckon_create_task; the same idempotency_key gives back the same task), then loop: reckon_next(task_id) tells you
what to do — submit a request ONCE with the op key Reckon registered for it, look up or fence an op key (never send
it again), delete a temp object, read a source's version — and reckon_report(…) tells Reckon what your system
answered, which gives you the next instruction. Stop when it says done, stopped (read the reason) or wait (call
reckon_next again at `until`). If you lose track, call reckon_next: it repeats the pending instruction."""


def build_server(reckon: Reckon, runs: AgentRuns) -> MCPServer:
    server = MCPServer("reckon", instructions=INSTRUCTIONS)

    @server.tool()
    def reckon_create_task(
        kind: str, title: str, plan: dict[str, Any], project: str = "", idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Register a task of `kind` with its plan ({nodes: [{key, action, input, evidence, depends_on?}, …]}).
        The same idempotency_key (with the same request) answers the task made the first time."""
        task = _api(lambda: reckon.create_task(kind, title, plan, project=project, idempotency_key=idempotency_key))
        return dict(task.raw)

    @server.tool()
    def reckon_get_task(task_id: int) -> dict[str, Any]:
        """The task as Reckon holds it: status, version, nodes, open operations, approvals."""
        return dict(_api(lambda: reckon.get_task(task_id)).raw)

    @server.tool()
    def reckon_next(task_id: int) -> dict[str, Any]:
        """What to do now for the task: {do: submit|compensate|lookup|fence|delete|current_version, op_key, request,
        locator, say} — or how the run ended: {do: done|stopped|wait, reason, until}."""
        return _api(lambda: runs.next(task_id))

    @server.tool()
    def reckon_report(
        task_id: int,
        op_key: str,
        result: str,
        remote_id: str = "",
        remote_version: str = "",
        count: int | None = None,
        digest: str = "",
        failure_class: str = "",
        detail: str = "",
        data: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What your system answered for the pending instruction on op_key. result: committed (remote_id, and
        remote_version, count, digest as the node's evidence asks), accepted (remote_id: still running), failed
        (failure_class: invalid_params, permission_revoked, dependency_unavailable, connection_interrupted — no
        answer came back — or conflict), not_found, fenced, unprovable. Answers the next instruction."""
        return _api(
            lambda: runs.report(
                task_id,
                op_key,
                outcome_of(
                    result,
                    remote_id=remote_id,
                    remote_version=remote_version,
                    count=count,
                    digest=digest,
                    failure_class=failure_class,
                    detail=detail,
                    data=data,
                ),
            )
        )

    @server.tool()
    def reckon_report_version(
        task_id: int, locator: str, version: str = "", unreachable: bool = False
    ) -> dict[str, Any]:
        """The current version of the source at `locator` (the pending current_version instruction), or
        unreachable=true if it could not be read (the run waits and asks again later)."""
        if not unreachable and not version:
            raise ToolError("report the version read, or unreachable=true")
        return _api(lambda: runs.report_version(task_id, locator, None if unreachable else version))

    @server.tool()
    def reckon_release(task_id: int) -> dict[str, Any]:
        """Stop driving the task here and give its lease back (an instruction handed out and not reported is looked
        up by op key by whoever drives it next)."""
        return runs.release(task_id)

    @server.tool()
    def reckon_cancel(task_id: int, reason: str) -> dict[str, Any]:
        """Ask Reckon to cancel the task: no new side effect starts; what is in flight is settled first."""
        return dict(_api(lambda: reckon.cancel(task_id, reason)).raw)

    return server


def _api[T](call: Callable[[], T]) -> T:
    """Run ``call``; a refusal of Reckon's, or a report that names no valid outcome or answers nothing pending,
    becomes the tool's error saying why."""
    try:
        result: T = call()
        return result
    except ApiError as refusal:
        raise ToolError(f"Reckon refused ({refusal.status} {refusal.code}): {refusal.detail}") from refusal
    except ReportRefused as refusal:
        raise ToolError(f"report refused: {refusal}") from refusal
