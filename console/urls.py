"""The console's pages, one module per screen group under console/views/ (each holds its urlpatterns)."""

from django.contrib import admin
from django.urls import include, path

from observability.health import healthz, readyz
from observability.views import metrics

# An exception nothing answered: a database that did not answer is a 503 to retry, anything else a 500.
handler500 = "console.middleware.server_error"

urlpatterns = [
    path("", include("console.views.auth")),
    path("", include("console.views.queue")),
    path("", include("console.views.detail")),
    path("", include("console.views.takeover")),
    path("", include("console.views.reconcile")),
    path("", include("console.views.admin")),
    path("", include("console.views.bulk")),
    path("", include("console.views.notes")),
    path("", include("console.views.retained")),
    path("", include("console.views.api_tokens")),
    path("api/v1/", include("api.urls")),
    path("admin/", admin.site.urls),
    # Prometheus scrape (observability/): its own bearer token, RECKON_METRICS_TOKEN; off when unset.
    path("metrics", metrics, name="metrics"),
    # Liveness and readiness for a load balancer (observability/health.py): open, and they disclose nothing.
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
]
