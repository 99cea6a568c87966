"""The console's notes pages (issue 9 point 8)."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
