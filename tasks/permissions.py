"""Who may do what. The one place these rules live; every state-changing service calls it.

Roles are Django groups — operator, admin, auditor (read-only). An operator operates (takes over,
decides, settles by hand, cancels) only tasks granted to them: one task (a django-guardian object
permission) or every task of a project or kind (a ScopeGrant). Admins operate every task, force-release
leases, review forced releases and grant permissions. Agents drive their own leases and the step protocol.
"""

from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import CharField, Exists, OuterRef, Q
from django.db.models.functions import Cast
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from tasks.errors import TaskError
from tasks.models import ScopeGrant, Task

OPERATOR, ADMIN, AUDITOR = "operator", "admin", "auditor"
OPERATE = "tasks.operate_task"


class PermissionDenied(TaskError):
    code = "permission_denied"


def has_role(principal: Principal, role: str) -> bool:
    user = principal.user
    if principal.kind != "user" or user is None or not user.is_active:
        return False
    if user.is_superuser and role == ADMIN:
        return True
    return bool(user.groups.filter(name=role).exists())


def can_operate(principal: Principal, task: Task) -> bool:
    if has_role(principal, ADMIN):
        return True
    if not has_role(principal, OPERATOR):
        return False
    user = principal.user
    if user.has_perm(OPERATE, task):
        return True
    scope = (Q(project=task.project) | Q(project="*")) & (Q(kind=task.kind) | Q(kind="*"))
    return ScopeGrant.objects.filter(scope, user=user).exists()


def operable_condition(principal: Principal) -> Q:
    """can_operate for every task at once: the condition on Task rows, for one query (Task.objects.operable_by).
    The user's flags are read from the object, as has_role does; roles and grants from the database. Object
    permissions as django-guardian grants them: to the user, or to a group the user is in."""
    user = principal.user
    if principal.kind != "user" or user is None or not user.is_active:
        return Q(pk__in=[])
    if user.is_superuser:
        return Q()

    def member_of(role: str) -> Q:
        return Q(Exists(Group.objects.filter(user=user, name=role)))

    app_label, codename = OPERATE.split(".")
    on_this_task = {
        "permission__codename": codename,
        "permission__content_type__app_label": app_label,
        "permission__content_type__model": Task._meta.model_name,
        "content_type__app_label": app_label,
        "content_type__model": Task._meta.model_name,
        "object_pk": Cast(OuterRef("pk"), output_field=CharField()),
    }
    scope = (Q(project=OuterRef("project")) | Q(project="*")) & (Q(kind=OuterRef("kind")) | Q(kind="*"))
    granted = (
        Q(Exists(UserObjectPermission.objects.filter(user=user, **on_this_task)))
        | Q(Exists(GroupObjectPermission.objects.filter(group__user=user, **on_this_task)))
        | Q(Exists(ScopeGrant.objects.filter(scope, user=user)))
    )
    return member_of(ADMIN) | (member_of(OPERATOR) & granted)


def can_view(principal: Principal, task: Task) -> bool:
    """Admins and auditors see every task; an operator sees the tasks they may operate."""
    return has_role(principal, ADMIN) or has_role(principal, AUDITOR) or can_operate(principal, task)


def viewable_condition(principal: Principal) -> Q:
    """can_view for every task at once: the condition on Task rows (Task.objects.viewable_by)."""
    if has_role(principal, ADMIN) or has_role(principal, AUDITOR):
        return Q()
    return operable_condition(principal)


def require_view(principal: Principal, task: Task) -> None:
    if not can_view(principal, task):
        raise PermissionDenied(f"{principal} may not see task {task.pk}", task_id=task.pk)


def require_operate(principal: Principal, task: Task) -> None:
    if not can_operate(principal, task):
        raise PermissionDenied(f"{principal} may not operate task {task.pk}", task_id=task.pk)


def require_admin(principal: Principal, what: str) -> None:
    if not has_role(principal, ADMIN):
        raise PermissionDenied(f"{principal} is not an admin: only admins may {what}")


def require_cancel(principal: Principal, task: Task, *, lease: Any = None) -> None:
    """A person needs the right to operate the task. An agent or a system process cancels only its own work: a
    task whose lease it holds (``lease``, checked live by the compare-and-set) or a task it created."""
    if principal.kind == "user":
        require_operate(principal, task)
        return
    holds = (
        lease is not None
        and principal.kind == "agent"
        and (lease.holder_kind, lease.task_id, lease.holder_id) == ("agent", task.pk, principal.id)
    )
    created = task.created_by in (principal.id, str(principal))
    if not (holds or created):
        raise PermissionDenied(
            f"{principal} may cancel only a task it created or holds the lease of, not task {task.pk}",
            task_id=task.pk,
        )


def permission_grant(
    *, actor: Principal, user: User, task: Task | None = None, project: str = "*", kind: str = "*"
) -> None:
    """Let ``user`` operate one task, or every task of a project and/or kind. Audited."""
    require_admin(actor, "grant permissions")
    _check_scope(task, project, kind)
    with transaction.atomic():
        now = clock.now()
        if task is not None:
            assign_perm(OPERATE, user, task)
        else:
            ScopeGrant.objects.get_or_create(
                user=user, project=project, kind=kind, defaults={"granted_by": str(actor), "granted_at": now}
            )
        audit_append(
            actor=actor,
            action="permission_granted",
            at=now,
            task_id=task.pk if task else None,
            details=_grant_details(user, task, project, kind),
        )


def permission_revoke(
    *, actor: Principal, user: User, task: Task | None = None, project: str = "*", kind: str = "*"
) -> None:
    require_admin(actor, "revoke permissions")
    _check_scope(task, project, kind)
    with transaction.atomic():
        now = clock.now()
        if task is not None:
            remove_perm(OPERATE, user, task)
        else:
            ScopeGrant.objects.filter(user=user, project=project, kind=kind).delete()
        audit_append(
            actor=actor,
            action="permission_revoked",
            at=now,
            task_id=task.pk if task else None,
            details=_grant_details(user, task, project, kind),
        )


def _check_scope(task: Task | None, project: str, kind: str) -> None:
    if task is None and project == "*" and kind == "*":
        raise ValueError("grant one task, a project or a kind; everything is what the admin role is for")


def _grant_details(user: User, task: Task | None, project: str, kind: str) -> dict[str, Any]:
    scope = {"task": task.pk} if task is not None else {"project": project, "kind": kind}
    return {"user": user.get_username(), "permission": OPERATE, **scope}
