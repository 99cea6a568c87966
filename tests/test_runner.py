"""The runner (the agent loop as a service) against the real simulator process."""

import pytest
from django.contrib.auth.models import Group, User

from audit.principals import Principal
from leases.services import lease_acquire
from reference.demo import migration_plan
from reference.objectstore import ObjectStoreConnector
from tasks.core.lifecycle import OperationStatus, TaskStatus
from tasks.engine.plans import task_create
from tasks.engine.runner import run_steps
from tasks.models import Operation, Task
from tasks.people.takeover import (
    takeover_claim,
    takeover_submit,
)

pytestmark = pytest.mark.django_db


def demo_task() -> Task:
    return task_create(kind="migrate_project", title="Migrate acme", plan=migration_plan(), created_by="agent:m")


def test_the_runner_takes_the_demo_plan_to_its_confirmation_point_with_one_effect_per_op_key(store) -> None:
    task = demo_task()
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert report.directive is not None
    assert (report.directive.kind, report.directive.reason, report.stopped_by) == ("stop", "awaiting_approval", "")
    effects = store.stats()["by_op_key"]
    assert len(effects) == 6 and set(effects.values()) == {1}


def test_a_dropped_answer_is_settled_by_op_key_and_never_sent_twice(store) -> None:
    task = demo_task()
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    store.fault("accept_then_drop", times=1)
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert report.directive is not None and report.directive.reason == "awaiting_approval"
    assert set(store.stats()["by_op_key"].values()) == {1}
    assert not Operation.objects.filter(task=task, status=OperationStatus.UNKNOWN).exists()


def test_an_unreachable_store_leaves_the_operation_unknown_and_stops(store) -> None:
    task = demo_task()
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    store.fault("accept_then_drop", times=1)
    connector = ObjectStoreConnector(store.url)
    first = run_steps(task_id=task.pk, lease=lease, connector=connector, max_steps=1)  # one send (dropped)
    store.kill()
    report = run_steps(task_id=task.pk, lease=first.lease, connector=connector)
    assert report.stopped_by == "remote_unreachable"
    assert Operation.objects.filter(task=task, status=OperationStatus.UNKNOWN).count() == 1
    store.start()  # the same state file (on a new port): the committed write is still there
    done = run_steps(task_id=task.pk, lease=report.lease, connector=ObjectStoreConnector(store.url))
    assert done.directive is not None and done.directive.reason == "awaiting_approval"
    assert set(store.stats()["by_op_key"].values()) == {1}


def test_after_a_hand_back_the_runner_rechecks_inputs_and_pauses_on_a_change(store, clock) -> None:
    task = demo_task()
    admin = User.objects.create_user("root")
    admin.groups.add(Group.objects.get(name="admin"))
    claim = takeover_claim(actor=Principal.of_user(admin), task_id=task.pk)
    assert claim.lease is not None
    version = Task.objects.get(pk=task.pk).version
    takeover_submit(
        actor=Principal.of_user(admin), lease=claim.lease, based_on_version=version, decision="resume_agent"
    )
    store.set_source("projects/acme", "8", "sha256:" + "cd" * 32)  # the source moved while a person had it
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-1")
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "input_changed")
    assert report.directive is not None and report.directive.kind == "stop"
    assert store.stats()["by_op_key"] == {}, "nothing was sent against the changed source"
