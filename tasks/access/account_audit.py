"""Superuser and staff status changes, audited wherever they are made.

Reckon's roles change only through tasks/access/permissions.py, which audits each. A Django account's superuser and
staff
flags can also change outside it: ``manage.py createsuperuser``, the Django admin, a shell. A superuser passes every
Django permission check, so a change of either flag is recorded on the audit chain, in the same transaction as the
save, as the system principal ``account_flags`` (the signal does not know who made it; the details say what).
Connected by TasksConfig.ready().
"""

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver

from audit.principals import Principal
from audit.services import audit_append
from leases import clock

_FLAGS = ("is_superuser", "is_staff")
_BEFORE = "_reckon_flags_before"


@receiver(pre_save, sender=User, dispatch_uid="reckon-account-flags-before")
def _remember_flags(sender: type[User], instance: User, raw: bool = False, **kwargs: Any) -> None:
    before: dict[str, bool] | None = None
    if instance.pk is not None and not raw:
        row = User.objects.filter(pk=instance.pk).values(*_FLAGS).first()
        before = {flag: bool(row[flag]) for flag in _FLAGS} if row is not None else None
    setattr(instance, _BEFORE, before)


@receiver(post_save, sender=User, dispatch_uid="reckon-account-flags-audit")
def _audit_flags(sender: type[User], instance: User, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if raw:
        return  # loading a fixture: not a change anyone made
    before: dict[str, bool] = getattr(instance, _BEFORE, None) or dict.fromkeys(_FLAGS, False)
    after = {flag: bool(getattr(instance, flag)) for flag in _FLAGS}
    changed = {flag: [before[flag], after[flag]] for flag in _FLAGS if before[flag] != after[flag]}
    if not changed:
        return
    with transaction.atomic():
        audit_append(
            actor=Principal.system("account_flags"),
            action="account_flags_changed",
            at=clock.now(),
            details={"user": instance.get_username(), "created": created, **changed},
        )
