"""Celery entry points of the agent API: thin adapters over one service each."""

from celery import shared_task

from api.idempotency import idempotency_records_expire


@shared_task(name="api.expire_idempotency_keys", ignore_result=True)
def expire_idempotency_keys() -> int:
    """Forget the Idempotency-Key records past their 24 hours (a replay after that is a new request anyway)."""
    return idempotency_records_expire()
