"""A framework's tool call approved by a person in the console, in real Chromium: a LangGraph graph (examples/
langgraph_agent.py, its fake model) pauses at a payment that needs approval; an operator takes the call's task over,
sees the exact arguments and the digest the graph was shown, approves and hands it back; the graph resumes and the
payments service (its own count) pays once. The graph talks to the live server over HTTP, as an agent does."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from langgraph.types import Command
from playwright.sync_api import Page, expect
from reckon_client import Reckon
from reckon_client.tools import ToolCalls

from api.tokens import api_token_issue
from examples.langgraph_agent import Payments, graph_of, payments_server, tools_of
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import TaskStatus
from tasks.models import Task
from tests.conftest import person

pytestmark = pytest.mark.browser


@pytest.fixture
def payments() -> Iterator[tuple[str, Payments]]:
    web, service = payments_server()
    try:
        yield f"http://127.0.0.1:{web.server_address[1]}", service
    finally:
        web.shutdown()


def test_a_langgraph_payment_waits_for_an_operator_who_approves_it_in_the_console_and_it_pays_once(
    page: Page, live_server: Any, payments: tuple[str, Payments], login: Callable[..., None], tmp_path: Path
) -> None:
    remote, service = payments
    root = person("root", "admin")
    _, token = api_token_issue(actor=root, agent_id="lg-agent", kinds=["tool_call"], projects=[])
    config: dict[str, Any] = {"configurable": {"thread_id": "s-browser"}}
    with Reckon(live_server.url, token) as reckon:
        calls = ToolCalls(reckon, session="s-browser", journal=tmp_path / "journal.sqlite3", lease_ttl=10)
        graph = graph_of(tools_of(calls, remote)["pay_approved"], {"to": "bob", "amount": 5}, tmp_path / "cp")
        graph.invoke({"messages": [("user", "pay bob 5")]}, config)
        [asked] = graph.get_state(config).interrupts
        assert (asked.value["reckon"], asked.value["code"]) == ("ApprovalRequired", "approval_missing")
        task_id, digest = int(asked.value["task_id"]), str(asked.value["digest"])
        assert service.stats()["performed"] == []

        ann = person("ann", "operator")
        permission_grant(actor=root, user=ann.user, task=Task.objects.get(pk=task_id))
        login(page, ann.user)
        page.goto(reverse("takeover", args=[task_id]))
        page.get_by_role("button", name="Take over").click()
        expect(page.get_by_text("You hold this task.")).to_be_visible()
        expect(page.get_by_text(digest).first).to_be_visible()  # what the person approves: what the graph showed
        page.get_by_role("button", name="Approve approve and hand back to the agent").click()
        expect(page.get_by_text("Approved approve and handed the task back")).to_be_visible()
        assert Task.objects.get(pk=task_id).status == TaskStatus.PENDING

        final = graph.invoke(Command(resume="approved"), config)

    assert not graph.get_state(config).interrupts
    [paid] = service.stats()["performed"]  # the service's own count: once
    assert (paid["to"], paid["amount"]) == ("bob", 5)
    outputs = [json.loads(str(m.content)) for m in final["messages"] if type(m).__name__ == "ToolMessage"]
    assert [output["id"] for output in outputs] == [paid["id"]]
    assert Task.objects.get(pk=task_id).status == TaskStatus.COMPLETED
