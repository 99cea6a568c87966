"""Webhook subscriptions and their outbox.

A subscription belongs to an agent API token: the token's scope decides which tasks' events reach it and the
token's liveness is the subscription's (a revoked token's subscriptions receive nothing more). Its ``secret`` signs
every delivery, so it is stored as it is (a hash could not sign); it is shown once, in the answer that creates the
subscription, and never again: never listed, never in a delivery, never logged.

A delivery is an outbox row, written in the transaction of the change it reports (hooks/services.py): a change that
rolls back leaves no delivery, a committed one always has its delivery. Celery sends it afterwards; the row says how
far it got."""

from django.db import models
from django.db.models.functions import Left
from django.db.models.lookups import Exact

from api.models import ApiToken

# The events an agent may subscribe to (docs/api.md, Webhooks).
WEBHOOK_EVENTS = (
    "cancel_requested",
    "takeover_started",
    "task_resumed",
    "replan_requested",
    "lease_force_released",
    "task_finished",
)
URL_MAX = 2000


class WebhookSubscription(models.Model):
    token = models.ForeignKey(ApiToken, on_delete=models.PROTECT, related_name="webhook_subscriptions")
    url = models.CharField(max_length=URL_MAX)
    events = models.JSONField()  # a sorted list of WEBHOOK_EVENTS names, at least one
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("created_at", "pk")
        constraints = [
            models.CheckConstraint(condition=~models.Q(secret=""), name="webhook_subscription_has_secret"),
            # Compared exactly (LIKE is case-insensitive on SQLite, startswith case-sensitive on PostgreSQL): the
            # scheme is stored in lower case (hooks/services.py case-folds it), and both databases say so alike.
            models.CheckConstraint(
                condition=models.Q(Exact(Left("url", 8), "https://")) | models.Q(Exact(Left("url", 7), "http://")),
                name="webhook_subscription_url_scheme",
            ),
        ]
        indexes = [models.Index(fields=["token"], condition=models.Q(deleted_at__isnull=True), name="hooks_live_idx")]

    def __str__(self) -> str:
        return f"webhook subscription {self.pk} of {self.token_id}"  # never the secret, nor the URL


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # to send (again) at next_attempt_at
    DELIVERED = "delivered"  # a 2xx answered
    DEAD = "dead"  # given up: out of attempts, or the subscription is gone


class WebhookDelivery(models.Model):
    subscription = models.ForeignKey(WebhookSubscription, on_delete=models.PROTECT, related_name="deliveries")
    delivery_id = models.UUIDField(unique=True)  # Reckon-Delivery: the receiver dedupes by it
    event = models.CharField(max_length=40, choices=[(name, name) for name in WEBHOOK_EVENTS])
    task_id = models.BigIntegerField()
    task_version = models.PositiveIntegerField()  # the version the event made: receivers order by it
    occurred_at = models.DateTimeField()
    payload = models.JSONField()  # the body's "data": references, never secrets (event payloads pass hygiene)
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Due from this time; while one worker sends, it is pushed past the send's timeout (the claim).
    next_attempt_at = models.DateTimeField()
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # One delivery per subscription for each webhook event of a task version: a listener called twice for
            # the same event (it is not) could not send it twice.
            models.UniqueConstraint(
                fields=["subscription", "task_id", "task_version", "event"], name="webhook_delivery_once_per_event"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=[s.value for s in DeliveryStatus]), name="webhook_delivery_status"
            ),
            models.CheckConstraint(
                condition=models.Q(event__in=list(WEBHOOK_EVENTS)), name="webhook_delivery_event_known"
            ),
            # Delivered exactly when a delivery time is recorded, and only after at least one attempt.
            models.CheckConstraint(
                condition=(
                    models.Q(status=DeliveryStatus.DELIVERED, delivered_at__isnull=False, attempts__gte=1)
                    | (~models.Q(status=DeliveryStatus.DELIVERED) & models.Q(delivered_at__isnull=True))
                ),
                name="webhook_delivery_delivered_at",
            ),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="hooks_delivery_due_idx")]

    def __str__(self) -> str:
        return f"webhook delivery {self.delivery_id} ({self.event}, task {self.task_id} v{self.task_version})"
