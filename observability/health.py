"""Health and readiness for load balancers and orchestrators. Open without a login (they carry no credential) and
saying nothing a visitor could use: a status word per check, never a URL, a host or an error's text.

- ``/healthz``: the process answers (liveness). No database, no broker: a database outage must not get every web
  process restarted.
- ``/readyz``: this process can serve (readiness): the database answers a query and the broker accepts a
  connection, each within a short timeout; 503 naming the check that failed otherwise."""

import logging

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from kombu import Connection

log = logging.getLogger(__name__)
BROKER_TIMEOUT_SECONDS = 2.0


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@login_not_required
@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _database(), "broker": _broker()}
    ready = all(state == "ok" for state in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:  # any failure means not ready; the log says which (never the answer)
        log.warning("readiness: the database does not answer", exc_info=True)
        return "failing"
    return "ok"


def _broker() -> str:
    try:
        with Connection(
            settings.CELERY_BROKER_URL,
            transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
            connect_timeout=BROKER_TIMEOUT_SECONDS,
        ) as broker:
            broker.ensure_connection(max_retries=1, timeout=int(BROKER_TIMEOUT_SECONDS))
    except Exception:  # as above
        log.warning("readiness: the broker does not accept a connection", exc_info=True)
        return "failing"
    return "ok"
