"""Read-only admin views: every write goes through the services, never through a form on a domain row.

Django's own account admin too, where it grants access: a user's groups (Reckon's roles), permissions, superuser,
staff and active flags, and the groups themselves, change only through tasks/access/permissions.py (the console's Roles
page), which enforces its rules (the last admin is never revoked) and audits who did it and why. The Django admin
still shows them, and still edits a name, an e-mail address or a password.
"""

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.http import HttpRequest

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


ACCESS_FIELDS = ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")


class AccountAdmin(UserAdmin):  # type: ignore[type-arg]
    """Accounts without their access fields: those are the Roles page's (tasks.access.permissions)."""

    readonly_fields = (*UserAdmin.readonly_fields, *ACCESS_FIELDS, "last_login", "date_joined")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # accounts are opened on the Roles page (account_create), audited

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting an account would take its roles with it, past the last-admin rule


class RoleGroupAdmin(GroupAdmin, ReadOnlyAdmin):
    """Reckon's roles are groups made by a migration; their members and permissions are the Roles page's."""


admin.site.unregister(User)
admin.site.unregister(Group)
admin.site.register(User, AccountAdmin)
admin.site.register(Group, RoleGroupAdmin)
