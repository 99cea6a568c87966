"""Celery entry points of the audit app: the periodic checkpoint of every chain's head (audit/anchors.py), and the
fold of account changes the database captured into the audit chain (audit/account_changes.py)."""

from celery import shared_task

from audit.account_changes import account_changes_fold_all
from audit.anchors import anchor_heads


@shared_task(name="audit.anchor_heads", ignore_result=True)
def anchor_heads_job() -> int | None:
    """Beat runs this every RECKON_ANCHOR_SECONDS; the audit seq anchored, or None when anchoring is off."""
    checkpoint = anchor_heads()
    return checkpoint.audit_seq if checkpoint else None


@shared_task(name="audit.fold_account_changes", ignore_result=True)
def fold_account_changes_job() -> int:
    """Beat runs this every RECKON_ACCOUNT_FOLD_SECONDS; the number of captured account changes put on the chain."""
    return account_changes_fold_all()
