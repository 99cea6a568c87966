"""Celery entry points for webhooks: thin adapters over hooks/services.py. Correctness never depends on a message:
a duplicate finds the delivery claimed or done (``skipped``); a lost one is found by the sweep."""

from typing import Any

from celery import Task, shared_task

from hooks.services import deliver, deliveries_due, deliveries_expire, enqueue_delivery
from leases import clock

# A retry asked for further away than this is left to the sweep (it finds the delivery from the database): a broker
# holding a message with a countdown of hours is a message likely to be lost or redelivered anyway.
MAX_COUNTDOWN_SECONDS = 300.0


@shared_task(name="hooks.deliver", acks_late=True, ignore_result=True, bind=True)
def deliver_webhook(self: Task[Any, Any], delivery_id: str) -> str:
    """Send one delivery; on a retryable failure ask for the next try on the queue this one came from."""
    attempt = deliver(delivery_id)
    if attempt.retry_at is not None:
        countdown = max(0.0, (attempt.retry_at - clock.now()).total_seconds())
        if countdown <= MAX_COUNTDOWN_SECONDS:
            queue = str((self.request.delivery_info or {}).get("routing_key") or "")
            enqueue_delivery(delivery_id, countdown=countdown, queue=queue)
    return attempt.outcome


@shared_task(name="hooks.sweep", ignore_result=True)
def sweep(queue: str = "") -> int:
    """Ask for every due, pending delivery to be sent (beat runs it every RECKON_WEBHOOK_SWEEP_SECONDS), and forget
    the deliveries older than RECKON_WEBHOOK_KEEP_DAYS that are settled."""
    deliveries_expire()
    due = deliveries_due()
    for delivery_id in due:
        enqueue_delivery(delivery_id, queue=queue)
    return len(due)
