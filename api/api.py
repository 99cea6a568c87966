"""The agent API, /api/v1/: the NinjaAPI, its error handlers (everything answers problem+json, api/errors.py) and
its operations. Handlers are thin: the token (api/auth.py), one read or one service, the response."""

from typing import Annotated, Any

from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Router
from ninja.errors import AuthenticationError, HttpError, ValidationError
from pydantic import Field

from api.auth import AgentToken, token_of
from api.errors import problem, problem_of, validation_errors
from api.schemas import Problem, TaskOut, TaskPage, task_out, task_summary
from api.tokens import in_scope, token_tasks
from api.webhooks import router as webhooks_router
from leases.errors import LeaseError
from tasks.errors import TaskError, TaskNotFound
from tasks.queries import Order, page
from tasks.snapshot import task_snapshot

PAGE_DEFAULT, PAGE_MAX = 50, 200

api = NinjaAPI(
    title="Reckon agent API",
    version="1",
    description="Agents read and drive their tasks. Authenticate with `Authorization: Bearer <token>` "
    "(an admin issues tokens on the console's Agent tokens page). Every error is application/problem+json.",
    auth=AgentToken(),
    urls_namespace="api-v1",
    # ninja's docs page loads Swagger UI from a CDN unless "ninja" is an installed app: off until it is.
    docs_url=None,
)

PROBLEMS: dict[int, type[Problem]] = {401: Problem, 404: Problem, 422: Problem}


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, error: AuthenticationError) -> HttpResponse:
    return problem(
        request,
        code="unauthenticated",
        detail="Send a live agent token as 'Authorization: Bearer <token>'.",
        headers={"WWW-Authenticate": 'Bearer realm="reckon"'},
    )


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, error: ValidationError) -> HttpResponse:
    return problem(
        request,
        code="validation_error",
        detail="Some fields are not valid: see errors.",
        errors=validation_errors(error.errors),
    )


@api.exception_handler(TaskError)
def _task_error(request: HttpRequest, error: TaskError) -> HttpResponse:
    return problem_of(request, error)


@api.exception_handler(LeaseError)
def _lease_error(request: HttpRequest, error: LeaseError) -> HttpResponse:
    return problem_of(request, error)


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, error: Http404) -> HttpResponse:
    return problem(request, code="not_found", detail="Nothing here.")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    return problem(request, code="http_error", detail=str(error), status=error.status_code)


tasks = Router(tags=["tasks"])


@tasks.get("/tasks/{task_id}", response={200: TaskOut, **PROBLEMS}, summary="Read a task")
def task_read(request: HttpRequest, task_id: int, response: HttpResponse) -> Any:
    """The task's status, version (also the ETag), plan version, current plan's nodes and unsettled operations.
    A task outside the token's scope is answered as one that does not exist."""
    token = token_of(request)
    snap = task_snapshot(task_id=task_id)
    if not in_scope(token, snap.task):
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    response["ETag"] = f'"{snap.version}"'
    return task_out(snap)


@tasks.get("/tasks", response={200: TaskPage, **PROBLEMS}, summary="List the tasks in the token's scope")
def task_list(
    request: HttpRequest,
    after: Annotated[str | None, Field(description="next_cursor of the previous page")] = None,
    size: Annotated[int, Field(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT,
) -> Any:
    """The tasks in the token's scope, newest first, a page at a time (keyset: a task created while paging sorts
    before every cursor handed out, so nothing repeats or is skipped)."""
    rows, next_cursor = page(token_tasks(token_of(request)), after=after, size=size, order=Order.NEWEST_FIRST)
    return TaskPage(items=[task_summary(t) for t in rows], next_cursor=next_cursor)


api.add_router("/", tasks)
api.add_router("/", webhooks_router)
