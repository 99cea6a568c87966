"""The in-process agent loop of docs/operations.md ("In process: the services"), run as written against the demo plan
and a connector stand-in."""

from typing import Any

import pytest
from django.test import Client

from leases.services import lease_acquire
from reference.demo import migration_plan
from tasks.core.lifecycle import NodeStatus, TaskStatus
from tasks.core.outcomes import Committed, Outcome
from tasks.engine.plans import task_create
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Node, Task


class StoreStandIn:
    """Answers like the object store would for the demo plan: a receipt that proves each node's effect."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        self.submitted.append(op_key)
        source = request["input"].get("source", {})
        action = request["action"]
        count = {"store.copy_batch": request["input"].get("limit"), "store.verify_digests": 150}.get(action)
        return Committed(
            remote_id=f"remote-{len(self.submitted)}",
            remote_version=source.get("version", "") if action == "store.switch_reference" else "",
            count=count,
            digest=source.get("digest", "") if action == "store.verify_digests" else "",
        )


def test_the_in_process_agent_loop_runs_the_demo_plan_up_to_its_confirmation_point(db: None) -> None:
    connector = StoreStandIn()
    task = task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:migrator")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-7")
    while True:
        d = next_directive(task_id=task.pk, lease=lease)
        if d.kind == "execute":  # commit 1: the operation, registered as sent before the call
            op = operation_start(
                snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), d.node_key, lease=lease
            ).operation
            outcome = connector.submit(op.op_key, op.request)
            record_outcome(
                snapshot_at(task_id=op.task_id, lease=lease, expected_version=d.task_version + 1),
                op.op_key,
                outcome,
                lease=lease,
            )
        else:
            break
    assert (d.kind, d.reason, d.node_key) == ("stop", "awaiting_approval", "approve-cleanup")
    statuses = dict(Node.objects.filter(task=task).values_list("key", "status"))
    assert statuses.pop("approve-cleanup") == statuses.pop("delete-temp-copies") == NodeStatus.PENDING
    assert set(statuses.values()) == {NodeStatus.SUCCEEDED}
    assert len(connector.submitted) == len(set(connector.submitted)) == 6
    copy = Node.objects.get(task=task, key="copy-batch-1")
    assert copy.operations.get().request["input"]["target"] == "remote-1", "resolved from prepare-target's receipt"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_the_app_serves_its_pages(db: None, client: Client, path: str) -> None:
    assert client.get(path).status_code == 200


def test_a_logged_out_visitor_is_sent_to_the_login_page(db: None, client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/")


def test_the_demo_token_drives_the_reference_kinds_and_the_framework_tool_calls_and_nothing_else(
    db: None, client: Client
) -> None:
    """The README's demo token: the object-store agent's kind, its PostgreSQL kind and the framework examples' tool
    calls may be created with it; any other kind is refused (and nothing is made)."""
    from reference.demo_agent import demo_agent_token
    from tests.conftest import person

    token = demo_agent_token(person("root", "admin"))
    bearer = {"Authorization": f"Bearer {token}"}
    call = {
        "nodes": [
            {
                "key": "call",
                "action": "tool.call",
                "evidence": {"remote_id": True},
                "input": {"tool": "pay", "call_id": "c1", "arguments": {"kwargs": {"to": "bob"}}},
            }
        ]
    }
    copy = {
        "nodes": [
            {
                "key": "copy-1",
                "action": "pg.copy_batch",
                "evidence": {"remote_id": True},
                "input": {"source": "items", "target": "items", "key": "id", "range": [1, 10]},
            }
        ]
    }
    for kind, plan in (("tool_call", call), ("migrate_table_api", copy)):
        made = client.post(
            "/api/v1/tasks", {"kind": kind, "title": kind, "plan": plan}, "application/json", headers=bearer
        )
        assert made.status_code == 201, made.content[:500]
    other = client.post(
        "/api/v1/tasks", {"kind": "other", "title": "x", "plan": call}, "application/json", headers=bearer
    )
    assert other.status_code in (403, 404), other.content[:300]
    assert set(Task.objects.values_list("kind", flat=True)) == {"tool_call", "migrate_table_api"}
