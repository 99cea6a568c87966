"""The console's reconcile pages (issue 9): built by the session's reconcile work."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
