from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from leases.models import BeatLease, Lease


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Domain rows change only through their services, never through an admin form."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ("task", "epoch", "holder_kind", "holder_id", "granted_at", "expires_at", "released_at")


@admin.register(BeatLease)
class BeatLeaseAdmin(ReadOnlyAdmin):
    list_display = ("name", "holder", "epoch", "granted_at", "expires_at")
