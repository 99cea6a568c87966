"""Read-only admin views: every write goes through the services, never through a form on a domain row."""

from django.contrib import admin

from leases.admin import ReadOnlyAdmin
from tasks.models import Event, Node, Operation, PlanRevision, Receipt, Task, TempResource


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("pk", "kind", "title", "status", "status_reason", "version", "plan_version", "updated_at")
    list_filter = ("status", "kind")


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ("task", "plan_version", "key", "action", "status", "attempts", "last_error_class")
    list_filter = ("status",)


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ("op_key", "task", "action", "status", "failure_class", "registered_at")
    list_filter = ("status",)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("task", "seq", "type", "created_at")


admin.site.register(PlanRevision, ReadOnlyAdmin)
admin.site.register(Receipt, ReadOnlyAdmin)
admin.site.register(TempResource, ReadOnlyAdmin)
