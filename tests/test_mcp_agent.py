"""The agent protocol as MCP tools (reckon_client.mcp), driven with the official SDK's client over stdio.

Reckon runs as its own process (gunicorn, tests/test_agent_e2e.py's ``server``), the MCP server as its own process
(``python -m reckon_client.mcp agent``), the object store as its own (harness/simulator.py). The test plays the agent:
it reads each instruction and does it against the store with the examples' connector — so "each effect once" is the
store's own count, and a SIGKILL of the MCP server between the store's commit and the report is a real one.
"""

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from reckon_client import Committed, Outcome
from reckon_client.outcomes import outcome_json

from api.tokens import api_token_issue
from examples.migrate_agent import KIND, ObjectStore, create
from tasks.core.lifecycle import TaskStatus
from tasks.engine.verification import find_problems
from tasks.models import Operation, Task
from tests.conftest import person
from tests.simulator_fixture import ROOT, Simulator
from tests.test_agent_e2e import Live, server  # noqa: F401 - the web process fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def live(server: tuple[str, Path, int]) -> Live:  # noqa: F811 - the fixture of that name
    """The server, and a token for the agent ``migrator`` scoped to the reference agent's kind."""
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="migrator", kinds=[KIND], projects=[])
    return Live(server[0], token, server[1], server[2])


@pytest.fixture(autouse=True)
def _orm_in_the_agents_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's agent is a coroutine (the SDK's client is async) that reads the database between its calls, in
    this one thread: Django's check against an async context is lifted for it."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


LEASE_TTL = 5  # the API's least: a killed MCP server's lease lapses after it and the grace (1 s in ``server``)
OBJECTS = 40  # with a batch of 20: prepare, two copies, verify, switch — five effects
TOOLS = {
    "reckon_create_task",
    "reckon_get_task",
    "reckon_next",
    "reckon_report",
    "reckon_report_version",
    "reckon_release",
    "reckon_cancel",
}


@asynccontextmanager
async def mcp_agent(live: Live, pid_file: Path) -> AsyncIterator[ClientSession]:
    """The MCP server's process (its pid written to ``pid_file`` before it execs the server) and a session to it."""
    launch = (
        "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
        " os.execv(sys.executable, [sys.executable, '-m', 'reckon_client.mcp', *sys.argv[2:]])"
    )
    args = ["-c", launch, str(pid_file), "agent", "--url", live.url, "--lease-ttl", str(LEASE_TTL)]
    args += ["--lease-wait", "20"]
    env = {**os.environ, "RECKON_TOKEN": live.token}
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}({arguments}): {result.content}"
    answer = result.structured_content
    assert isinstance(answer, dict), result
    return answer


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) was not refused: {result.structured_content}"
    return " ".join(getattr(block, "text", "") for block in result.content)


def report_args(task_id: int, op_key: str, outcome: Outcome) -> dict[str, Any]:
    return {"task_id": task_id, "op_key": op_key, **outcome_json(outcome)}


async def do(session: ClientSession, store: ObjectStore, told: dict[str, Any]) -> dict[str, Any]:
    """What an agent does with one instruction: the store's call it names, then the report."""
    task_id, op_key = told["task_id"], told.get("op_key", "")
    match told["do"]:
        case "submit":
            outcome = store.submit(op_key, told["request"])
        case "lookup":
            outcome = store.lookup(op_key)
        case "fence":
            outcome = store.fence(op_key)
        case "delete":
            outcome = store.delete(op_key, told["locator"])
        case other:
            raise AssertionError(f"an instruction this agent does not expect: {other} {told}")
    return await call(session, "reckon_report", **report_args(task_id, op_key, outcome))


def new_task(live: Live, store: Simulator) -> int:
    from reckon_client import Reckon

    with Reckon(live.url, live.token) as reckon:
        return create(reckon, ObjectStore(store.url), "acme", OBJECTS, batch=20).id


def assert_done_once(task_id: int, store: Simulator) -> None:
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.COMPLETED, (task.status, task.status_reason)
    ops = Operation.objects.filter(task=task, purpose="effect")
    assert ops.count() == 5
    assert {store.stats()["by_op_key"][op.op_key] for op in ops} == {1}  # the store's count: each effect once
    assert find_problems(task) == []


def test_an_mcp_agent_drives_a_task_to_done_with_each_effect_once(live: Live, store: Simulator, tmp_path: Path):
    async def agent() -> None:
        connector = ObjectStore(store.url)
        async with mcp_agent(live, tmp_path / "pid") as session:
            assert {tool.name for tool in (await session.list_tools()).tools} >= TOOLS
            task = await call(session, "reckon_get_task", task_id=task_id)
            assert task["status"] == "pending"
            told = await call(session, "reckon_next", task_id=task_id)
            assert told["do"] == "submit" and told["op_key"] and told["request"]["action"] == "store.prepare_target"
            assert await call(session, "reckon_next", task_id=task_id) == told  # asking again repeats it
            # Reckon registered the operation before the agent ever saw its key, and nothing reached the store yet.
            assert Operation.objects.filter(op_key=told["op_key"]).exists()
            assert store.stats()["side_effects"] == 0
            while told["do"] in ("submit", "lookup", "fence", "delete"):
                told = await do(session, connector, told)
            assert told["do"] == "done", told
            assert (await call(session, "reckon_release", task_id=task_id))["released"] is False  # already given back

    task_id = new_task(live, store)
    asyncio.run(agent())
    assert_done_once(task_id, store)


def test_a_report_that_answers_nothing_pending_is_refused_and_changes_nothing(
    live: Live, store: Simulator, tmp_path: Path
):
    async def agent() -> None:
        async with mcp_agent(live, tmp_path / "pid") as session:
            early = await refused(session, "reckon_report", task_id=task_id, op_key="rk-x", result="not_found")
            assert "ask reckon_next first" in early
            told = await call(session, "reckon_next", task_id=task_id)
            version = Task.objects.get(pk=task_id).version
            wrong_key = await refused(session, "reckon_report", **report_args(task_id, "rk-another", Committed("r-1")))
            assert f"a report on the submit of {told['op_key']}" in wrong_key
            no_id = await refused(session, "reckon_report", task_id=task_id, op_key=told["op_key"], result="committed")
            assert "names the remote_id" in no_id
            odd = await refused(session, "reckon_report", task_id=task_id, op_key=told["op_key"], result="done")
            assert "result must be one of" in odd
            fenced = await refused(session, "reckon_report", task_id=task_id, op_key=told["op_key"], result="fenced")
            assert "fenced answers a fence" in fenced
            unknown_class = await refused(
                session, "reckon_report", task_id=task_id, op_key=told["op_key"], result="failed", failure_class="x"
            )
            assert "failure_class must be one of" in unknown_class
            assert Task.objects.get(pk=task_id).version == version  # every refusal wrote nothing
            assert await call(session, "reckon_next", task_id=task_id) == told  # still pending, as it was
            outside = await refused(session, "reckon_next", task_id=10**9)
            assert "404" in outside

    task_id = new_task(live, store)
    asyncio.run(agent())
    assert store.stats()["side_effects"] == 0


def test_the_mcp_server_killed_after_the_store_committed_is_followed_by_a_lookup_never_a_second_submit(
    live: Live, store: Simulator, tmp_path: Path
):
    """SIGKILL between the store's commit and the report: the next MCP server (a new process) waits out the dead
    one's lease, and its first instruction is a lookup of the op key in flight — the copy is counted once."""

    async def first_life() -> str:
        connector = ObjectStore(store.url)
        pid_file = tmp_path / "first.pid"
        with suppress(Exception):  # the session breaks when its server dies under it
            async with mcp_agent(live, pid_file) as session:
                told = await call(session, "reckon_next", task_id=task_id)
                told = await do(session, connector, told)  # prepare-target, reported
                assert told["do"] == "submit" and told["request"]["action"] == "store.copy_batch"
                assert isinstance(connector.submit(told["op_key"], told["request"]), Committed)  # at the store
                os.kill(int(pid_file.read_text()), signal.SIGKILL)  # before the report
                await session.send_ping()
        return str(told["op_key"])

    async def second_life(in_flight: str) -> None:
        connector = ObjectStore(store.url)
        async with mcp_agent(live, tmp_path / "second.pid") as session:
            told = await call(session, "reckon_next", task_id=task_id)
            assert (told["do"], told["op_key"]) == ("lookup", in_flight), told
            while told["do"] in ("submit", "lookup", "fence", "delete"):
                assert told["do"] != "submit" or told["op_key"] != in_flight
                told = await do(session, connector, told)
            assert told["do"] == "done", told

    task_id = new_task(live, store)
    in_flight = asyncio.run(first_life())
    assert store.stats()["by_op_key"][in_flight] == 1
    asyncio.run(second_life(in_flight))
    assert store.stats()["by_op_key"][in_flight] == 1
    assert_done_once(task_id, store)
