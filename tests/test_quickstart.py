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
