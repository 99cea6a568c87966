from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from leases.models import Lease


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: leases change only through leases.services (forced release comes with its audit trail)."""

    list_display = ("task", "epoch", "holder_kind", "holder_id", "granted_at", "expires_at", "released_at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
