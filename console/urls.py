"""The console's pages, one module per screen group under console/views/ (each holds its urlpatterns)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("console.views.auth")),
    path("", include("console.views.queue")),
    path("admin/", admin.site.urls),
]
