"""Jobs are sent by name (tasks/engine/enqueue.py): no service imports a job, and a process that never imported the
job module still sends it."""

from typing import Any

import pytest
from celery import current_app
from django.db import transaction

from tasks.engine.enqueue import enqueue_on_commit, send_job


def test_a_job_this_process_has_goes_through_the_job_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.jobs

    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.jobs.drive_task, "delay", lambda *args: sent.append(args))
    send_job("tasks.drive_task", 7)
    assert sent == [(7,)]


def test_a_job_this_process_does_not_have_goes_to_the_broker_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, Any, dict[str, Any]]] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args, **options: sent.append((name, args, options)))
    send_job("elsewhere.only_a_worker_has_it", 7, countdown=3)
    assert sent == [("elsewhere.only_a_worker_has_it", (7,), {"countdown": 3})]


@pytest.mark.django_db(transaction=True)
def test_a_job_asked_for_in_a_transaction_is_sent_once_it_commits_and_never_if_it_rolls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args, **options: sent.append(name))
    with transaction.atomic():
        enqueue_on_commit("elsewhere.committed", 1)
        assert sent == []
    assert sent == ["elsewhere.committed"]
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit("elsewhere.rolled_back", 2)
        raise RuntimeError("rolled back")
    assert sent == ["elsewhere.committed"]
