"""The reference agent (reference/migrate_project.py) against the real simulator process: batches sized by the store's
transaction boundary, a run to completion with its temp copies deleted as operations of their own, a cancel in the
middle, and cleanup that survives a crash half-way and never touches evidence or another task's objects."""

from typing import Any

import pytest

from audit.principals import Principal
from harness.simulator import STAGING_PREFIX
from leases.models import Lease
from leases.services import lease_acquire, lease_release
from reference import migrate_project
from reference.objectstore import ObjectStoreConnector
from tasks.core.lifecycle import FailureClass, OperationStatus, TaskStatus, TempResourceStatus
from tasks.core.outcomes import Committed, Failed, Outcome
from tasks.engine.cleanup import cleanup_temp_resources
from tasks.engine.failpoints import FailpointHit, configure
from tasks.engine.recovery import tasks_needing_work
from tasks.engine.runner import recheck_receipts, run_steps, run_task_once
from tasks.engine.verification import find_problems
from tasks.models import Event, Operation, OperationPurpose, Receipt, Task, TempResource
from tasks.people.cancel import task_request_cancel
from tasks.people.settlement import operation_settle_by_hand
from tasks.people.takeover import (
    takeover_claim,
    takeover_submit,
)
from tests.conftest import person as make_person
from tests.conftest import snapshot

pytestmark = pytest.mark.django_db

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def start(store, objects: int = 30, max_batch: int | None = 10, project: str = "acme") -> Task:
    source = SOURCE | {"locator": f"projects/{project}"}
    store.set_source(source["locator"], "7", SOURCE["digest"])
    return migrate_project.start(
        project=project,
        objects=objects,
        source=source,
        store=ObjectStoreConnector(store.url),
        max_batch=max_batch,
        created_by="agent:migrator",
    )


def test_batches_never_exceed_the_boundary_and_cover_every_object() -> None:
    assert migrate_project.batches(1200, 500) == [500, 500, 200]
    assert migrate_project.batches(30, 10) == [10, 10, 10]
    assert migrate_project.batches(1, 500) == [1]
    for objects, limit in ((0, 10), (5, 0), (-1, 3)):
        with pytest.raises(ValueError):
            migrate_project.batches(objects, limit)


def test_the_batch_size_is_the_stores_transaction_boundary(store) -> None:
    task = start(store, objects=1200, max_batch=None)  # the store says 500
    limits = [n.input["limit"] for n in task.nodes.filter(action="store.copy_batch").order_by("position")]
    assert limits == [500, 500, 200]
    smaller = start(store, objects=1200, max_batch=400, project="beta")
    assert [n.input["limit"] for n in smaller.nodes.filter(action="store.copy_batch")] == [400, 400, 400]
    larger = start(store, objects=1200, max_batch=10_000, project="gamma")  # never beyond what the store allows
    assert max(n.input["limit"] for n in larger.nodes.filter(action="store.copy_batch")) == 500


def test_a_source_that_moved_is_refused_and_nothing_is_written(store) -> None:
    store.set_source("projects/acme", "8", SOURCE["digest"])
    before = snapshot()
    with pytest.raises(migrate_project.SourceMoved, match="version 8, not 7"):
        migrate_project.start(
            project="acme", objects=5, source=SOURCE, store=ObjectStoreConnector(store.url), created_by="agent:m"
        )
    assert snapshot() == before


def test_a_run_completes_and_deletes_each_temp_copy_once_keeping_every_receipt(store) -> None:
    task = start(store)
    wake = run_task_once(task_id=task.pk, holder_id="worker-1", connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, wake.summary
    temps = list(TempResource.objects.filter(task=task))
    assert len(temps) == 3 and {t.status for t in temps} == {TempResourceStatus.DELETED}
    assert all(t.cleanup_receipt is not None for t in temps)
    effects = store.stats()["by_op_key"]
    assert len(effects) == 6 + 3 and set(effects.values()) == {1}
    state = store.control("/_state")
    assert not [key for key in state["objects"] if f"/{STAGING_PREFIX}" in key]  # staging copies gone
    assert len([key for key in state["objects"] if "/objects/" in key]) == 30  # the migrated objects stay
    effect_receipts = Receipt.objects.filter(operation__task=task, operation__purpose=OperationPurpose.EFFECT)
    assert effect_receipts.count() == 6  # evidence of every effect is kept
    assert find_problems(task) == []
    # Waking the ended task again does nothing: no new side effect, nothing written.
    version = Task.objects.get(pk=task.pk).version
    run_task_once(task_id=task.pk, holder_id="worker-2", connector=ObjectStoreConnector(store.url))
    assert store.stats()["side_effects"] == 9 and Task.objects.get(pk=task.pk).version == version


def test_cleanup_never_deletes_another_tasks_objects(store) -> None:
    mine, other = start(store), start(store, project="other")
    run_task_once(task_id=other.pk, holder_id="w", connector=ObjectStoreConnector(store.url))
    lease = lease_acquire(task_id=mine.pk, holder_kind="agent", holder_id="w")
    report = run_steps(task_id=mine.pk, lease=lease, connector=ObjectStoreConnector(store.url), max_steps=5)
    lease_release(lease=report.lease)  # the copies and their verification made, not the switch; the worker stops
    assert Task.objects.get(pk=mine.pk).status == TaskStatus.RUNNING
    objects_before = {k for k in store.control("/_state")["objects"] if k.startswith("tgt-acme")}
    task_request_cancel(actor=Principal.agent("migrator"), task_id=mine.pk, reason="stop the acme migration")
    run_task_once(task_id=mine.pk, holder_id="w2", connector=ObjectStoreConnector(store.url))
    mine.refresh_from_db()
    assert mine.status == TaskStatus.STOPPED
    deleted = {t.locator for t in TempResource.objects.filter(task=mine, status=TempResourceStatus.DELETED)}
    assert deleted and all(locator.startswith("tgt-acme") for locator in deleted)
    after = set(store.control("/_state")["objects"])
    assert after >= objects_before - deleted  # only its own temp copies went
    assert not [
        k for k in after if k.startswith("tgt-other") and f"/{STAGING_PREFIX}" in k
    ]  # other's were its own to delete
    assert len([k for k in after if k.startswith("tgt-other") and "/objects/" in k]) == 30


def test_a_cancel_mid_run_stops_new_effects_then_deletes_the_temp_copies_already_made(store) -> None:
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    # A step is one node (its two commits and the call): the target and two of the three batches.
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url), max_steps=3)
    copies_before = store.stats()["by_action"].get("copy_batch", 0)
    assert copies_before == 2
    # The third batch is started (its operation "may have been sent"), and the worker dies before the call.
    with configure("before_call", "raise"), pytest.raises(FailpointHit):
        run_steps(task_id=task.pk, lease=report.lease, connector=ObjectStoreConnector(store.url), max_steps=1)
    started = Operation.objects.get(task=task, node__key="copy-batch-3")
    assert started.status == OperationStatus.DISPATCHED
    lease_release(lease=report.lease)
    stopping = task_request_cancel(
        actor=Principal.agent("migrator"), task_id=task.pk, reason="stop: wrong target region"
    )
    assert stopping.status == TaskStatus.STOPPING  # the started batch is still to settle, by op key
    wake = run_task_once(task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.STOPPED, wake.summary
    withdrawn = Operation.objects.get(pk=started.pk)  # no trace remotely, and a cancel recorded: never sent
    assert (withdrawn.status, withdrawn.failure_class) == (OperationStatus.REJECTED, "cancelled")
    assert started.op_key not in store.stats()["by_op_key"]
    stats = store.stats()["by_action"]
    assert stats.get("copy_batch", 0) == copies_before and "switch_reference" not in stats
    assert stats.get("delete") == copies_before == TempResource.objects.filter(task=task).count()
    assert find_problems(task) == []


def test_cleanup_crashed_half_way_is_finished_by_the_next_run_without_a_second_delete(store) -> None:
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED
    with configure("mid_cleanup", "raise"), pytest.raises(FailpointHit):
        cleanup_temp_resources(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    # The first delete committed remotely; its operation is still "dispatched" here.
    half = Operation.objects.get(task=task, purpose=OperationPurpose.CLEANUP)
    assert half.status == OperationStatus.DISPATCHED and store.stats()["by_action"]["delete"] == 1
    report = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert (report.deleted, report.remaining, report.stopped_by) == (3, 0, "")
    assert store.stats()["by_action"]["delete"] == 3  # the crashed one was looked up by op key, not resent
    assert Operation.objects.get(pk=half.pk).status == OperationStatus.COMMITTED
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def test_cleanup_waits_while_the_task_may_still_need_its_temp_copies(store) -> None:
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url), max_steps=4)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING
    assert TempResource.objects.filter(task=task).exists()
    report = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert (report.deleted, report.remaining) == (0, 0)
    assert "delete" not in store.stats()["by_action"]


def test_a_wake_up_rechecks_the_newest_receipts_and_pauses_when_the_remote_lost_them(store) -> None:
    """Recovery from facts: the store was restored from an older backup while the task was between wake-ups. The
    next wake-up asks for the newest receipts by op key, finds no trace, and pauses instead of building on them."""
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url), max_steps=4)
    lease_release(lease=report.lease)
    consistent = run_task_once(task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url), max_steps=1)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING, consistent.summary  # consistent: went on
    store.control("/_reset", {})
    store.set_source("projects/acme", "7", SOURCE["digest"])
    run_task_once(task_id=task.pk, holder_id="w3", connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "needs_replan")
    assert "no trace" in task.status_detail
    assert store.stats()["side_effects"] == 0  # nothing new was sent on facts that no longer hold
    assert find_problems(task) == []


def test_an_unreachable_or_unqueryable_remote_is_not_a_contradiction(store) -> None:
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url), max_steps=5)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING
    version = Task.objects.get(pk=task.pk).version
    recheck_receipts(task_id=task.pk, lease=report.lease, connector=ObjectStoreConnector("http://127.0.0.1:9"))
    store.fault("no_idempotency_no_query")
    recheck_receipts(task_id=task.pk, lease=report.lease, connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING and task.version == version  # nothing proven, nothing written


def test_an_accepted_operation_is_observed_until_it_commits_and_never_sent_again(store) -> None:
    """The store accepts the copy and runs it for a while: the wake-up records ``accepted`` (task observing) and
    asks for its next wake-up; that one finds it committed by op key and goes on. One side effect."""
    import time

    task = start(store)
    store.fault("run_async", times=1, ms=1500, action="copy_batch")
    first = run_task_once(task_id=task.pk, holder_id="w", connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.OBSERVING and first.wake_at is not None, first.summary
    accepted = Operation.objects.get(task=task, status=OperationStatus.ACCEPTED)
    early = run_task_once(task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url))
    assert early.wake_at is not None and Operation.objects.get(pk=accepted.pk).status == OperationStatus.ACCEPTED
    time.sleep(1.6)
    last = run_task_once(task_id=task.pk, holder_id="w3", connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, last.summary
    assert store.stats()["by_op_key"][accepted.op_key] == 1
    assert find_problems(task) == []


def test_two_scans_that_saw_the_same_version_run_one_wake_up(store) -> None:
    """Dedupe on (task id, version): the first wake-up moves the task on; the second finds its version stale and
    does nothing — it does not even take the lease."""
    task = start(store)
    seen = Task.objects.get(pk=task.pk).version
    first = run_task_once(task_id=task.pk, holder_id="w1", connector=ObjectStoreConnector(store.url), seen_version=seen)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, first.summary
    version = Task.objects.get(pk=task.pk).version
    second = run_task_once(
        task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url), seen_version=seen
    )
    assert second.summary.startswith("skipped: stale wake-up")
    assert Task.objects.get(pk=task.pk).version == version and store.stats()["side_effects"] == 9
    assert not Lease.objects.filter(task=task, holder_id="w2").exists()


def test_the_scan_finds_an_ended_task_with_temp_copies_left_and_only_until_they_are_gone(store) -> None:
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    report = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    lease_release(lease=report.lease)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED
    assert task.pk in set(tasks_needing_work().values_list("pk", flat=True))  # 3 temp copies to delete
    run_task_once(task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url))
    assert task.pk not in set(tasks_needing_work().values_list("pk", flat=True))


def test_a_refused_delete_is_tried_again_under_a_new_op_key_and_stops_for_a_person_after_three(store, clock) -> None:
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    lease = run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url)).lease
    store.fault("dependency_unavailable", times=1, action="delete")
    first = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert (first.deleted, first.remaining, first.stopped_by) == (0, 3, "remote_unavailable")
    assert first.wake_at is not None and first.wake_at > clock.now()
    # Refused for now: nothing is sent again before the backoff ends (database clock), and no attempt was spent.
    again = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert (again.deleted, again.remaining, again.stopped_by) == (0, 3, "remote_unavailable")
    assert again.wake_at == first.wake_at
    clock.set(first.wake_at)
    second = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    assert (second.deleted, second.remaining, second.stopped_by) == (3, 0, "")
    keys = list(Operation.objects.filter(task=task, purpose=OperationPurpose.CLEANUP).values_list("op_key", "status"))
    assert len(keys) == 4 and sum(status == OperationStatus.REJECTED for _, status in keys) == 1

    other = start(store, project="beta")
    lease = lease_acquire(task_id=other.pk, holder_kind="agent", holder_id="w")
    lease = run_steps(task_id=other.pk, lease=lease, connector=ObjectStoreConnector(store.url)).lease
    store.fault("permission_revoked", times=9, action="delete")
    reports = [
        cleanup_temp_resources(task_id=other.pk, lease=lease, connector=ObjectStoreConnector(store.url))
        for _ in range(4)
    ]
    # Each run stops at the first temp resource every delete was refused for; that one is then stuck, not retried.
    assert [(r.deleted, r.remaining, r.stopped_by) for r in reports] == [
        (0, 2, "needs_person"),
        (0, 1, "needs_person"),
        (0, 0, "needs_person"),
        (0, 0, ""),
    ]
    sent = Operation.objects.filter(task=other, purpose=OperationPurpose.CLEANUP)
    assert sent.count() == 9 and set(sent.values_list("status", flat=True)) == {OperationStatus.REJECTED}
    assert TempResource.objects.filter(task=other, status=TempResourceStatus.STUCK).count() == 3
    assert Event.objects.filter(task=other, type="cleanup_needs_person").count() == 3
    lease_release(lease=lease)
    assert other.pk not in set(tasks_needing_work().values_list("pk", flat=True))  # no wake-up loop
    assert find_problems(Task.objects.get(pk=other.pk)) == []


class _LookupsFail:
    """The store's answers to lookups are lost: an operation stays unknown until a person settles it."""

    def __init__(self, inner: ObjectStoreConnector) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def lookup(self, op_key: str) -> Outcome:
        return Failed(FailureClass.CONNECTION_INTERRUPTED, "lookup lost")


def test_a_compensation_chosen_by_a_person_is_sent_once_under_its_own_op_key_and_kept_as_evidence(store) -> None:
    task = start(store)
    store.fault("accept_then_drop", times=1, action="switch_reference")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    report = run_steps(task_id=task.pk, lease=lease, connector=_LookupsFail(ObjectStoreConnector(store.url)))
    assert report.stopped_by == "remote_unreachable"
    lease_release(lease=report.lease)
    switch = Operation.objects.get(task=task, action="store.switch_reference")
    assert switch.status == OperationStatus.UNKNOWN
    person = make_person("olga", "admin")
    claim = takeover_claim(actor=person, task_id=task.pk)
    assert claim.lease is not None
    operation_settle_by_hand(
        actor=person,
        task_id=task.pk,
        op_key=switch.op_key,
        expected_version=Task.objects.get(pk=task.pk).version,
        resolution="compensate",
        receipt=Committed(remote_id="ref:projects/acme", remote_version="7", count=1),
        note="the switch went through; point the reference back",
    )
    takeover_submit(
        actor=person,
        lease=claim.lease,
        based_on_version=Task.objects.get(pk=task.pk).version,
        decision="resume_agent",
        note="agent: send the compensation",
    )
    wake = run_task_once(task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url))
    compensation = Operation.objects.get(task=task, purpose=OperationPurpose.COMPENSATION)
    assert compensation.status == OperationStatus.COMMITTED, wake.summary
    assert compensation.compensates_id == switch.pk and compensation.op_key != switch.op_key
    assert Receipt.objects.filter(operation=compensation).exists()
    assert Receipt.objects.filter(operation=switch).exists()  # both happened: both receipts stay
    stats = store.stats()["by_action"]
    assert stats["switch_reference"] == 1 and stats["restore_reference"] == 1
    assert store.control("/_state")["references"]["projects/acme"]["target"] == ""  # pointed back
    task.refresh_from_db()
    assert (task.status, task.status_reason) == (TaskStatus.PAUSED, "needs_replan"), task.status_detail
    # Waking it again sends nothing more: a compensation is never retried by the system.
    run_task_once(task_id=task.pk, holder_id="w3", connector=ObjectStoreConnector(store.url))
    assert store.stats()["by_action"]["restore_reference"] == 1
    assert find_problems(task) == []


def test_a_wake_up_asks_again_for_the_newest_receipts_only(store) -> None:
    """A fan-out's frontier is every batch done so far: a wake-up asks the remote again for the newest
    ``RECHECK_MAX`` of them, not thousands (which would outlast its lease before its first write, for ever)."""
    from tasks.engine.facts import RECHECK_MAX, latest_receipts

    task = start(store, objects=RECHECK_MAX + 5, max_batch=1)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url), max_steps=RECHECK_MAX + 4)
    copies = Operation.objects.filter(
        task=task, node__key__startswith="copy-batch-", status=OperationStatus.COMMITTED, purpose="effect"
    ).order_by("pk")
    assert copies.count() > RECHECK_MAX  # a frontier larger than the bound
    asked = latest_receipts(task.pk)
    assert [op.pk for op in asked] == [op.pk for op in copies][-RECHECK_MAX:]
