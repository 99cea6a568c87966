"""The recovery scan's selection, from the database alone."""

from datetime import timedelta

from django.conf import settings

from leases.services import lease_acquire, lease_reserve
from tasks.engine.recovery import tasks_needing_work
from tests.conftest import chain_plan


def ids() -> set[int]:
    return set(tasks_needing_work().values_list("pk", flat=True))


def test_a_fresh_task_needs_a_worker(make_task, clock) -> None:
    task = make_task()
    assert task.pk in ids()


def test_a_task_held_inside_its_grace_is_left_to_its_holder(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    assert task.pk not in ids()
    clock.set(lease.expires_at + settings.RECKON_LEASE_GRACE - timedelta(microseconds=1))
    assert task.pk not in ids(), "inside the grace only the holder may come back"
    clock.set(lease.expires_at + settings.RECKON_LEASE_GRACE)
    assert task.pk in ids(), "a holder gone past its grace leaves the task to the next worker"


def test_a_task_a_person_waits_for_is_not_handed_to_a_worker(make_task, clock) -> None:
    task = make_task()
    lease_reserve(task_id=task.pk, operator_id="ann")
    assert task.pk not in ids()


def test_ended_paused_and_human_tasks_are_not_workable(make_task, clock) -> None:
    from tasks.models import Task

    tasks = {status: make_task(chain_plan("a")) for status in ("completed", "failed", "stopped", "human")}
    for status, task in tasks.items():
        Task.objects.filter(pk=task.pk).update(status=status)
    paused = make_task(chain_plan("a"))
    Task.objects.filter(pk=paused.pk).update(status="paused", status_reason="needs_replan")
    found = ids()
    assert not found & ({t.pk for t in tasks.values()} | {paused.pk})


def test_a_task_still_stopping_needs_a_worker_to_settle_it(make_task, clock) -> None:
    from tasks.models import Task

    task = make_task(chain_plan("a"))
    Task.objects.filter(pk=task.pk).update(status="stopping", cancel_requested_at=clock.now())
    assert task.pk in ids()
    lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    assert task.pk not in ids()
