"""The console's last word on a refusal: a service's named refusal (console.errors.REFUSALS) that no view caught —
raised by a service a view calls, or by the access check, or by a read — becomes the refusal page with its sentence
(console.errors.message_for) and its status (console.errors.status_for), never a server error; a database that did
not answer (a lost connection, a deadlock, a statement timeout) is the retry page (503, Retry-After). A refusal wrote
nothing (every service raises before it writes, or inside the transaction it rolls back), so the page says so.

Views still catch the refusals they expect and show them beside the form; this is the net under all of them,
tests/test_console_refusals.py posts to every console action URL to show that nothing gets through it."""

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.views import defaults

from api.errors import DATABASE_RETRY_AFTER, database_unavailable
from console.errors import REFUSALS, message_for, status_for

REFUSED = "console/refused.html"
UNAVAILABLE = "console/unavailable.html"
log = logging.getLogger(__name__)


class RefusalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if request.path.startswith("/api/"):
            return None  # the API's own problem documents
        if isinstance(exception, OperationalError | InterfaceError):  # a lost connection, a deadlock, a timeout
            return database_unavailable_page(request, exception)
        if not isinstance(exception, REFUSALS):
            return None  # not a named refusal (a real fault: a 500, logged), or the API's own problem documents
        status = status_for(exception)
        context = {"code": getattr(exception, "code", "refused"), "message": message_for(exception), "status": status}
        template = f"{REFUSED}#refusal" if request.headers.get("HX-Request") == "true" else REFUSED
        response = render(request, template, context, status=status)
        patch_vary_headers(response, ("HX-Request",))
        return response


def database_unavailable_page(request: HttpRequest, exception: BaseException) -> HttpResponse:
    """The retry page (503, Retry-After) for a database that did not answer: rendered without the request's context
    (no session, no user — each would ask the database again)."""
    log.warning("database unavailable: %s", exception, extra={"path": request.path})
    page = render_to_string(UNAVAILABLE, {"path": request.get_full_path()})
    response = HttpResponse(page, status=503)
    response["Retry-After"] = str(DATABASE_RETRY_AFTER)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: what an exception no view or middleware answered becomes. A database that did not answer —
    raised where no view catches it (a session read in a middleware) — is a 503 to retry, a problem document on the
    API; anything else is a 500, as Django answers it."""
    exception = sys.exception()
    if isinstance(exception, OperationalError | InterfaceError):
        if request.path.startswith("/api/"):
            return database_unavailable(request)
        return database_unavailable_page(request, exception)
    return defaults.server_error(request)
