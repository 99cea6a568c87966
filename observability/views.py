"""``GET /metrics``: the Prometheus scrape, behind a bearer token of its own.

Access is checked here, not by the console's login (the view is ``login_not_required``): a scraper has no session.
The token comes from ``RECKON_METRICS_TOKEN``; unset, metrics are off and the endpoint answers 404 to everyone; set,
a request without that exact bearer token gets 401. Loopback-only access was
considered and refused: behind a reverse proxy on the same host every request comes from 127.0.0.1, so "loopback"
would mean "the whole internet". The comparison is constant-time; a refusal reads nothing from the database.
"""

import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from observability.metrics import DatabaseCollector, exposition

_COLLECTOR = DatabaseCollector()


def _allowed(request: HttpRequest) -> bool:
    expected: str = getattr(settings, "RECKON_METRICS_TOKEN", "")
    if not expected:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


@login_not_required
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse(
            "metrics need Authorization: Bearer <RECKON_METRICS_TOKEN> (unset: metrics are off)\n",
            status=401 if getattr(settings, "RECKON_METRICS_TOKEN", "") else 404,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    _COLLECTOR.max_age = float(getattr(settings, "RECKON_METRICS_CACHE_SECONDS", 0.0))
    response = HttpResponse(exposition(_COLLECTOR), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
