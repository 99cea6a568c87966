"""Who a principal is: roles and grants, the one place these rules live. Which of them a change needs, in which
task status, is the permit table (tasks.core.lifecycle: PERMITS and NEEDS), asked through tasks.access.permits.

Roles are Django groups — operator, admin, auditor (read-only) — and nothing else: a Django superuser is not a
Reckon admin unless the admin group says so (granting it is audited: tasks/access/accounts.py). An operator
operates (takes over, decides, settles by hand, cancels) only tasks granted to them: one task (a django-guardian
object permission) or every task of a project or kind (a ScopeGrant). Admins operate every task, force-release
leases, review forced releases and grant roles and permissions. Agents drive their own leases and the step protocol.

A user's roles are read once per user object (one query) and cached on it, as Django caches permissions
(``_perm_cache``): a console request reads them once however many checks it makes. role_grant and role_revoke
refresh the cache of the user object they are given; code that changes groups otherwise reads the user again.
"""

from typing import Any

from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction
from django.db.models import CharField, Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Cast
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from tasks.core.errors import TaskError
from tasks.models import ScopeGrant, Task

OPERATOR, ADMIN, AUDITOR = "operator", "admin", "auditor"
ROLES = (OPERATOR, ADMIN, AUDITOR)
OPERATE = "tasks.operate_task"
_ROLE_CACHE = "_reckon_roles"


class PermissionDenied(TaskError):
    code = "permission_denied"


class GrantRefused(TaskError):
    """A scope grant that is already there, or a revocation of one that is not."""

    code = "grant_refused"


def roles_of(user: Any) -> frozenset[str]:
    """The Reckon roles of an active user (none for an inactive or anonymous one): one query, then cached on the
    user object."""
    if user is None or not user.is_authenticated or not user.is_active:
        return frozenset()
    cached: frozenset[str] | None = getattr(user, _ROLE_CACHE, None)
    if cached is None:
        cached = frozenset(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        setattr(user, _ROLE_CACHE, cached)
    return cached


def forget_roles(user: Any) -> None:
    """Drop the cached roles of this user object, after its groups changed."""
    if hasattr(user, _ROLE_CACHE):
        delattr(user, _ROLE_CACHE)


def principal_roles(principal: Principal) -> frozenset[str]:
    if principal.kind != "user":
        return frozenset()
    return roles_of(principal.user)


def has_role(principal: Principal, role: str) -> bool:
    return role in principal_roles(principal)


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
    """can_operate for every task at once: the condition on Task rows, for one query
    (``Task.objects.filter(operable_condition(principal))``).
    Roles already read for this user object (roles_of) decide in Python; otherwise they are asked in the same
    statement, so the list stays one query either way. Grants are always in the statement. Object permissions as
    django-guardian grants them: to the user, or to a group the user is in."""
    user = principal.user
    if principal.kind != "user" or user is None or not user.is_authenticated or not user.is_active:
        return Q(pk__in=[])
    roles = _known_roles(user)
    if roles is not None:
        if ADMIN in roles:
            return Q()
        return _granted(user) if OPERATOR in roles else Q(pk__in=[])
    return _member_of(user, ADMIN) | (_member_of(user, OPERATOR) & _granted(user))


def can_view(principal: Principal, task: Task) -> bool:
    """Admins and auditors see every task; an operator sees the tasks they may operate."""
    return bool(principal_roles(principal) & {ADMIN, AUDITOR}) or can_operate(principal, task)


def viewable_condition(principal: Principal) -> Q:
    """can_view for every task at once: the condition on Task rows, as operable_condition
    reads roles."""
    user = principal.user
    if principal.kind != "user" or user is None or not user.is_authenticated or not user.is_active:
        return Q(pk__in=[])
    roles = _known_roles(user)
    if roles is not None:
        return Q() if roles & {ADMIN, AUDITOR} else operable_condition(principal)
    return _member_of(user, ADMIN) | _member_of(user, AUDITOR) | operable_condition(principal)


def _known_roles(user: Any) -> frozenset[str] | None:
    return getattr(user, _ROLE_CACHE, None)


def _member_of(user: Any, role: str) -> Q:
    return Q(Exists(Group.objects.filter(user=user, name=role)))


def _granted(user: Any) -> Q:
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
    return (
        Q(Exists(UserObjectPermission.objects.filter(user=user, **on_this_task)))
        | Q(Exists(GroupObjectPermission.objects.filter(group__user=user, **on_this_task)))
        | Q(Exists(ScopeGrant.objects.filter(scope, user=user)))
    )


def operate_denied(principal: Principal, task_id: int) -> PermissionDenied:
    return PermissionDenied(f"{principal} may not operate task {task_id}", task_id=task_id)


def require_operate(principal: Principal, task: Task) -> None:
    if not can_operate(principal, task):
        raise operate_denied(principal, task.pk)


def require_admin(principal: Principal, what: str) -> None:
    if not has_role(principal, ADMIN):
        raise PermissionDenied(f"{principal} is not an admin: only admins may {what}")


def permission_grant(
    *, actor: Principal, user: User, task: Task | None = None, project: str = "*", kind: str = "*"
) -> None:
    """Let ``user`` operate one task, or every task of a project and/or kind. Audited."""
    require_admin(actor, "grant permissions")
    _check_scope(task, project, kind)
    with transaction.atomic():
        now = clock.now()
        if task is not None:
            if _task_grants(user, task).exists():
                raise GrantRefused(f"{user.get_username()} already operates task {task.pk}")
            assign_perm(OPERATE, user, task)
        elif ScopeGrant.objects.filter(user=user, project=project, kind=kind).exists():
            raise GrantRefused(f"{user.get_username()} already operates project {project}, kind {kind}")
        else:
            try:
                with transaction.atomic():
                    ScopeGrant.objects.create(
                        user=user, project=project, kind=kind, granted_by=str(actor), granted_at=now
                    )
            except IntegrityError:  # granted meanwhile by another admin
                raise GrantRefused(f"{user.get_username()} already operates project {project}, kind {kind}") from None
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
            if not _task_grants(user, task).exists():
                raise GrantRefused(f"{user.get_username()} has no grant on task {task.pk}")
            remove_perm(OPERATE, user, task)
        else:
            removed, _ = ScopeGrant.objects.filter(user=user, project=project, kind=kind).delete()
            if not removed:
                raise GrantRefused(f"{user.get_username()} has no grant on project {project}, kind {kind}")
        audit_append(
            actor=actor,
            action="permission_revoked",
            at=now,
            task_id=task.pk if task else None,
            details=_grant_details(user, task, project, kind),
        )


def task_grants_condition() -> dict[str, str]:
    """The user object permissions that let their user operate one task (django-guardian rows), as filters."""
    app_label, codename = OPERATE.split(".")
    return {
        "permission__codename": codename,
        "permission__content_type__app_label": app_label,
        "content_type__app_label": app_label,
        "content_type__model": Task._meta.model_name or "task",
    }


def _task_grants(user: User, task: Task) -> "QuerySet[UserObjectPermission]":
    return UserObjectPermission.objects.filter(user=user, object_pk=str(task.pk), **task_grants_condition())


def _check_scope(task: Task | None, project: str, kind: str) -> None:
    if task is None and project == "*" and kind == "*":
        raise ValueError("grant one task, a project or a kind; everything is what the admin role is for")


def _grant_details(user: User, task: Task | None, project: str, kind: str) -> dict[str, Any]:
    scope = {"task": task.pk} if task is not None else {"project": project, "kind": kind}
    return {"user": user.get_username(), "permission": OPERATE, **scope}
