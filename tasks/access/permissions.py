"""Who may do what. The one place these rules live; every state-changing service calls it.

Roles are Django groups — operator, admin, auditor (read-only) — and nothing else: a Django superuser is not a
Reckon admin unless the admin group says so (granting it is audited: role_grant, admin_bootstrap). An operator
operates (takes over, decides, settles by hand, cancels) only tasks granted to them: one task (a django-guardian
object permission) or every task of a project or kind (a ScopeGrant). Admins operate every task, force-release
leases, review forced releases and grant roles and permissions. Agents drive their own leases and the step protocol.

A user's roles are read once per user object (one query) and cached on it, as Django caches permissions
(``_perm_cache``): a console request reads them once however many checks it makes. role_grant and role_revoke
refresh the cache of the user object they are given; code that changes groups otherwise reads the user again.
"""

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import CharField, Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Cast
from guardian.conf import settings as guardian_settings
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
USERNAME_MAX = 150  # django.contrib.auth's User.username


class PermissionDenied(TaskError):
    code = "permission_denied"


class GrantRefused(TaskError):
    """A scope grant that is already there, or a revocation of one that is not."""

    code = "grant_refused"


class RoleRefused(TaskError):
    """A role change that would change nothing, or leave Reckon without an admin."""

    code = "role_refused"


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


def role_grant(*, actor: Principal, user: User, role: str) -> User:
    """An admin makes ``user`` an operator, admin or auditor. Audited (``role_granted``); granting a role the user
    already holds, or to a deactivated account, is refused and writes nothing."""
    require_admin(actor, "grant roles")
    _check_role(role)
    _check_username(user.get_username())
    if not user.is_active:
        raise RoleRefused(f"{user.get_username()} is deactivated: reactivate the account first")
    with transaction.atomic():
        _grant(actor=actor, user=user, role=role, details={})
    return user


def role_revoke(*, actor: Principal, user: User, role: str) -> User:
    """An admin takes a role away. Audited (``role_revoked``). Refused, writing nothing, if the user does not hold
    the role, or if it would leave no active admin (an admin cannot lock everyone out, themselves included)."""
    require_admin(actor, "revoke roles")
    _check_role(role)
    with transaction.atomic():
        # Every revocation of a role locks its group row first: two admins revoking each other at once are
        # serialised here, so the last-admin count below cannot be read by both before either writes.
        group = Group.objects.select_for_update().filter(name=role).first()
        if group is None or not user.groups.filter(pk=group.pk).exists():
            raise RoleRefused(f"{user.get_username()} is not {_a(role)}")
        if role == ADMIN and not group.user_set.filter(is_active=True).exclude(pk=user.pk).exists():
            raise RoleRefused(f"{user.get_username()} is the last admin: make someone else admin first")
        user.groups.remove(group)
        audit_append(
            actor=actor,
            action="role_revoked",
            at=clock.now(),
            details={"user": user.get_username(), "role": role},
        )
    forget_roles(user)
    return user


def account_create(*, actor: Principal, username: str, role: str) -> tuple[User, str]:
    """An admin opens an account for a person, in one role, with a generated password (returned once, to be handed
    over and changed by its owner). Audited: ``account_created`` and ``role_granted``, in one transaction."""
    require_admin(actor, "create accounts")
    _check_role(role)
    _check_username(username)
    with transaction.atomic():
        if User.objects.filter(username=username).exists():
            raise RoleRefused(f"there is already an account named {username}")
        password = secrets.token_urlsafe(18)
        user = User.objects.create_user(username, password=password)
        audit_append(actor=actor, action="account_created", at=clock.now(), details={"user": username})
        _grant(actor=actor, user=user, role=role, details={})
    return user, password


def account_password_reset(*, actor: Principal, user: User) -> str:
    """An admin gives a person who lost their password a new generated one (returned once); every session of that
    account ends. Audited (``password_reset``). Not for the admin's own account (the Password page is), nor for
    another admin's: that would let one admin act as another (and review their own forced release)."""
    require_admin(actor, "reset passwords")
    if actor.user is not None and actor.user.pk == user.pk:
        raise RoleRefused("change your own password on the Password page")
    if user.groups.filter(name=ADMIN).exists():
        raise RoleRefused(
            f"{user.get_username()} is an admin: an admin changes their own password (or, locked out, from the "
            "command line: manage.py changepassword)"
        )
    password = secrets.token_urlsafe(18)
    with transaction.atomic():
        user.set_password(password)
        user.save(update_fields=["password"])
        audit_append(actor=actor, action="password_reset", at=clock.now(), details={"user": user.get_username()})
    return password


def _check_username(username: str) -> None:
    if username == guardian_settings.ANONYMOUS_USER_NAME:
        raise RoleRefused(f"{username} is reserved for anonymous visitors")
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError as error:
        raise RoleRefused(f"{username!r} is not a valid user name: {' '.join(error.messages)}") from None
    if not username or len(username) > USERNAME_MAX:
        raise RoleRefused("a user name has 1 to 150 characters")


BOOTSTRAP = Principal.system("create_admin")


def admin_bootstrap(*, username: str, existing: bool = False) -> tuple[User, str | None]:
    """The first admin, from the command line (``manage.py create_admin``), audited as the system principal
    ``create_admin``. Creates the account with a generated password, returned once; an account that already exists
    is made admin only when ``existing`` is given (its password is kept, None is returned)."""
    with transaction.atomic():
        user = User.objects.filter(username=username).first()
        password = None
        if user is not None and not existing:
            raise RoleRefused(f"the user {username} already exists: pass --existing to make that account admin")
        if user is None and existing:
            raise RoleRefused(f"there is no user {username} to make admin")
        if user is None:
            password = secrets.token_urlsafe(18)
            user = User.objects.create_user(username, password=password)
        elif not user.is_active:
            raise RoleRefused(f"{username} is deactivated: reactivate the account first")
        _grant(actor=BOOTSTRAP, user=user, role=ADMIN, details={"bootstrap": True, "account_created": not existing})
    return user, password


def _grant(*, actor: Principal, user: User, role: str, details: dict[str, Any]) -> None:
    group, _ = Group.objects.get_or_create(name=role)
    if user.groups.filter(pk=group.pk).exists():
        raise RoleRefused(f"{user.get_username()} is already {_a(role)}")
    user.groups.add(group)
    audit_append(
        actor=actor,
        action="role_granted",
        at=clock.now(),
        details={"user": user.get_username(), "role": role, **details},
    )
    forget_roles(user)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise RoleRefused(f"{role!r} is not a Reckon role (operator, admin or auditor)")


def _a(role: str) -> str:
    return f"an {role}" if role[0] in "aeiou" else f"a {role}"
