from typing import Any

from django.apps import AppConfig
from django.conf import settings


class ObservabilityConfig(AppConfig):
    name = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Hooks into Celery's signals, so the jobs need not know: every record logged during a wake-up of a task
        (``tasks.drive_task(task_id, seen_version)``) carries the task's id and the version the sender saw; and,
        when traces are on (RECKON_TRACES), a job continues the trace of whoever queued it and the connectors of
        the registered task kinds are traced; every state change the event log records is logged once
        (observability.logs.log_state_change)."""
        from celery.signals import before_task_publish, task_postrun, task_prerun

        from observability import tracing
        from observability.logs import STATE_EVENTS, bind, log_state_change, unbind
        from tasks.engine.events import observe

        observe(STATE_EVENTS, log_state_change, on_finish=True)  # one line per state change
        observe(STATE_EVENTS, tracing.record_state_change, on_finish=True)  # and an event on its span, traced
        tracing.configure(tracing.processor_for(getattr(settings, "RECKON_TRACES", "")))
        if tracing.enabled():
            tracing.trace_registered_connectors()
        tokens: dict[str, object] = {}

        @before_task_publish.connect(weak=False)
        def _inject(headers: dict[str, Any] | None = None, **_: Any) -> None:
            if headers is not None:
                tracing.inject_into(headers)

        @task_prerun.connect(weak=False)
        def _started(task_id: str = "", task: Any = None, args: Any = None, **_: Any) -> None:
            if task is not None and getattr(task, "name", "") == "tasks.drive_task" and args:
                tokens[task_id] = bind(task_id=args[0], task_version=args[1] if len(args) > 1 else None)
            tracing.job_started(task_id, task, args)

        @task_postrun.connect(weak=False)
        def _finished(task_id: str = "", state: str | None = None, **_: Any) -> None:
            tracing.job_finished(task_id, state)
            token = tokens.pop(task_id, None)
            if token is not None:
                unbind(token)
