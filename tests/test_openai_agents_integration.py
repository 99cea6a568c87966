"""An OpenAI Agents SDK agent's side-effecting tool as Reckon tool-call tasks
(client/reckon_client/integrations/openai_agents.py, examples/openai_agents_agent.py), against Reckon's live web
process.

The killed agent is its own process; the approval's runs are in this one (each a fresh run of the example, its state
in its directory, as a process started again would be). The remote is the LangGraph example's payments service, in
this process: it counts every payment, so "once" is the remote's own count. The approval is a person's, through the
console's services (takeover, approve and hand back), as on the task page.
"""

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents import set_tracing_disabled

from audit.principals import Principal
from examples import openai_agents_agent as example
from examples.langgraph_agent import Payments
from tasks.core.lifecycle import OperationStatus, TaskStatus
from tasks.models import Operation
from tests import test_langgraph_integration as langgraph
from tests.simulator_fixture import ROOT
from tests.test_agent_e2e import server  # noqa: F401 - the web process fixture, shared
from tests.test_langgraph_integration import LEASE_TTL, approve, killed_once_it_took_effect, only_task, summary

AGENT = ROOT / "examples" / "openai_agents_agent.py"

pytestmark = langgraph.pytestmark
live, ann, payments = langgraph.live, langgraph.ann, langgraph.payments  # its fixtures, shared


def agent(live: tuple[str, str], remote: str, state: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(AGENT), "--url", live[0], "--token", live[1], "--remote", remote]
    command += ["--session", "oa1", "--state", str(state), "--lease-ttl", str(LEASE_TTL), *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603


def run_here(live: tuple[str, str], remote: str, state: Path, *extra: str) -> dict[str, Any]:
    """One run of the example in this process, as ``agent`` would start it."""
    argv = ["--url", live[0], "--token", live[1], "--remote", remote, "--session", "oa1", "--state", str(state)]
    set_tracing_disabled(True)
    return dict(asyncio.run(example.run(example.arguments([*argv, "--lease-ttl", str(LEASE_TTL), *extra]))))


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

    done = summary(agent(live, remote, tmp_path))  # the same session, the same model turn

    assert done["status"] == "done", done
    assert service.stats()["requests"] == 1 and len(service.stats()["performed"]) == 1  # looked up, not paid again
    assert done["tool_output"][0]["id"] == paid["id"]  # the output the lookup found
    op.refresh_from_db()
    task.refresh_from_db()
    assert done["tool_call_ids"] == [op.request["input"]["call_id"]]  # the SDK's call id, re-issued
    assert task.status == TaskStatus.COMPLETED
    assert (op.status, op.dispatch_count) == (OperationStatus.COMMITTED, 1)
    assert Operation.objects.filter(task=task).count() == 1


def test_a_call_needing_approval_interrupts_the_run_and_pays_once_only_after_reckon_binds_it(
    live: tuple[str, str], payments: tuple[str, Payments], ann: Principal, tmp_path: Path
) -> None:
    remote, service = payments
    asked = run_here(live, remote, tmp_path, "--tool", "pay_approved")
    assert asked["status"] == "interrupted", asked
    [needed] = asked["interrupts"]
    assert (needed["reckon"], needed["code"]) == ("ApprovalRequired", "approval_missing")
    assert needed["arguments"] == {"to": "bob", "amount": 5}

    refused = run_here(live, remote, tmp_path, "--tool", "pay_approved", "--approve")  # the SDK's approve
    assert (refused["status"], refused["task_id"]) == ("ApprovalRequired", needed["task_id"]), refused
    assert service.stats()["requests"] == 0  # it alone grants nothing

    approve(ann, needed["task_id"], needed["digest"])  # the digest the interruption showed
    done = run_here(live, remote, tmp_path, "--tool", "pay_approved", "--approve")

    assert done["status"] == "done", done
    [paid] = service.stats()["performed"]
    assert (paid["to"], paid["amount"]) == ("bob", 5)
    assert done["tool_output"][0]["id"] == paid["id"]
    assert done["tool_call_ids"] == [needed["call_id"]]
    assert only_task().status == TaskStatus.COMPLETED
