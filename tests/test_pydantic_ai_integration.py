"""A Pydantic AI agent's side-effecting tool as Reckon tool-call tasks
(client/reckon_client/integrations/pydantic_ai.py, examples/pydantic_ai_agent.py), against Reckon's live web process.

The remote is the LangGraph example's payments service, in this process: it counts every payment and email, so
"once" is the remote's own count. Only the killed agent is its own process; the approval is a person's, through the
console's services (takeover, approve and hand back), as on the task page.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ToolReturnPart
from reckon_client import Reckon
from reckon_client.integrations.pydantic_ai import deferred_results, reckon_tool
from reckon_client.tools import ToolCalls, ToolCallUnprovable

from audit.principals import Principal
from examples.langgraph_agent import Payments
from examples.pydantic_ai_agent import scripted_model, tools_of
from tasks.core.lifecycle import OperationStatus, TaskStatus
from tasks.models import Operation, Task
from tests import test_langgraph_integration as langgraph
from tests.simulator_fixture import ROOT
from tests.test_agent_e2e import server  # noqa: F401 - the web process fixture, shared
from tests.test_langgraph_integration import LEASE_TTL, approve, killed_once_it_took_effect, only_task, summary

AGENT = ROOT / "examples" / "pydantic_ai_agent.py"

pytestmark = langgraph.pytestmark
live, ann, payments = langgraph.live, langgraph.ann, langgraph.payments  # its fixtures, shared


def agent(live: tuple[str, str], remote: str, state: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(AGENT), "--url", live[0], "--token", live[1], "--remote", remote]
    command += ["--session", "pa1", "--state", str(state), "--lease-ttl", str(LEASE_TTL), *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603


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

    done = summary(agent(live, remote, tmp_path))  # the same session, the same message history

    assert done["status"] == "done", done
    assert service.stats()["requests"] == 1 and len(service.stats()["performed"]) == 1  # looked up, not paid again
    assert done["tool_output"][0]["id"] == paid["id"]  # the output the lookup found
    op.refresh_from_db()
    task.refresh_from_db()
    assert done["tool_call_ids"] == [op.request["input"]["call_id"]]  # the model's call id, re-issued
    assert task.status == TaskStatus.COMPLETED
    assert (op.status, op.dispatch_count) == (OperationStatus.COMMITTED, 1)
    assert Operation.objects.filter(task=task).count() == 1


def test_a_call_needing_approval_is_deferred_and_pays_once_only_after_reckon_binds_it(
    live: tuple[str, str], payments: tuple[str, Payments], ann: Principal, tmp_path: Path
) -> None:
    remote, service = payments
    arguments = {"to": "bob", "amount": 5}
    with Reckon(*live) as reckon:
        calls = ToolCalls(reckon, session="pa2", journal=tmp_path / "j.sqlite3", lease_ttl=LEASE_TTL)
        tool = tools_of(calls, remote)["pay_approved"]
        payer = Agent(scripted_model(tool.name, arguments), tools=[tool], output_type=[str, DeferredToolRequests])

        first = payer.run_sync("pay bob 5")
        requests = first.output
        assert isinstance(requests, DeferredToolRequests) and not requests.calls
        [part] = requests.approvals
        asked = requests.metadata[part.tool_call_id]
        assert (asked["reckon"], asked["code"]) == ("ApprovalRequired", "approval_missing")
        assert (asked["arguments"], asked["call_id"]) == (arguments, part.tool_call_id)

        approved_here = DeferredToolResults(approvals={part.tool_call_id: True})  # Pydantic AI's approval alone
        again = payer.run_sync(message_history=first.all_messages(), deferred_tool_results=approved_here)
        assert isinstance(again.output, DeferredToolRequests)
        assert [p.tool_call_id for p in again.output.approvals] == [part.tool_call_id]  # deferred again
        assert service.stats()["requests"] == 0

        approve(ann, asked["task_id"], asked["digest"])  # the digest the deferred call showed
        resumed = deferred_results(again.output, [tool])
        final = payer.run_sync(message_history=again.all_messages(), deferred_tool_results=resumed)

    assert final.output == "Done."
    [paid] = service.stats()["performed"]
    assert (paid["to"], paid["amount"]) == ("bob", 5)
    [returned] = [p for m in final.new_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert json.loads(returned.model_response_str())["id"] == paid["id"]
    assert Task.objects.get(pk=asked["task_id"]).status == TaskStatus.COMPLETED


def test_a_call_whose_outcome_cannot_be_proven_is_deferred_to_a_person_and_never_sent_again(
    live: tuple[str, str], payments: tuple[str, Payments]
) -> None:
    remote, service = payments

    def email(to: str, *, op_key: str) -> Any:
        """Email ``to``."""
        httpx.post(f"{remote}/emails", json={"to": to}).raise_for_status()
        raise httpx.ReadTimeout("the answer was lost")  # it happened; the caller cannot know

    with Reckon(*live) as reckon:
        tool = reckon_tool(ToolCalls(reckon, session="pa3", lease_ttl=LEASE_TTL))(email)
        mailer = Agent(scripted_model("email", {"to": "bob"}), tools=[tool], output_type=[str, DeferredToolRequests])
        first = mailer.run_sync("email bob")
        requests = first.output
        assert isinstance(requests, DeferredToolRequests) and not requests.approvals
        [part] = requests.calls
        assert requests.metadata[part.tool_call_id]["reckon"] == "ToolCallUnprovable"
        with pytest.raises(ToolCallUnprovable):  # no person has settled it: nothing to resume with
            deferred_results(requests, [tool])

    assert service.stats()["requests"] == 1  # one email, ever
    task = only_task()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "unprovable")
    [op] = Operation.objects.filter(task=task)
    assert (op.status, op.dispatch_count) == (OperationStatus.UNKNOWN, 1)
