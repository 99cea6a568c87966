"""Every change of access the database saw, on the audit chain.

Reckon's services audit the role and scope changes they make (who, why: ``role_granted``, ``scope_granted``, …) and
a signal audits superuser and staff flags saved through the ORM (tasks/access/account_audit.py). Neither sees a change
made
past them: a bulk ``update()``, raw SQL, a shell, the Django admin's group and permission fields. So the database
captures them all itself — triggers on the account tables write an AccountChange row in the transaction of the
change (audit/capture_sql.py) — and this module folds each captured row into the audit chain as
``account_change_captured`` by ``system:database``: what changed, on which table, when the database saw it. A change
the services audited is on the chain twice, once as they tell it and once as the database saw it; a change nothing
audited is on it once, and an auditor filtering on ``account_change_captured`` sees every change of access.

The beat folds every RECKON_ACCOUNT_FOLD_SECONDS (audit/jobs.py), ``verify_audit`` folds before it verifies, and a
verdict counts what is captured but not folded yet. A captured row cannot be removed or altered, nor marked folded
without its audit event on the chain (triggers, audit/migrations/0006).
"""

from typing import Any

from django.db import transaction

from audit.hygiene import PayloadRejected
from audit.models import AccountChange
from audit.principals import Principal
from audit.services import audit_append, audit_lock

ACTION = "account_change_captured"
DATABASE = Principal.system("database")


def account_changes_fold(*, limit: int = 500) -> int:
    """Append one audit event per captured account change not on the chain yet, oldest first (at most ``limit``
    in one transaction); the number folded. Each event is dated when the database saw the change. Folds racing each
    other append each change once: the audit head's lock orders them, and each reads what is left after the other
    committed."""
    with transaction.atomic():
        audit_lock()
        rows = list(AccountChange.objects.filter(audit_seq__isnull=True).order_by("pk")[:limit])
        for row in rows:
            try:
                event = audit_append(actor=DATABASE, action=ACTION, at=row.at, details=_details(row))
            except PayloadRejected as refused:  # refused before anything was written: the change still goes on
                event = audit_append(actor=DATABASE, action=ACTION, at=row.at, details=_withheld(row, refused.code))
            AccountChange.objects.filter(pk=row.pk, audit_seq__isnull=True).update(audit_seq=event.seq)
    return len(rows)


def account_changes_fold_all() -> int:
    """Fold until nothing captured is left off the chain (each batch its own transaction)."""
    total = 0
    while folded := account_changes_fold():
        total += folded
    return total


def _details(row: AccountChange) -> dict[str, Any]:
    change: dict[str, Any] = row.change if isinstance(row.change, dict) else {"change": row.change}
    # The row's own keys last: nothing a trigger wrote can stand in for them.
    return {**change, **_capture(row)}


def _withheld(row: AccountChange, refusal: str) -> dict[str, Any]:
    """A captured change whose content the audit's hygiene refuses (a credential-like group or token name, or more
    than its cap): on the chain without it, saying why; the captured row keeps it for whoever investigates."""
    return {**_capture(row), "withheld": refusal}


def _capture(row: AccountChange) -> dict[str, Any]:
    return {"capture": row.pk, "table": row.table_name, "operation": row.operation, "captured_at": row.at.isoformat()}
