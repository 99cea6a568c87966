"""The console's admin pages (issue 9): built by the session's admin work."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
