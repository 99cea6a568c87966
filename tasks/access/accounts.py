"""People's accounts and roles: an admin opens an account, grants and revokes a role, resets a password; the first
admin comes from the command line. Each audited in the same transaction. Who may do what with a role:
tasks/access/permissions.py."""

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from guardian.conf import settings as guardian_settings

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from tasks.access.permissions import ADMIN, ROLES, forget_roles, require_admin
from tasks.core.errors import TaskError

USERNAME_MAX = 150  # django.contrib.auth's User.username


class RoleRefused(TaskError):
    """A role change that would change nothing, or leave Reckon without an admin."""

    code = "role_refused"


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
