from django.apps import AppConfig


class HooksConfig(AppConfig):
    """Webhooks for agents: subscriptions, the outbox written with the change, signed deliveries by Celery."""

    name = "hooks"
    default_auto_field = "django.db.models.BigAutoField"
