"""The agent API, /api/v1/: the NinjaAPI, its error handlers (everything answers problem+json, api/errors.py) and
its operations. Handlers are thin: the token (api/auth.py), one read or one service, the response."""

import logging
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.module_loading import import_string
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger
from ninja.parser import Parser

from api import routers
from api.auth import AgentToken
from api.errors import CONTENT_TYPE, database_unavailable, declared_problems, problem, problem_of, validation_errors
from api.http import REFUSES, ApiError
from api.kinds import router as kinds_router
from api.ratelimit import RateLimited
from api.retained import router as retained_router
from api.schemas import Problem
from api.steps import router as steps_router
from api.tasks import router as tasks_router
from audit.errors import Refused
from leases.errors import LeaseError, LeaseHeld, LeaseRefused, RenewalOutOfOrder
from retention.errors import RetentionExpired
from tasks.core.errors import PlanInvalid, VersionConflict
from tasks.core.parsing import UnreadableInput, strict_json
from tasks.models import Task

log = logging.getLogger(__name__)


class ObjectBody(Parser):
    """Every request body of this API is one strict JSON object (tasks.core.parsing: no NaN or infinity, no lone
    surrogate, nested at most MAX_JSON_DEPTH deep): ``true``, ``[]`` or ``"x"`` is malformed (400), never read as an
    empty request."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        document = strict_json(request.body)  # UnreadableInput is a ValueError: malformed_body (400)
        if not isinstance(document, dict):
            raise UnreadableInput(f"the body is a JSON {type(document).__name__}, not an object")
        return document


class ReckonAPI(NinjaAPI):
    """ninja's API, whose OpenAPI document says what the server sends: every error as application/problem+json."""

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None) -> Any:
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault("Problem", Problem.model_json_schema(ref_template="#/components/schemas/{model}"))
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                _declare_problems(operation)
                for status, answer in (operation.get("responses") or {}).items():
                    content = answer.get("content") if isinstance(answer, dict) else None
                    if str(status)[0] in "45" and content and "application/json" in content:
                        content[CONTENT_TYPE] = content.pop("application/json")
        return schema


def _declare_problems(operation: dict[str, Any]) -> None:
    """The problem statuses ``operation`` can answer, each with the codes it answers it with: what its inputs imply
    and what its route says its services refuse (api.errors.declared_problems). A status the route declares with
    its own schema (410's GoneProblem) keeps it."""
    refuses = operation.pop(REFUSES, [])
    responses = operation.setdefault("responses", {})
    for status, codes in declared_problems(operation, refuses).items():
        answer = responses.get(status) or responses.get(str(status))
        if answer is None:
            answer = responses[status] = {"content": {"application/json": {"schema": PROBLEM_REF}}}
        answer["description"] = "Problem codes: " + ", ".join(f"`{code}`" for code in codes)


PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


api = ReckonAPI(
    title="Reckon agent API",
    version="1",
    description="Agents read and drive their tasks. Authenticate with `Authorization: Bearer <token>` "
    "(an admin issues tokens on the console's Agent tokens page). Every error is application/problem+json.",
    auth=AgentToken(),
    parser=ObjectBody(),
    urls_namespace="api-v1",
    # The docs page: Swagger UI from Reckon's own static files ("ninja" is an installed app), no CDN. The validator
    # badge would send the document to validator.swagger.io: off.
    docs_url="/docs",
    docs=Swagger(settings={"validatorUrl": None}),
)


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


@api.exception_handler(Refused)
def _task_error(request: HttpRequest, error: Refused) -> HttpResponse:
    if isinstance(error, VersionConflict):
        return _version_conflict(request, error)
    if isinstance(error, PlanInvalid) and error.fields:  # which node and which field, as validation errors say it
        errors = [{"field": f"plan.{where}", "code": "input_invalid", "message": what} for where, what in error.fields]
        return problem(request, code=error.code, detail=str(error), errors=errors)
    return problem_of(request, error)


def _version_conflict(request: HttpRequest, error: VersionConflict) -> HttpResponse:
    """412, with the version the task is at now (the body's current_version and the ETag): re-read from there."""
    current = error.details.get("actual")
    task_id = (request.resolver_match.kwargs.get("task_id") if request.resolver_match else None) or None
    if current is None and task_id is not None and str(task_id).isdigit():
        current = Task.objects.filter(pk=int(task_id)).values_list("version", flat=True).first()
    response = problem(request, code="version_conflict", detail=str(error), extra={"current_version": current})
    if current is not None:
        response["ETag"] = f'"{current}"'
    return response


@api.exception_handler(RetentionExpired)
def _retention_expired(request: HttpRequest, error: RetentionExpired) -> HttpResponse:
    """410, naming what to re-create: the object's kind and name. Reckon does not re-create it — the agent holds
    the external facts — and never answers a reference to something that is gone as if it were there."""
    named = {k: error.details.get(k) for k in ("retained", "version", "kind", "name")}
    task_id = request.resolver_match.kwargs.get("task_id") if request.resolver_match else None
    where = f"POST /api/v1/tasks/{task_id}/retained" if task_id is not None else "a retain"
    detail = (
        f"{error}. Re-create its content from external facts (the source it was read from, by its versioned ref) "
        f"and retain it again with {where} (kind {named['kind']!r}, name {named['name']!r}): keep the new "
        "reference in the checkpoint instead of this one."
    )
    return problem(request, code=error.code, detail=detail, extra=named)


@api.exception_handler(LeaseError)
def _lease_error(request: HttpRequest, error: LeaseError) -> HttpResponse:
    person_holds = (isinstance(error, LeaseRefused) and error.status == "human") or (
        isinstance(error, LeaseHeld) and error.holder.startswith("operator:")
    )
    if person_holds:  # 423, not 409: no agent gets the task until the person hands it back
        return problem(request, code="takeover_held", detail=f"{error} (a person holds the task).")
    if isinstance(error, RenewalOutOfOrder):  # the seq the lease is at: the holder resumes from it
        return problem(request, code=error.code, detail=str(error), extra={"renewal_seq": error.actual})
    return problem_of(request, error)


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, error: ApiError) -> HttpResponse:
    return problem_of(request, error)


@api.exception_handler(RateLimited)
def _rate_limited(request: HttpRequest, error: RateLimited) -> HttpResponse:
    return problem(request, code="rate_limited", detail=str(error), headers={"Retry-After": str(error.retry_after)})


@api.exception_handler(OperationalError)
def _database_lost(request: HttpRequest, error: OperationalError) -> HttpResponse:
    log.warning("database unavailable: %s", error, extra={"path": request.path})
    return database_unavailable(request)


@api.exception_handler(InterfaceError)
def _database_closed(request: HttpRequest, error: InterfaceError) -> HttpResponse:
    log.warning("database unavailable: %s", error, extra={"path": request.path})
    return database_unavailable(request)


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, error: Http404) -> HttpResponse:
    return problem(request, code="not_found", detail="Nothing here.")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    if error.status_code == 400:  # ninja's only 400: a body it cannot parse; ours (strict_json) says why
        why = error.__cause__
        said = f"{error}: {why}" if isinstance(why, UnreadableInput) else str(error)
        return problem(request, code="malformed_body", detail=f"{said}: send one JSON object.")
    return problem(request, code="http_error", detail=str(error), status=error.status_code)


api.add_router("/", tasks_router)
api.add_router("/", steps_router)
api.add_router("/", retained_router)
api.add_router("/", kinds_router)
for _prefix, _router in routers.added():  # the other apps' routers (api/routers.py), registered when they were ready
    api.add_router(_prefix, import_string(_router))
