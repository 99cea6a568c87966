"""A real Celery worker in its own process drives tasks against the real simulator process.

Messages go through the configured broker (the filesystem broker by default, Redis or RabbitMQ when
CELERY_BROKER_URL says so) on a queue of this test's own, so runs never see each other's messages.
"""

import time
from collections.abc import Iterator

import pytest

from reference.demo import migration_plan
from tasks.core.lifecycle import NodeStatus, OperationStatus
from tasks.engine.plans import task_create
from tasks.jobs import drive_task, recovery_scan
from tasks.models import Node, Operation, Task, TaskWakeUp
from tests.simulator_fixture import Simulator
from tests.workers import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)

EFFECT_NODES = 6  # the demo plan's nodes before its confirmation point


@pytest.fixture
def queue(store: Simulator) -> Iterator[str]:
    with celery_worker(store.url) as name:
        yield name


def wait_for(task: Task, succeeded: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if Node.objects.filter(task=task, status=NodeStatus.SUCCEEDED).count() >= succeeded:
            return
        time.sleep(0.2)
    statuses = dict(Node.objects.filter(task=task).values_list("key", "status"))
    raise AssertionError(f"the worker did not get there in {seconds}s: {statuses}")


def demo_task(project: str = "acme") -> Task:
    return task_create(kind="migrate_project", title=f"Migrate {project}", plan=migration_plan(), created_by="test")


def test_a_worker_process_runs_a_task_to_its_confirmation_point(store: Simulator, queue: str) -> None:
    task = demo_task()
    drive_task.apply_async((task.pk,), queue=queue)
    wait_for(task, EFFECT_NODES)
    effects = store.stats()["by_op_key"]
    assert len(effects) == EFFECT_NODES and set(effects.values()) == {1}


def test_duplicated_wake_ups_and_scans_cause_no_duplicate_side_effect(store: Simulator, queue: str) -> None:
    task = demo_task()
    for _ in range(3):
        drive_task.apply_async((task.pk,), queue=queue)
    recovery_scan(queue=queue)
    recovery_scan(queue=queue)
    wait_for(task, EFFECT_NODES)
    time.sleep(1.5)  # let the duplicates arrive and find nothing to do
    effects = store.stats()["by_op_key"]
    assert len(effects) == EFFECT_NODES and set(effects.values()) == {1}


def test_a_lost_message_is_made_good_by_the_recovery_scan(store: Simulator, queue: str) -> None:
    task = demo_task()  # no message at all: as if it had been lost
    assert recovery_scan(queue=queue) >= 1
    wait_for(task, EFFECT_NODES)
    assert set(store.stats()["by_op_key"].values()) == {1}


def test_a_refused_call_is_retried_after_its_backoff_by_the_worker_asking_for_its_own_next_wake_up(
    store: Simulator, queue: str
) -> None:
    """The store answers 503 once: the node backs off (2 s ± jitter on the database clock) and the wake-up asks the
    broker for another one with that countdown. No scan runs here: only that message can finish the task."""
    task = demo_task()
    store.fault("dependency_unavailable", times=1, action="copy_batch")
    drive_task.apply_async((task.pk,), queue=queue)
    wait_for(task, EFFECT_NODES, seconds=90)
    rejected = Operation.objects.filter(task=task, status=OperationStatus.REJECTED)
    assert [op.failure_class for op in rejected] == ["dependency_unavailable"]
    effects = store.stats()["by_op_key"]
    assert len(effects) == EFFECT_NODES and set(effects.values()) == {1}


def test_scans_run_back_to_back_beside_a_worker_queue_each_wake_up_once_and_each_run_clears_its_claim(
    store: Simulator, queue: str
) -> None:
    """The random-kill run's flood (a wake-up per waiting task per scan) cannot happen: ten scans in a row queue one
    wake-up per task version, the worker runs each, and each run clears the claim it was queued under."""
    tasks = [demo_task(f"p{i}") for i in range(3)]
    sent = [recovery_scan(queue=queue) for _ in range(10)]
    assert sum(sent) == len(tasks) and sent[0] == len(tasks)
    for task in tasks:
        wait_for(task, EFFECT_NODES)
    effects = store.stats()["by_op_key"]
    assert len(effects) == EFFECT_NODES * len(tasks) and set(effects.values()) == {1}
    claims = TaskWakeUp.objects.filter(task__in=tasks)
    assert claims.count() == len(tasks) and not claims.filter(queued_version__isnull=False).exists()
