from django.contrib import admin

from leases.admin import ReadOnlyAdmin
from retention.models import RetainedObject


@admin.register(RetainedObject)
class RetainedObjectAdmin(ReadOnlyAdmin):
    list_display = ("pk", "task", "kind", "name", "version", "size", "status", "expires_at", "extended_count")
    list_filter = ("status", "kind")
