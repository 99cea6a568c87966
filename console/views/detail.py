"""The console's detail pages (issue 9): built by the session's detail work."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
