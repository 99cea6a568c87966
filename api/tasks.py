"""/api/v1/tasks: create, list, read, cancel, and propose or accept a re-plan. Thin: one service, the answer. A task
out of the token's scope is answered as one that does not exist, before any handler runs (api/auth.py)."""

from typing import Annotated, Any

from django.http import HttpRequest, HttpResponse
from ninja import Router
from pydantic import Field

from api.auth import agent_principal, token_of
from api.http import (
    ID_PATTERN,
    IDEMPOTENCY,
    IF_MATCH,
    LEASE,
    LEASE_HEADER,
    VERSION_PATTERN,
    NodeNotFound,
    ReceiptNotFound,
    answer,
    documented,
    expected_version,
    header_parameter,
    held_lease,
    optional_lease,
)
from api.idempotency import idempotent
from api.schemas import (
    CancelIn,
    NodeReceiptOut,
    PlanIn,
    PlanRevisionOut,
    TaskCreateIn,
    TaskOut,
    TaskPage,
    TaskSummary,
    node_receipt_out,
    task_out,
    task_summary,
)
from api.tokens import token_tasks
from tasks.access.permissions import PermissionDenied
from tasks.core.errors import TaskNotFound
from tasks.engine.plans import plan_accept, plan_propose, task_create
from tasks.engine.snapshot import task_snapshot
from tasks.models import PlanRevision
from tasks.people.cancel import task_request_cancel
from tasks.reads.detail import node_receipt, remote_down
from tasks.reads.queries import Order, page

PAGE_DEFAULT, PAGE_MAX = 50, 200

router = Router(tags=["tasks"])

OPTIONAL_LEASE = header_parameter(
    LEASE_HEADER, "The lease held on the task, if any.", required=False, pattern=ID_PATTERN
)
OPTIONAL_IF_MATCH = header_parameter(
    "If-Match", "Refuse (412) if the task moved past this version.", required=False, pattern=VERSION_PATTERN
)


@router.post(
    "/tasks",
    response={201: TaskOut},
    summary="Create a task with its plan",
    openapi_extra=documented(IDEMPOTENCY, refuses=("permission_denied", "plan_invalid", "secret_in_payload")),
)
def task_new(request: HttpRequest, payload: TaskCreateIn) -> HttpResponse:
    """Register a task and its first plan (validated: 422 plan_invalid, naming each problem). The kind or the
    project must be in the token's scope (403 otherwise). Send an Idempotency-Key: a retried create answers the
    first task again instead of making a second."""
    token = token_of(request)
    if payload.kind not in token.kinds and not (payload.project and payload.project in token.projects):
        raise PermissionDenied(
            f"agent {token.agent_id} may create tasks of kinds {token.kinds or '[]'} or projects "
            f"{token.projects or '[]'}, not kind {payload.kind!r} in project {payload.project!r}"
        )

    def run() -> HttpResponse:
        task = task_create(
            kind=payload.kind,
            title=payload.title,
            plan=payload.plan,
            created_by=str(agent_principal(request)),
            project=payload.project,
            attempt_budget=payload.attempt_budget,
        )
        snap = task_snapshot(task_id=task.pk)
        response = answer(task_out(snap), 201, version=snap.version)
        response["Location"] = f"/api/v1/tasks/{task.pk}"
        return response

    return idempotent(request, token.agent_id, run)


@router.get("/tasks/{task_id}", response={200: TaskOut}, summary="Read a task", openapi_extra=documented())
def task_read(request: HttpRequest, task_id: int, response: HttpResponse) -> Any:
    """The task's status, version (also the ETag), plan version, current plan's nodes and unsettled operations,
    and ``remote_down`` while its remote stays unreachable (since when, how many tries, when it is asked next).
    A task outside the token's scope is answered as one that does not exist."""
    snap = task_snapshot(task_id=task_id)
    response["ETag"] = f'"{snap.version}"'
    return task_out(snap, remote_down(snap.task))


@router.get(
    "/tasks/{task_id}/nodes/{node_key}/receipt",
    response={200: NodeReceiptOut},
    summary="Read a node's receipt",
    openapi_extra=documented(refuses=("node_not_found", "receipt_not_found")),
)
def node_receipt_read(request: HttpRequest, task_id: int, node_key: str) -> Any:
    """The last receipt recorded for the effect of the current plan's node ``node_key`` — once the node succeeded,
    the one that advanced it: what the external system said it committed, under which op key, with the receipt's
    data as reported. For an agent that reads back what a step produced (after a crash, before its own record of it
    was written). 404 node_not_found (no such node in the current plan); 404 receipt_not_found (none yet)."""
    found = node_receipt(task_id=task_id, node_key=node_key)
    if found is None:
        raise NodeNotFound(f"task {task_id}'s current plan has no node {node_key[:100]!r}")
    if found.operation is None:
        raise ReceiptNotFound(f"node {node_key!r} of task {task_id} has no receipt yet (it is {found.node.status})")
    return node_receipt_out(found.node, found.operation)


@router.get(
    "/tasks",
    response={200: TaskPage},
    summary="List the tasks in the token's scope",
    openapi_extra=documented(refuses=("invalid_cursor",)),
)
def task_list(
    request: HttpRequest,
    after: Annotated[str | None, Field(description="next_cursor of the previous page")] = None,
    size: Annotated[int, Field(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT,
) -> Any:
    """The tasks in the token's scope, newest first, a page at a time (keyset: a task created while paging sorts
    before every cursor handed out, so nothing repeats or is skipped)."""
    rows, next_cursor = page(token_tasks(token_of(request)), after=after, size=size, order=Order.NEWEST_FIRST)
    return TaskPage(items=[task_summary(t) for t in rows], next_cursor=next_cursor)


@router.post(
    "/tasks/{task_id}/cancel",
    response={200: TaskSummary},
    summary="Request the task's cancel",
    openapi_extra=documented(
        OPTIONAL_LEASE,
        OPTIONAL_IF_MATCH,
        IDEMPOTENCY,
        refuses=("permission_denied", "lease_lost", "lease_expired", "secret_in_payload"),
    ),
)
def task_cancel(request: HttpRequest, task_id: int, payload: CancelIn) -> HttpResponse:
    """Nothing new starts from now on; what is in flight settles and is recorded as it truly ended. An agent may
    cancel a task it created or holds the lease of (403 otherwise). Asking twice changes nothing."""
    token = token_of(request)
    lease = optional_lease(request, token, task_id)
    version = expected_version(request, required=False)

    def run() -> HttpResponse:
        task = task_request_cancel(
            actor=agent_principal(request),
            task_id=task_id,
            reason=payload.reason,
            lease=lease,
            expected_version=version,
        )
        return answer(task_summary(task), version=task.version)

    return idempotent(request, token.agent_id, run)


@router.post(
    "/tasks/{task_id}/plans",
    response={201: PlanRevisionOut},
    summary="Propose a re-plan",
    openapi_extra=documented(
        LEASE, IF_MATCH, IDEMPOTENCY, refuses=("plan_invalid", "lease_lost", "lease_expired", "task_not_runnable")
    ),
)
def plan_new(request: HttpRequest, task_id: int, payload: PlanIn) -> HttpResponse:
    """Store a proposed plan (validated). It changes nothing about what runs until it is accepted."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    version = expected_version(request)

    def run() -> HttpResponse:
        revision = plan_propose(
            task_id=task_id,
            plan=payload.plan,
            proposed_by=str(agent_principal(request)),
            expected_version=version or 0,
            lease=lease,
        )
        body = PlanRevisionOut(revision=revision.number, status=revision.status, task_version=(version or 0) + 1)
        return answer(body, 201, version=(version or 0) + 1)

    return idempotent(request, token.agent_id, run)


@router.post(
    "/tasks/{task_id}/plans/{revision}/accept",
    response={200: TaskSummary},
    summary="Accept a proposed plan",
    openapi_extra=documented(
        LEASE,
        IF_MATCH,
        IDEMPOTENCY,
        refuses=(
            "lease_lost",
            "lease_expired",
            "invalid_transition",
            "task_not_runnable",
            "operations_open",
            "proposal_superseded",
        ),
    ),
)
def plan_take(request: HttpRequest, task_id: int, revision: int) -> HttpResponse:
    """Make a proposed revision the task's plan: only while nobody advances the old one and no operation is open
    (the services' rule; 409 otherwise). Nodes already done are carried over."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    version = expected_version(request)

    def run() -> HttpResponse:
        row = PlanRevision.objects.filter(task_id=task_id, number=revision).values_list("pk", flat=True).first()
        if row is None:
            raise TaskNotFound(f"task {task_id} has no plan revision {revision}", task_id=task_id)
        task = plan_accept(revision_id=row, expected_version=version or 0, lease=lease)
        return answer(task_summary(task), version=task.version)

    return idempotent(request, token.agent_id, run)
