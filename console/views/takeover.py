"""The console's takeover pages (issue 9): built by the session's takeover work."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
