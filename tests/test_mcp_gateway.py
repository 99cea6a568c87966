"""The MCP gateway (``python -m reckon_client.mcp gateway``): Reckon in front of another MCP server's tools, driven
with the official SDK's client over stdio.

Reckon runs as its own process (gunicorn: tests/test_agent_e2e.py's ``server``), the gateway as its own, and the
gateway starts the upstream server (harness/mcp_payments.py) as its own: a payments server whose ledger file is the
remote's own count of effects. The upstream server cannot be asked what became of a call, as most MCP servers.
"""

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, cast

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types import RequestParamsMeta
from reckon_client.mcp.gateway import CALL_ID

from api.tokens import api_token_issue
from audit.principals import Principal
from tasks.core.lifecycle import OperationStatus, TaskStatus
from tasks.engine.verification import find_problems
from tasks.models import Operation, Task
from tasks.people.approvals import approvals_awaited, node_approve_and_resume
from tasks.people.takeover import takeover_claim
from tests.conftest import person
from tests.simulator_fixture import ROOT
from tests.test_agent_e2e import server  # noqa: F401 - the web process fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)

UPSTREAM = ROOT / "harness" / "mcp_payments.py"
LEASE_TTL = 5  # the API's least: a killed gateway's lease lapses after it and the grace (1 s in ``server``)


@pytest.fixture
def live(server: tuple[str, Path, int]) -> tuple[str, str]:  # noqa: F811 - the imported fixture
    """The server's URL and a token of an agent scoped to tool-call tasks."""
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="gateway", kinds=["tool_call"], projects=[])
    return server[0], token


@pytest.fixture(autouse=True)
def _orm_in_the_agents_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's agent is a coroutine (the SDK's client is async) that reads the database between its calls, in
    this one thread: Django's check against an async context is lifted for it."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@asynccontextmanager
async def gateway(
    live: tuple[str, str], tmp: Path, *, name: str, approve: str = "", hold: Path | None = None
) -> AsyncIterator[ClientSession]:
    """The gateway's process (its pid written to ``tmp/<name>.pid`` before it execs) and a session to it; the upstream
    server's ledger is ``tmp/ledger``, the journal ``tmp/journal.sqlite3``, the session ``s1``."""
    launch = (
        "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
        " os.execv(sys.executable, [sys.executable, '-m', 'reckon_client.mcp', *sys.argv[2:]])"
    )
    args = ["-c", launch, str(tmp / f"{name}.pid"), "gateway", "--url", live[0], "--session", "s1"]
    args += ["--journal", str(tmp / "journal.sqlite3"), "--lease-ttl", str(LEASE_TTL), "--approve", approve]
    args += ["--", sys.executable, str(UPSTREAM), str(tmp / "ledger"), *([str(hold)] if hold else [])]
    env = {**os.environ, "RECKON_TOKEN": live[1]}
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def ledger(tmp: Path) -> list[str]:
    path = tmp / "ledger"
    return path.read_text().splitlines() if path.exists() else []


async def pay(session: ClientSession, call_id: str = "") -> Any:
    meta = cast(RequestParamsMeta, {CALL_ID: call_id}) if call_id else None  # an open map: any key
    return await session.call_tool("pay", {"to": "bob", "amount": 5}, meta=meta)


def text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_each_call_is_registered_before_it_reaches_the_server_and_the_same_call_is_sent_once(
    live: tuple[str, str], tmp_path: Path
):
    async def agent() -> None:
        async with gateway(live, tmp_path, name="g") as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(tools) == {"pay", "refuse"}  # the server's tools, under their names and schemas
            assert set(tools["pay"].input_schema["properties"]) == {"to", "amount"}
            first = await pay(session)
            assert not first.is_error, text(first)
            assert first.structured_content["to"] == "bob"
            assert len(ledger(tmp_path)) == 1
            again = await pay(session)  # the same tool, the same arguments: the same call
            assert again.structured_content == first.structured_content
            assert len(ledger(tmp_path)) == 1
            other = await pay(session, call_id="the-second-payment")  # named as another call
            assert not other.is_error and other.structured_content["id"] != first.structured_content["id"]
            assert len(ledger(tmp_path)) == 2
            refused = await session.call_tool("refuse", {"to": "carol"})
            assert refused.is_error and "failed" in text(refused), text(refused)
            missing = await session.call_tool("transfer", {})
            assert missing.is_error and "no tool 'transfer'" in text(missing)

    asyncio.run(agent())
    paid = Task.objects.filter(kind="tool_call", project="s1", title__startswith="pay ")
    assert [task.status for task in paid] == [TaskStatus.COMPLETED] * 2
    for task in paid:
        [op] = Operation.objects.filter(task=task)
        assert op.status == OperationStatus.COMMITTED and op.dispatch_count == 1
        assert find_problems(task) == []
    assert Task.objects.get(kind="tool_call", title__startswith="refuse ").status == TaskStatus.FAILED


def test_an_approved_tool_waits_for_a_person_and_then_pays_once(live: tuple[str, str], tmp_path: Path):
    ann = person("ann", "admin")

    async def asked() -> dict[str, Any]:
        async with gateway(live, tmp_path, name="g", approve="pay") as session:
            waiting = await pay(session)
            assert waiting.is_error and "waits for approval" in text(waiting), text(waiting)
            again = await pay(session)  # asking again does not pay
            assert again.is_error
            return dict(waiting.structured_content["reckon"])

    async def after_the_approval() -> Any:
        async with gateway(live, tmp_path, name="g2", approve="pay") as session:
            return await pay(session)

    said = asyncio.run(asked())
    assert ledger(tmp_path) == []
    approve(ann, int(said["task_id"]), str(said["digest"]))
    paid = asyncio.run(after_the_approval())
    assert not paid.is_error, text(paid)
    assert len(ledger(tmp_path)) == 1


def approve(ann: Principal, task_id: int, digest: str) -> None:
    """``ann`` takes the task over on the console, approves the digest the agent was shown and hands it back."""
    assert takeover_claim(actor=ann, task_id=task_id).granted
    task = Task.objects.get(pk=task_id)
    [awaited] = approvals_awaited(task)
    assert awaited.proposal.digest == digest
    node_approve_and_resume(
        actor=ann, task_id=task_id, node_key="approve", expected_version=task.version, approving=digest
    )


def test_a_gateway_killed_mid_call_leaves_it_to_a_person_and_never_sends_it_again(
    live: tuple[str, str], tmp_path: Path
):
    """SIGKILL while the server has made the payment and not answered: the next gateway (same session and journal)
    cannot ask the server what became of it, so the call is left to a person — and the payment is never sent again."""
    hold = tmp_path / "release"

    async def first_life() -> None:
        with suppress(Exception):  # the session breaks when its gateway dies under it
            async with gateway(live, tmp_path, name="first", hold=hold) as session:
                calling = asyncio.ensure_future(pay(session))
                deadline = time.monotonic() + 20
                while not ledger(tmp_path):
                    assert time.monotonic() < deadline, "the payment was not made"
                    await asyncio.sleep(0.05)
                os.kill(int((tmp_path / "first.pid").read_text()), signal.SIGKILL)
                await calling

    async def second_life() -> Any:
        async with gateway(live, tmp_path, name="second") as session:
            return await pay(session)

    try:
        asyncio.run(first_life())
        [task] = Task.objects.filter(kind="tool_call")
        assert Operation.objects.get(task=task).status == OperationStatus.DISPATCHED  # sent, its answer never heard
        answered = asyncio.run(second_life())
    finally:
        hold.touch()  # the first upstream server, orphaned, finishes its wait
    assert answered.is_error and "a person settles" in text(answered), text(answered)
    assert answered.structured_content["reckon"]["reckon"] == "ToolCallUnprovable"
    assert len(ledger(tmp_path)) == 1  # the remote's count: never sent again
    task.refresh_from_db()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "unprovable")
