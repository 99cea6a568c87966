"""The demo's logins: an operator, two admins (a forced release is reviewed by another admin), an auditor and an
outsider with no role. Roles and the operator's grant go through the audited services (tasks/access/permissions.py), the
first admin through the same bootstrap as ``manage.py create_admin``. Passwords are generated on every load and
returned to be printed once; only their hashes are stored."""

import contextlib
import secrets
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction

from audit.principals import Principal
from reference.demo_agent import DEMO_KINDS
from reference.migrate_project import KIND
from tasks.access.accounts import admin_bootstrap, role_grant
from tasks.access.permissions import ADMIN, AUDITOR, OPERATOR, GrantRefused, permission_grant
from tasks.access.permissions import roles_of as _roles_of

FIRST_ADMIN = "admin"
# username → its role ("" for none), in the order they are printed.
DEMO_LOGINS: dict[str, str] = {
    "operator": OPERATOR,
    FIRST_ADMIN: ADMIN,
    "admin2": ADMIN,
    "auditor": AUDITOR,
    "outsider": "",
}
DESCRIPTIONS = {
    "operator": f"operator, may operate every {', '.join((KIND, *DEMO_KINDS))} task",
    FIRST_ADMIN: "admin",
    "admin2": "admin (reviews the other admin's forced releases)",
    "auditor": "auditor, sees everything, changes nothing",
    "outsider": "logged in, no role: refused everywhere",
}


@dataclass(frozen=True)
class Login:
    user: User
    password: str
    role: str
    created: bool  # False: the account existed, its password was replaced

    @property
    def username(self) -> str:
        return self.user.get_username()


def _password() -> str:
    return secrets.token_urlsafe(12)


def _set_password(user: User) -> str:
    password = _password()
    user.set_password(password)
    user.save(update_fields=["password"])
    return password


def demo_logins_ensure() -> list[Login]:
    """Create the demo accounts, or give the existing ones fresh passwords; grant each its role once."""
    logins = []
    with transaction.atomic():
        admin = User.objects.filter(username=FIRST_ADMIN).first()
        created_admin = admin is None
        if admin is None:
            admin, _ = admin_bootstrap(username=FIRST_ADMIN)
        elif ADMIN not in _roles_of(admin):
            admin, _ = admin_bootstrap(username=FIRST_ADMIN, existing=True)
        actor = Principal.of_user(admin)
        for username, role in DEMO_LOGINS.items():
            user = admin if username == FIRST_ADMIN else User.objects.filter(username=username).first()
            created = created_admin if username == FIRST_ADMIN else user is None
            if user is None:
                user = User.objects.create_user(username)
            password = _set_password(user)
            if role and role not in _roles_of(user):
                role_grant(actor=actor, user=user, role=role)
            if role == OPERATOR:
                for kind in (KIND, *DEMO_KINDS):  # the worker's kind and those the demo's agents drive over HTTP
                    with contextlib.suppress(GrantRefused):  # granted on an earlier load
                        permission_grant(actor=actor, user=user, kind=kind)
            logins.append(Login(user=user, password=password, role=role, created=created))
    return logins
