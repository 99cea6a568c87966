"""A LangGraph agent's side-effecting tool as Reckon tool-call tasks (client/reckon_client/tools.py,
client/reckon_client/integrations/langgraph.py, examples/langgraph_agent.py), against Reckon's live web process.

The remote is the example's payments service, in this process: it counts every payment and email it makes, so
"once" is the remote's own count. Agents are SIGKILLed as their own processes; the approvals are a person's, through
the console's services (takeover, approve and hand back), as on the task page.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone
from langchain_core.messages import ToolMessage
from langgraph.types import Command
from reckon_client import Reckon
from reckon_client.tools import (
    ApprovalRequired,
    Tool,
    ToolCallConflict,
    ToolCalls,
    ToolCallStopped,
    ToolOutputLost,
    ToolReceipt,
    call_plan,
)

from api.tokens import api_token_issue
from audit.principals import Principal
from examples.langgraph_agent import Payments, graph_of, payments_server, tools_of
from retention.models import RetainedObject
from tasks.core.errors import ApprovalRequestChanged
from tasks.core.lifecycle import OperationStatus, TaskStatus
from tasks.models import Operation, Task
from tasks.people.approvals import approvals_awaited, node_approve_and_resume
from tasks.people.takeover import takeover_claim
from tests.conftest import person
from tests.simulator_fixture import ROOT
from tests.test_agent_e2e import server  # noqa: F401 - the web process fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = ROOT / "examples" / "langgraph_agent.py"
LEASE_TTL = 5  # the API's least: a killed agent's lease lapses after it and the server's grace (1 s here)


@pytest.fixture
def live(server: tuple[str, Path, int]) -> tuple[str, str]:  # noqa: F811 - the imported fixture
    """The server's URL and a token of an agent scoped to tool-call tasks."""
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="lg-agent", kinds=["tool_call"], projects=[])
    return server[0], token


@pytest.fixture
def ann() -> Principal:
    """A person who may approve on the console."""
    return person("ann", "admin")


@pytest.fixture
def payments() -> Iterator[tuple[str, Payments]]:
    web, service = payments_server()
    try:
        yield f"http://127.0.0.1:{web.server_address[1]}", service
    finally:
        web.shutdown()


def eventually(check: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def agent(live: tuple[str, str], remote: str, state: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(AGENT), "run", "--url", live[0], "--token", live[1], "--remote", remote]
    command += ["--session", "s1", "--state", str(state), "--lease-ttl", str(LEASE_TTL), *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603


def summary(process: subprocess.Popen[str], seconds: float = 40) -> dict[str, Any]:
    try:
        output, _ = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the agent did not finish in {seconds}s:\n{output}") from None
    assert process.returncode == 0, output
    return dict(json.loads(output.strip().splitlines()[-1]))


def killed_once_it_took_effect(process: subprocess.Popen[str], service: Payments) -> None:
    """SIGKILL the agent once the remote made the effect, while its answer is held back: the outcome is never
    reported, and the graph's checkpoint is the one before the tool node."""
    # The agent's process imports its framework first: on a loaded machine that alone can take tens of seconds.
    eventually(lambda: len(service.stats()["performed"]) == 1 or process.poll() is not None, seconds=90)
    assert process.poll() is None, process.communicate()[0]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(5)


def only_task() -> Task:
    [task] = Task.objects.filter(kind="tool_call")
    return task


def approve(ann: Principal, task_id: int, digest: str | None = None) -> None:
    """``ann`` takes the task over on the console, approves what the page shows (or ``digest``) and hands it back."""
    assert takeover_claim(actor=ann, task_id=task_id).granted
    task = Task.objects.get(pk=task_id)
    [awaited] = approvals_awaited(task)
    node_approve_and_resume(
        actor=ann,
        task_id=task_id,
        node_key="approve",
        expected_version=task.version,
        approving=digest or awaited.proposal.digest,
    )


# --------------------------------------------------------------------------------------------------- kills


def test_an_agent_killed_after_the_payment_and_before_its_outcome_pays_once_when_started_again(
    live: tuple[str, str], payments: tuple[str, Payments], tmp_path: Path
) -> None:
    remote, service = payments
    service.hold = 30  # the payment takes effect; its answer never reaches the first agent
    killed_once_it_took_effect(agent(live, remote, tmp_path), service)

    task = only_task()
    [op] = Operation.objects.filter(task=task)
    assert op.status == OperationStatus.DISPATCHED  # registered before the call; no outcome reported
    [paid] = service.stats()["performed"]
    assert paid["key"] == op.op_key  # the op key was the remote's idempotency key

    done = summary(agent(live, remote, tmp_path))  # the same session, the same checkpoint

    assert done["status"] == "done", done
    assert len(service.stats()["performed"]) == 1, service.stats()  # reconciled by op key, not paid again
    assert service.stats()["requests"] == 1
    assert json.loads(done["tool_output"][0])["id"] == paid["id"]  # the output the lookup found
    # The restarted graph re-issued the very call the first one registered (its checkpoint held the model's turn).
    op.refresh_from_db()
    task.refresh_from_db()
    assert done["tool_call_ids"] == [op.request["input"]["call_id"]]
    assert task.status == TaskStatus.COMPLETED
    assert (op.status, op.dispatch_count) == (OperationStatus.COMMITTED, 1)
    assert Operation.objects.filter(task=task).count() == 1

    again = summary(agent(live, remote, tmp_path))  # a third start: the graph is done, nothing runs
    assert again["tool_output"] == done["tool_output"] and service.stats()["requests"] == 1


def test_a_tool_that_cannot_be_asked_is_left_to_a_person_after_a_kill_and_never_sent_again(
    live: tuple[str, str], payments: tuple[str, Payments], tmp_path: Path
) -> None:
    remote, service = payments
    service.hold = 30
    killed_once_it_took_effect(agent(live, remote, tmp_path, "--tool", "email"), service)

    for _ in range(2):  # started again, twice: each time it stops for a person
        stopped = summary(agent(live, remote, tmp_path, "--tool", "email"))
        assert stopped["status"] == "interrupted", stopped
        [asked] = stopped["interrupts"]
        assert (asked["reckon"], asked["reason"]) == ("ToolCallUnprovable", "unprovable")

    assert service.stats()["requests"] == 1 and len(service.stats()["performed"]) == 1  # one email, ever
    task = only_task()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "unprovable")
    [op] = Operation.objects.filter(task=task)
    assert (op.status, op.dispatch_count) == (OperationStatus.UNKNOWN, 1)


def test_a_call_that_completed_before_the_graph_recorded_it_gets_its_output_without_running_again(
    live: tuple[str, str], payments: tuple[str, Payments], tmp_path: Path
) -> None:
    """The window between the outcome's report and the framework's checkpoint: the call is re-issued to a task that
    has completed. The journal names its sealed output; without a journal the receipt Reckon answers names it; once
    its retention has ended (and the tool has no lookup) the output is lost — never re-made."""
    remote, service = payments
    journal = tmp_path / "journal.sqlite3"
    with Reckon(*live) as reckon:
        spec = Tool("pay", send=lambda op_key, a: pay_raw(remote, op_key, a), lookup=None)
        first = ToolCalls(reckon, session="s2", journal=journal, lease_ttl=LEASE_TTL).call(spec, "c1", {"amount": 5})
        restarted = ToolCalls(reckon, session="s2", journal=journal, lease_ttl=LEASE_TTL)
        assert restarted.call(spec, "c1", {"amount": 5}) == first
        no_journal = ToolCalls(reckon, session="s2", lease_ttl=LEASE_TTL)
        assert no_journal.call(spec, "c1", {"amount": 5}) == first  # read through the receipt
        past = timezone.now() - timedelta(minutes=2)  # the retention ended: as the purge finds it
        RetainedObject.objects.filter(task=only_task()).update(created_at=past, expires_at=past + timedelta(minutes=1))
        with pytest.raises(ToolOutputLost):
            no_journal.call(spec, "c1", {"amount": 5})
        with pytest.raises(ToolCallConflict):  # the same call id with other arguments is not that call
            restarted.call(spec, "c1", {"amount": 500})
    assert service.stats()["requests"] == 1 and first["amount"] == 5


def pay_raw(remote: str, op_key: str, arguments: dict[str, Any]) -> ToolReceipt:
    made = httpx.post(f"{remote}/payments", json={"to": "bob", **arguments}, headers={"Idempotency-Key": op_key})
    return ToolReceipt(made.raise_for_status().json(), remote_id=made.json()["id"])


# --------------------------------------------------------------------------------------------------- approvals


def test_the_graph_pauses_for_an_approval_and_pays_once_approved_and_resumed(
    live: tuple[str, str], payments: tuple[str, Payments], ann: Principal, tmp_path: Path
) -> None:
    remote, service = payments
    config: dict[str, Any] = {"configurable": {"thread_id": "s3"}}
    with Reckon(*live) as reckon:
        calls = ToolCalls(reckon, session="s3", journal=tmp_path / "j.sqlite3", lease_ttl=LEASE_TTL)
        graph = graph_of(tools_of(calls, remote)["pay_approved"], {"to": "bob", "amount": 5}, tmp_path / "cp")

        graph.invoke({"messages": [("user", "pay bob 5")]}, config)
        [asked] = graph.get_state(config).interrupts
        assert (asked.value["reckon"], asked.value["code"]) == ("ApprovalRequired", "approval_missing")
        assert asked.value["arguments"] == {"to": "bob", "amount": 5}

        graph.invoke(Command(resume="approved"), config)  # a resume grants nothing
        [again] = graph.get_state(config).interrupts
        assert again.value["reckon"] == "ApprovalRequired"
        assert service.stats()["performed"] == []

        approve(ann, asked.value["task_id"], asked.value["digest"])  # the digest the interrupt showed
        final = graph.invoke(Command(resume="approved"), config)

    assert not graph.get_state(config).interrupts
    [paid] = service.stats()["performed"]
    assert (paid["to"], paid["amount"]) == ("bob", 5)
    [message] = [m for m in final["messages"] if isinstance(m, ToolMessage)]
    assert json.loads(str(message.content))["id"] == paid["id"]
    task = Task.objects.get(pk=asked.value["task_id"])
    assert task.status == TaskStatus.COMPLETED


def test_an_approval_binds_only_the_arguments_it_was_given_for(
    live: tuple[str, str], payments: tuple[str, Payments], ann: Principal
) -> None:
    remote, service = payments
    spec = Tool("pay", send=lambda op_key, a: pay_raw(remote, op_key, a), approval=True)
    with Reckon(*live) as reckon:
        calls = ToolCalls(reckon, session="s4", lease_ttl=LEASE_TTL)
        with pytest.raises(ApprovalRequired) as small:
            calls.call(spec, "c1", {"amount": 5})
        with pytest.raises(ApprovalRequired) as large:
            calls.call(spec, "c2", {"amount": 500})
        assert small.value.task_id != large.value.task_id

        with pytest.raises(ApprovalRequestChanged):  # the digest of the other call's request is refused
            approve(ann, int(small.value.task_id or 0), large.value.payload()["digest"])
        approve(ann, int(small.value.task_id or 0))
        with pytest.raises(ApprovalRequired):  # one call's approval lets no other call run
            calls.call(spec, "c2", {"amount": 500})
        with pytest.raises(ToolCallConflict):  # nor the approved call id with other arguments
            calls.call(spec, "c1", {"amount": 5000})
        assert service.stats()["performed"] == []

        assert calls.call(spec, "c1", {"amount": 5})["amount"] == 5

        # An approved call whose request is then re-planned to other arguments: the approval does not carry over.
        approve(ann, int(large.value.task_id or 0))
        replan(live, int(large.value.task_id or 0), amount=50_000)
        with pytest.raises(ApprovalRequired) as moved:
            calls.call(spec, "c2", {"amount": 500})
        assert moved.value.payload()["code"] == "approval_plan_moved"
    assert [p["amount"] for p in service.stats()["performed"]] == [5]


def replan(live: tuple[str, str], task_id: int, *, amount: int) -> None:
    """The agent's own token proposes and accepts a plan whose call pays ``amount`` (the approval node unchanged)."""
    http = httpx.Client(base_url=f"{live[0]}/api/v1", headers={"Authorization": f"Bearer {live[1]}"})
    lease = http.post(f"/tasks/{task_id}/lease", json={}).raise_for_status()
    headers = {"Reckon-Lease": str(lease.json()["lease_id"]), "If-Match": f'"{lease.json()["task_version"]}"'}
    tool = Tool("pay", send=lambda op_key, a: None, approval=True)
    proposed = http.post(
        f"/tasks/{task_id}/plans", json={"plan": call_plan(tool, "c2", {"amount": amount})}, headers=headers
    )
    revision = proposed.raise_for_status().json()
    headers["If-Match"] = f'"{revision["task_version"]}"'
    http.post(f"/tasks/{task_id}/plans/{revision['revision']}/accept", headers=headers).raise_for_status()
    http.delete(f"/tasks/{task_id}/lease", headers={"Reckon-Lease": headers["Reckon-Lease"]}).raise_for_status()


def test_a_call_cancelled_by_an_operator_while_it_awaits_approval_never_runs(
    live: tuple[str, str], payments: tuple[str, Payments]
) -> None:
    remote, service = payments
    spec = Tool("pay", send=lambda op_key, a: pay_raw(remote, op_key, a), approval=True)
    with Reckon(*live) as reckon:
        calls = ToolCalls(reckon, session="s5", lease_ttl=LEASE_TTL)
        with pytest.raises(ApprovalRequired) as asked:
            calls.call(spec, "c1", {"amount": 5})
        reckon.cancel(int(asked.value.task_id or 0), "not this one")
        with pytest.raises(ToolCallStopped):
            calls.call(spec, "c1", {"amount": 5})
    assert service.stats()["requests"] == 0
