from typing import Any

from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Every record logged during a wake-up of a task (the Celery job ``tasks.drive_task(task_id,
        seen_version)``) carries that task's id and the version the sender saw, without the job knowing."""
        from celery.signals import task_postrun, task_prerun

        from observability.logs import bind, unbind

        tokens: dict[str, object] = {}

        @task_prerun.connect(weak=False)
        def _bind(task_id: str = "", task: Any = None, args: Any = None, **_: Any) -> None:
            if task is None or getattr(task, "name", "") != "tasks.drive_task" or not args:
                return
            tokens[task_id] = bind(task_id=args[0], task_version=args[1] if len(args) > 1 else None)

        @task_postrun.connect(weak=False)
        def _unbind(task_id: str = "", **_: Any) -> None:
            token = tokens.pop(task_id, None)
            if token is not None:
                unbind(token)
