"""/api/v1/: ninja's URLs, each open to LoginRequiredMiddleware (the token is the credential, not a session) and
exempt from CSRF (no cookie authenticates), behind one guard: a body over the cap is refused before it is read,
and every error ninja or Django would answer in HTML is answered as problem+json."""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, re_path
from django.views.decorators.csrf import csrf_exempt

from api.api import api
from api.errors import CONTENT_TYPE, problem
from tasks.core.parsing import MAX_BIGINT, UnreadableInput, holds, id_past_columns, strict_json

# The largest request body the API reads (bytes): far above any plan or receipt, far below what hurts a worker.
MAX_BODY = min(256 * 1024, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 256 * 1024)

View = Callable[..., HttpResponse]


def guarded(view: View) -> View:
    @wraps(view)
    def guard(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        too_large = _declared_length(request) > MAX_BODY
        if too_large:
            return problem(request, code="payload_too_large", detail=f"A request body holds at most {MAX_BODY} bytes.")
        if (segment := id_past_columns(request.path)) is not None:
            return problem(
                request,
                code="not_found",
                detail=f"Nothing has the id {segment[:40]}: an id is at most {MAX_BIGINT}.",
            )
        nul = _nul_in(request)
        if nul:
            return problem(
                request,
                code="validation_error",
                detail="Text may not contain the NUL character (U+0000).",
                errors=[{"field": nul, "code": "invalid", "message": "text may not contain NUL"}],
            )
        response = view(request, *args, **kwargs)
        if response.status_code == 405 and response.get("Content-Type", "") != CONTENT_TYPE:
            return problem(
                request,
                code="method_not_allowed",
                detail=f"{request.method} is not allowed here.",
                headers={"Allow": response.get("Allow", "")},
            )
        return response

    return login_not_required(csrf_exempt(guard))


def _nul_in(request: HttpRequest) -> str:
    """Where a NUL character is in the path, the query or the JSON body ("" if nowhere). No column can store one
    (PostgreSQL refuses it in text and jsonb), so it is refused here, once, before any handler reads it."""
    if "\x00" in request.path:
        return "path"
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            return "query"
    body = request.body if request.method in ("POST", "PUT", "PATCH", "DELETE") else b""
    if b"\\u0000" not in body and b"\x00" not in body:  # the fast path: no escape of NUL at all
        return ""
    try:
        document = strict_json(body)
    except UnreadableInput:
        return ""  # not strict JSON: the parser answers malformed_body
    return "body" if holds(document, "\x00") else ""


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return MAX_BODY + 1


@login_not_required
@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    return problem(request, code="not_found", detail="No such API endpoint.")


def _guard_all(patterns: list[URLPattern | URLResolver]) -> list[URLPattern | URLResolver]:
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            pattern.callback = guarded(pattern.callback)
    return patterns


_patterns = api.urls[0]
app_name = "api-v1"
urlpatterns = [*_guard_all(list(_patterns)), re_path(r"^(?P<rest>.*)$", not_found)]
