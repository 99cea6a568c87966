"""Celery jobs sent once a change is committed: the one place a service asks for a job. A job is named, not
imported (the jobs sit above the services they call: tasks/jobs.py); a lost message costs latency only, since the
recovery scan finds the work from the database."""

from typing import Any

from celery import current_app
from django.db import transaction


def send_job(job: str, *args: Any, **options: Any) -> None:
    """Send job ``job`` (its Celery name) with ``args`` now. Through the job itself where this process has it
    (eager mode in tests, the task's own routing), else by name to the broker: a web process that never imported
    the job module sends it all the same."""
    task = current_app.tasks.get(job)
    if task is None:
        current_app.send_task(job, args=args, **options)
    elif options:
        task.apply_async(args, **options)
    else:
        task.delay(*args)


def enqueue_on_commit(job: str, *args: Any) -> None:
    """send_job once the current transaction commits, at once outside one. ``robust``: a broker that is down does
    not undo a committed change."""
    transaction.on_commit(lambda: send_job(job, *args), robust=True)


def wake_agent_on_commit(task_id: int) -> None:
    """The agent's wake-up, sent once a person's hand-back is committed (never from inside the transaction: a worker
    that woke first would find the person's lease still open). A lost message costs latency only: the recovery
    scan finds the task from the database. ``robust``: a broker that is down does not undo a committed decision."""
    enqueue_on_commit("tasks.drive_task", task_id)
