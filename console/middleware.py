"""The console's last word on a refusal: a service's named refusal (console.errors.REFUSALS) that no view caught —
raised by a service a view calls, or by the access check, or by a read — becomes the refusal page with its sentence
(console.errors.message_for) and its status (console.errors.status_for), never a server error. A refusal wrote nothing
(every service raises before it writes, or inside the transaction it rolls back), so the page says so.

Views still catch the refusals they expect and show them beside the form; this is the net under all of them,
tests/test_console_refusals.py posts to every console action URL to show that nothing gets through it."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from console.errors import REFUSALS, message_for, status_for

REFUSED = "console/refused.html"


class RefusalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, REFUSALS) or request.path.startswith("/api/"):
            return None  # not a named refusal (a real fault: a 500, logged), or the API's own problem documents
        status = status_for(exception)
        context = {"code": getattr(exception, "code", "refused"), "message": message_for(exception), "status": status}
        template = f"{REFUSED}#refusal" if request.headers.get("HX-Request") == "true" else REFUSED
        response = render(request, template, context, status=status)
        patch_vary_headers(response, ("HX-Request",))
        return response
