"""The API's response bodies (pydantic, through ninja): the OpenAPI document is generated from these."""

from datetime import datetime

from ninja import Schema

from tasks.models import Node, Operation, Task
from tasks.snapshot import Snapshot


class NodeOut(Schema):
    key: str
    action: str
    position: int
    status: str
    attempts: int
    max_attempts: int


class OperationOut(Schema):
    op_key: str
    node: str
    action: str
    status: str


class TaskSummary(Schema):
    id: int
    kind: str
    project: str
    title: str
    status: str
    status_reason: str
    version: int
    plan_version: int
    cancel_requested: bool
    updated_at: datetime


class TaskOut(TaskSummary):
    nodes: list[NodeOut]
    # Unsettled operations (intent, dispatched, accepted, unknown), oldest first.
    open_operations: list[OperationOut]


class TaskPage(Schema):
    items: list[TaskSummary]
    # Pass as ``after`` for the next page; null on the last page.
    next_cursor: str | None


class Problem(Schema):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, str]] | None = None


def task_summary(task: Task) -> TaskSummary:
    return TaskSummary(
        id=task.pk,
        kind=task.kind,
        project=task.project,
        title=task.title,
        status=task.status,
        status_reason=task.status_reason,
        version=task.version,
        plan_version=task.plan_version,
        cancel_requested=task.cancel_requested_at is not None,
        updated_at=task.updated_at,
    )


def task_out(snap: Snapshot) -> TaskOut:
    keys = {n.pk: n.key for n in snap.nodes}
    return TaskOut(
        **task_summary(snap.task).model_dump(),
        nodes=[_node(n) for n in snap.nodes],
        open_operations=[_operation(op, keys) for op in snap.unsettled],
    )


def _node(node: Node) -> NodeOut:
    return NodeOut(
        key=node.key,
        action=node.action,
        position=node.position,
        status=node.status,
        attempts=node.attempts,
        max_attempts=node.max_attempts,
    )


def _operation(op: Operation, keys: dict[int, str]) -> OperationOut:
    return OperationOut(op_key=op.op_key, node=keys.get(op.node_id, ""), action=op.action, status=op.status)
