"""Celery entry point of the audit app: the periodic checkpoint of every chain's head (audit/anchors.py)."""

from celery import shared_task

from audit.anchors import anchor_heads


@shared_task(name="audit.anchor_heads", ignore_result=True)
def anchor_heads_job() -> int | None:
    """Beat runs this every RECKON_ANCHOR_SECONDS; the audit seq anchored, or None when anchoring is off."""
    checkpoint = anchor_heads()
    return checkpoint.audit_seq if checkpoint else None
