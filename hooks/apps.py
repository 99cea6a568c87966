from django.apps import AppConfig


class HooksConfig(AppConfig):
    """Webhooks for agents: subscriptions, the outbox written with the change, signed deliveries by Celery."""

    name = "hooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The outbox is written inside the transaction of every event it maps (tasks/engine/events.py): the step's hot
        # path appends only events it does not listen to, which cost a dict lookup.
        from hooks.services import SOURCE_EVENTS, outbox_listener
        from tasks.engine.events import listen

        listen(SOURCE_EVENTS, outbox_listener, on_finish=True)
        # The agent API's /webhooks routes are this app's (hooks/api.py), added to the one API when it is built
        # (api/routers.py): hooks builds on api.
        from api.routers import add_router

        add_router("/", "hooks.api.router")
