"""Bulk operations, as services: the dry run counts what the run then does, task by task, each
change through its own service (its event and audit row), a task that moved since the preview is skipped and
listed and nothing is written to it, a task the person may not operate is never touched even when its id is
posted, and a redelivered job changes nothing twice."""

import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from guardian.shortcuts import assign_perm

import tasks.people.bulk
from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import verify_audit
from leases.models import Lease
from leases.services import lease_open, lease_release
from reference.demo import migration_plan
from tasks.access.permissions import PermissionDenied
from tasks.access.permits import permits, permits_known
from tasks.core.errors import VersionConflict
from tasks.core.lifecycle import NEEDS, PERMITS, Actor, FailureClass, Need, TaskStatus, permitted, task_ended
from tasks.core.outcomes import Failed
from tasks.engine.events import find_log_problem
from tasks.engine.plans import task_create
from tasks.jobs import apply_bulk_run, drive_task
from tasks.models import BulkItemStatus, BulkRun, BulkRunItem, Event, Task
from tasks.people.bulk import (
    CHANGE_OF,
    ENDED,
    MAX_TASKS,
    NO_PERMISSION,
    BulkRefused,
    Facts,
    Seen,
    bulk_preview,
    bulk_run_apply,
    bulk_run_create,
    bulk_run_progress,
    verdict,
)
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import takeover_claim, takeover_submit
from tasks.reads.queries import TaskFilter
from tests.conftest import chain_plan, person
from tests.simulator_fixture import Simulator
from tests.steps import record, send
from tests.test_permits import set_status
from tests.test_races_postgres import run_threads
from tests.workers import celery_worker

pytestmark = pytest.mark.django_db

PROJECT = "outage"
OPERATE = "tasks.operate_task"
REASON = "the store's outage is over, resume them"
ALL = TaskFilter(project=PROJECT)


def fresh(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def paused(
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    title: str = "paused",
    failure: FailureClass = FailureClass.PERMISSION_REVOKED,
) -> Task:
    """Paused (permission_revoked by default) by a refused call, its agent gone: what an outage leaves behind."""
    task = make_task(chain_plan("a", "b"), project=PROJECT, title=title)
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(failure, "refused by the store"), lease)
    lease_release(lease=lease)
    return fresh(task)


def task_state(task: Task) -> tuple[Any, ...]:
    """Everything a bulk change could write to one task: its row, its events, its audit rows, its leases."""
    row = Task.objects.filter(pk=task.pk).values().get()
    return (
        row,
        list(Event.objects.filter(task=task).values_list("seq", "type")),
        list(AuditEvent.objects.filter(task_id=task.pk).values_list("seq", "action")),
        list(Lease.objects.filter(task=task).values_list("epoch", "holder_id", "released_at")),
    )


def seen_of(preview: Any, *, everything: bool = False) -> list[Seen]:
    rows = preview.rows if everything else preview.changing
    return [Seen(r.facts.task_id, r.facts.version, r.facts.epoch) for r in rows]


@pytest.fixture
def admin() -> Principal:
    return person("ada", "admin")


@pytest.fixture
def mixed(make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal) -> dict[str, Task]:
    """One task of every kind the bulk rules tell apart."""
    tasks = {
        "paused": paused(make_task, agent_lease, "p1"),
        "paused2": paused(make_task, agent_lease, "p2"),
        "pending": make_task(chain_plan("a"), project=PROJECT, title="pending"),
        "agent_holds_paused": paused(make_task, agent_lease, "p3"),
        "cancelled": paused(make_task, agent_lease, "p4"),
        "mine": paused(make_task, agent_lease, "p5"),
        "others": paused(make_task, agent_lease, "p6"),
        "needs_replan": paused(make_task, agent_lease, "p7", FailureClass.INVALID_PARAMS),
        "elsewhere": make_task(chain_plan("a"), project="other", title="not in the filter"),
    }
    agent_lease(tasks["agent_holds_paused"], holder="agent-9")
    task_request_cancel(actor=admin, task_id=tasks["cancelled"].pk, reason="no longer wanted by anyone")
    assert takeover_claim(actor=admin, task_id=tasks["mine"].pk).granted
    bob = person("bob", "admin")
    assert takeover_claim(actor=bob, task_id=tasks["others"].pk).granted
    return {k: fresh(t) for k, t in tasks.items()}


@pytest.mark.parametrize("operation", ["resume", "cancel", "request_takeover", "release"])
def test_the_dry_run_counts_what_the_run_then_does_task_by_task(
    operation: str, mixed: dict[str, Task], admin: Principal
) -> None:
    preview = bulk_preview(actor=admin, operation=operation, task_filter=ALL)
    assert {r.task.pk for r in preview.rows} == {t.pk for k, t in mixed.items() if k != "elsewhere"}
    predicted = {r.task.pk: r.verdict for r in preview.rows}
    # Every task of the preview, the skipped ones too: the run asks the same rule of each.
    run = bulk_run_create(actor=admin, operation=operation, reason=REASON, seen=seen_of(preview, everything=True))
    bulk_run_apply(run_id=run.pk)
    items = {i.task_id: i for i in BulkRunItem.objects.filter(run=run)}
    for task_id, judged in predicted.items():
        item = items[task_id]
        assert (item.status == BulkItemStatus.DONE) == judged.changes, (task_id, judged, item.detail)
        assert item.detail == judged.sentence, (task_id, item.detail)
    done = Counter(i.status for i in items.values())
    assert done[BulkItemStatus.DONE] == len(preview.changing) > 0
    assert done[BulkItemStatus.FAILED] == 0


def test_resume_hands_each_task_back_through_claim_and_submit_with_its_own_events_and_audit_rows(
    mixed: dict[str, Task], admin: Principal
) -> None:
    preview = bulk_preview(actor=admin, operation="resume", task_filter=ALL)
    assert preview.counts == Counter(
        {"resumed": 3, "not_waiting": 1, "agent_holds": 1, "ended": 1, "person_holds": 1, "paused_needs_replan": 1}
    )
    run = bulk_run_create(actor=admin, operation="resume", reason=REASON, seen=seen_of(preview))
    bulk_run_apply(run_id=run.pk)
    for key in ("paused", "paused2", "mine"):
        task = fresh(mixed[key])
        assert task.status == "pending"
        assert task.inputs_recheck_required == bool(task.input_refs)
        types = list(Event.objects.filter(task=task, seq__gt=mixed[key].version).values_list("type", flat=True))
        assert types == (
            ["takeover_result_submitted"] if key == "mine" else ["takeover_granted", "takeover_result_submitted"]
        )
        assert AuditEvent.objects.filter(task_id=task.pk, action="takeover_result_submitted").count() == 1
        assert lease_open(task.pk) is None
    for key in ("pending", "agent_holds_paused", "cancelled", "others", "needs_replan"):
        assert fresh(mixed[key]).version == mixed[key].version


def test_a_task_that_moved_since_the_preview_is_skipped_and_listed_and_nothing_is_written_to_it(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal
) -> None:
    still, moved = paused(make_task, agent_lease), paused(make_task, agent_lease)
    preview = bulk_preview(actor=admin, operation="cancel", task_filter=ALL)
    assert len(preview.changing) == 2
    takeover_claim(actor=person("bob", "admin"), task_id=moved.pk)  # moves it: version + 1
    before = task_state(moved)
    run = bulk_run_create(actor=admin, operation="cancel", reason=REASON, seen=seen_of(preview))
    bulk_run_apply(run_id=run.pk)
    assert task_state(moved) == before
    assert fresh(still).cancel_requested_at is not None
    item = BulkRunItem.objects.get(run=run, task_id=moved.pk)
    assert item.status == BulkItemStatus.SKIPPED
    assert "Changed since the preview" in item.detail
    progress = bulk_run_progress(actor=admin, run_id=run.pk)
    assert progress is not None and progress.finished
    assert progress.counts == {"pending": 0, "done": 1, "skipped": 1, "failed": 0}


def test_a_lease_taken_since_the_preview_without_a_new_version_is_skipped_too(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal
) -> None:
    task = paused(make_task, agent_lease)
    preview = bulk_preview(actor=admin, operation="resume", task_filter=ALL)
    agent_lease(task)  # a lease grant writes no task version
    before = task_state(task)
    run = bulk_run_create(actor=admin, operation="resume", reason=REASON, seen=seen_of(preview))
    bulk_run_apply(run_id=run.pk)
    assert task_state(task) == before
    assert "lease changed" in BulkRunItem.objects.get(run=run).detail


def test_a_task_the_person_may_not_operate_is_never_changed_even_when_its_id_is_posted(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    granted, other = paused(make_task, agent_lease), paused(make_task, agent_lease)
    ann = person("ann", "operator")
    assign_perm(OPERATE, ann.user, granted)
    preview = bulk_preview(actor=ann, operation="cancel", task_filter=ALL)
    assert [r.task.pk for r in preview.rows] == [granted.pk]  # the other is not even shown
    before = task_state(other)
    posted = [*seen_of(preview), Seen(other.pk, other.version, None), Seen(999_999, 1, None)]
    run = bulk_run_create(actor=ann, operation="cancel", reason=REASON, seen=posted)
    bulk_run_apply(run_id=run.pk)
    assert task_state(other) == before
    items = {i.task_id: i for i in BulkRunItem.objects.filter(run=run)}
    assert items[granted.pk].status == BulkItemStatus.DONE
    assert items[other.pk].status == items[999_999].status == BulkItemStatus.SKIPPED
    assert items[other.pk].detail == items[999_999].detail  # an unknown id and a forbidden one read the same


def test_an_operator_whose_role_is_revoked_before_the_run_changes_nothing(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = paused(make_task, agent_lease)
    ann = person("ann", "operator")
    assign_perm(OPERATE, ann.user, task)
    run = bulk_run_create(
        actor=ann,
        operation="cancel",
        reason=REASON,
        seen=seen_of(bulk_preview(actor=ann, operation="cancel", task_filter=ALL)),
    )
    ann.user.groups.clear()
    before = task_state(task)
    bulk_run_apply(run_id=run.pk)
    assert task_state(task) == before
    assert BulkRunItem.objects.get(run=run).status == BulkItemStatus.SKIPPED


def test_an_auditor_and_an_outsider_may_neither_preview_nor_run(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = paused(make_task, agent_lease)
    for who in (person("aud", "auditor"), person("out")):
        with pytest.raises(PermissionDenied):
            bulk_preview(actor=who, operation="cancel", task_filter=ALL)
        with pytest.raises(PermissionDenied):
            bulk_run_create(actor=who, operation="cancel", reason=REASON, seen=[Seen(task.pk, task.version, None)])


def test_a_run_needs_a_reason_a_known_operation_and_at_most_the_cap(admin: Principal) -> None:
    one = [Seen(1, 1, None)]
    with pytest.raises(BulkRefused):
        bulk_run_create(actor=admin, operation="cancel", reason="short", seen=one)
    with pytest.raises(BulkRefused):
        bulk_run_create(actor=admin, operation="delete_everything", reason=REASON, seen=one)
    with pytest.raises(BulkRefused):
        bulk_run_create(actor=admin, operation="cancel", reason=REASON, seen=[])
    with pytest.raises(BulkRefused):
        bulk_run_create(
            actor=admin, operation="cancel", reason=REASON, seen=[Seen(i, 1, None) for i in range(MAX_TASKS + 1)]
        )
    assert not BulkRunItem.objects.exists()


def test_a_run_is_audited_and_its_job_is_enqueued_only_on_commit(
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    admin: Principal,
    django_capture_on_commit_callbacks: Any,
) -> None:
    task = paused(make_task, agent_lease)
    with django_capture_on_commit_callbacks() as callbacks:
        run = bulk_run_create(actor=admin, operation="cancel", reason=REASON, seen=[Seen(task.pk, task.version, None)])
    assert len(callbacks) == 1
    confirmed = AuditEvent.objects.get(action="bulk_run_confirmed")
    assert confirmed.details["run"] == run.pk and confirmed.details["tasks"] == [task.pk]


@override_settings(CELERY_TASK_ALWAYS_EAGER=True)
def test_the_celery_job_applies_the_run_and_a_redelivery_changes_nothing_twice(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal
) -> None:
    task = paused(make_task, agent_lease)
    run = bulk_run_create(actor=admin, operation="cancel", reason=REASON, seen=[Seen(task.pk, task.version, None)])
    assert apply_bulk_run.apply(args=(run.pk,)).get() == f"bulk run {run.pk}: done"
    after = task_state(task)
    BulkRunItem.objects.filter(run=run).update(status=BulkItemStatus.PENDING)  # as if the first never finished
    apply_bulk_run.apply(args=(run.pk,))
    assert task_state(task) == after  # the version moved: the second attempt wrote nothing to the task
    assert BulkRunItem.objects.get(run=run).status == BulkItemStatus.SKIPPED
    assert AuditEvent.objects.filter(task_id=task.pk, action="cancel_requested").count() == 1


def test_request_takeover_grants_a_free_task_and_reserves_an_agent_held_one(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal
) -> None:
    free, held = paused(make_task, agent_lease), paused(make_task, agent_lease)
    agent_lease(held, holder="agent-7")
    preview = bulk_preview(actor=admin, operation="request_takeover", task_filter=ALL)
    assert preview.counts == Counter({"taken_over": 1, "takeover_requested": 1})
    run = bulk_run_create(actor=admin, operation="request_takeover", reason=REASON, seen=seen_of(preview))
    bulk_run_apply(run_id=run.pk)
    assert fresh(free).status == "human"
    assert Event.objects.filter(task=held, type="takeover_requested").count() == 1
    release = bulk_preview(actor=admin, operation="release", task_filter=ALL)
    assert release.counts == Counter({"released": 1, "not_yours": 1})
    run = bulk_run_create(actor=admin, operation="release", reason=REASON, seen=seen_of(release))
    bulk_run_apply(run_id=run.pk)
    assert lease_open(free.pk) is None
    assert AuditEvent.objects.filter(task_id=free.pk, action="takeover_released").count() == 1


def test_the_rules_are_a_pure_table() -> None:
    from tasks.people.bulk import Facts

    def facts(**kw: Any) -> Facts:
        base: dict[str, Any] = {
            "task_id": 1,
            "version": 3,
            "status": "paused",
            "status_reason": "permission_revoked",
            "cancel_requested": False,
            "operable": True,
            "epoch": None,
            "lease_kind": None,
            "lease_holder": None,
            "lease_live": False,
            "reserved_for": None,
        }
        return Facts(**(base | kw))

    assert verdict("resume", "ada", facts()).code == "resumed"
    assert verdict("resume", "ada", facts(operable=False)).code == "no_permission"
    assert verdict("resume", "ada", None).code == "no_permission"
    assert verdict("resume", "ada", facts(status="running")).code == "not_waiting"
    assert verdict("resume", "ada", facts(status="completed")).code == "ended"
    assert verdict("resume", "ada", facts(status_reason="version_conflict")).code == "resumed"
    for reason in ("needs_replan", "input_changed", "budget_exhausted", "unprovable"):
        assert verdict("resume", "ada", facts(status_reason=reason)).code == f"paused_{reason}"
    assert verdict("resume", "ada", facts(status="human", status_reason="")).code == "resumed"
    lapsed = {"epoch": 2, "lease_kind": "agent", "lease_holder": "a", "lease_live": False}
    assert verdict("resume", "ada", facts(**lapsed)).code == "resumed"
    assert verdict("resume", "ada", facts(**(lapsed | {"lease_live": True}))).code == "agent_holds"
    assert verdict("request_takeover", "ada", facts(reserved_for="ada")).code == "you_wait"
    assert verdict("request_takeover", "ada", facts(reserved_for="bob")).code == "person_waits"
    mine = {"epoch": 2, "lease_kind": "operator", "lease_holder": "ada"}
    assert verdict("release", "ada", facts(**mine, lease_live=False)).code == "released"
    assert verdict("release", "bob", facts(**mine, lease_live=True)).code == "not_yours"
    assert verdict("cancel", "ada", facts(cancel_requested=True)).code == "cancel_recorded"


def test_the_preview_takes_the_queues_attention_filter(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal
) -> None:
    waiting = paused(make_task, agent_lease)
    make_task(chain_plan("a"), project=PROJECT, title="needs nobody")
    preview = bulk_preview(actor=admin, operation="cancel", task_filter=TaskFilter(project=PROJECT, attention="any"))
    assert [r.task.pk for r in preview.rows] == [waiting.pk]


def test_resume_renews_ones_own_lease_in_its_grace_and_hands_the_task_back(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal, clock: Any
) -> None:
    task = paused(make_task, agent_lease)
    assert takeover_claim(actor=admin, task_id=task.pk).granted
    clock.advance(timedelta(seconds=125))  # past the 120 s operator lease, inside its 15 s grace
    preview = bulk_preview(actor=admin, operation="resume", task_filter=ALL)
    assert preview.counts == Counter({"resumed": 1})
    run = bulk_run_create(actor=admin, operation="resume", reason=REASON, seen=seen_of(preview))
    bulk_run_apply(run_id=run.pk)
    assert BulkRunItem.objects.get(run=run).status == BulkItemStatus.DONE
    assert fresh(task).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_applies_a_run_enqueued_on_commit(
    store: Simulator, monkeypatch: pytest.MonkeyPatch, admin_queue: str
) -> None:
    ada = person("ada", "admin")
    made = [
        task_create(kind="migrate_project", title=f"Migrate {p}", plan=migration_plan(), created_by="test", project=p)
        for p in ("acme", "globex")
    ]
    run = bulk_run_create(
        actor=ada, operation="cancel", reason=REASON, seen=[Seen(t.pk, t.version, None) for t in made]
    )  # its job goes to the worker once this commits
    deadline = time.monotonic() + 60
    while BulkRun.objects.get(pk=run.pk).status != "done":
        assert time.monotonic() < deadline, "the worker did not finish the run in 60 s"
        time.sleep(0.2)
    assert set(BulkRunItem.objects.filter(run=run).values_list("status", flat=True)) == {BulkItemStatus.DONE}
    assert all(Task.objects.get(pk=t.pk).cancel_requested_at is not None for t in made)


@pytest.fixture
def admin_queue(store: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real Celery worker process on a queue of this test's own; every job the services enqueue goes there."""
    with celery_worker(store.url) as name:
        for job in (apply_bulk_run, drive_task):
            monkeypatch.setattr(job, "delay", lambda *a, _job=job, **kw: _job.apply_async(a, kw, queue=name))
        yield name


def test_a_refusal_after_the_claim_rolls_back_everything_written_for_that_task(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], admin: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = paused(make_task, agent_lease), paused(make_task, agent_lease)
    preview = bulk_preview(actor=admin, operation="resume", task_filter=ALL)
    before = task_state(first)
    real_submit = takeover_submit

    def refuse_the_first(**kwargs: Any) -> Task:
        if kwargs["lease"].task_id == first.pk:
            raise VersionConflict("moved while being resumed")
        return real_submit(**kwargs)

    monkeypatch.setattr(tasks.people.bulk, "takeover_submit", refuse_the_first)
    run = bulk_run_create(actor=admin, operation="resume", reason=REASON, seen=seen_of(preview))
    bulk_run_apply(run_id=run.pk)
    assert task_state(first) == before  # its claim (lease, event, audit row) went with the refusal
    assert lease_open(first.pk) is None
    item = BulkRunItem.objects.get(run=run, task_id=first.pk)
    assert item.status == BulkItemStatus.SKIPPED and "version_conflict" in item.detail
    assert fresh(second).status == "pending"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL for real concurrent jobs")
def test_two_jobs_racing_on_one_run_resume_each_task_once(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicated message: two workers apply the same run at once, item by item, each its own connection. Each
    task is claimed and handed back exactly once, each item finished once, every log still chains."""
    monkeypatch.setattr(drive_task, "delay", lambda *a, **kw: None)  # the agents' wake-ups are not this test's
    monkeypatch.setattr(apply_bulk_run, "delay", lambda *a, **kw: None)
    admin = person("ada", "admin")
    made = [paused(make_task, agent_lease, f"t{i}") for i in range(12)]
    preview = bulk_preview(actor=admin, operation="resume", task_filter=ALL)
    run = bulk_run_create(actor=admin, operation="resume", reason=REASON, seen=seen_of(preview))

    real_finish = tasks.people.bulk._finish
    attempts: list[str] = []

    def finish(item: BulkRunItem, status: str, detail: str) -> None:
        attempts.append(status)
        real_finish(item, status, detail)

    monkeypatch.setattr(tasks.people.bulk, "_finish", finish)

    def work(index: int, barrier: Any) -> None:
        barrier.wait()
        bulk_run_apply(run_id=run.pk)

    run_threads(2, work)
    print(f"two jobs on {len(made)} tasks: {len(attempts)} item outcomes, {Counter(attempts)}")
    items = list(BulkRunItem.objects.filter(run=run))
    assert Counter(i.status for i in items)[BulkItemStatus.DONE] == len(made)
    for task in made:
        assert fresh(task).status == "pending"
        assert Event.objects.filter(task=task, type="takeover_result_submitted").count() == 1
        assert AuditEvent.objects.filter(task_id=task.pk, action="takeover_result_submitted").count() == 1
        assert find_log_problem(fresh(task)) is None
    assert verify_audit().problem is None


# -- one permit table: the preview asks it, and applying agrees ---------------------------------------------------


def facts_of(**kw: Any) -> Facts:
    """A free task's facts, operable by the person, as the permit table reads them (the status set consistently)."""
    status = kw.get("status", "paused")
    base: dict[str, Any] = {
        "task_id": 1,
        "version": 3,
        "status": status,
        "status_reason": "permission_revoked" if status == "paused" else "",
        "cancel_requested": status in ("stopping", "stopped_pending", "stopped"),
        "operable": True,
        "epoch": None,
        "lease_kind": None,
        "lease_holder": None,
        "lease_live": False,
        "reserved_for": None,
    }
    return Facts(**(base | kw))


@pytest.mark.parametrize("operation", ["cancel", "request_takeover", "resume"])
def test_the_preview_asks_the_permit_table_in_every_status_and_keeps_no_copy_of_it(
    operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    change = CHANGE_OF[operation]
    assert change is not None
    ada = Principal(kind="user", id="ada")
    for status in TaskStatus:
        judged = verdict(operation, "ada", facts_of(status=status.value))
        refused = permits_known(ada, change, task_id=1, status=status.value, operable=True)
        if refused is not None:
            assert not judged.changes, (status, judged)
        if task_ended(status):
            assert judged == ENDED, (status, judged)
    # The table changed changes the preview: a status taken out is skipped by the table's refusal, by name.
    monkeypatch.setitem(PERMITS, (change, Actor.PERSON), permitted(change, Actor.PERSON) - {TaskStatus.PAUSED})
    judged = verdict(operation, "ada", facts_of(status="paused"))
    assert (judged.changes, judged.code) == (False, "task_not_runnable")
    # And who the table needs: made an admin's change, an operator granted the task is no longer enough.
    monkeypatch.setitem(NEEDS, (change, Actor.PERSON), Need.ADMIN)
    assert verdict(operation, "ada", facts_of(status="pending")) == NO_PERMISSION


@pytest.mark.parametrize("operation", ["cancel", "request_takeover"])
def test_in_every_status_the_preview_says_what_applying_then_does(
    operation: str, make_task: Callable[..., Task], admin: Principal
) -> None:
    change = CHANGE_OF[operation]
    assert change is not None
    made: dict[str, Task] = {}
    for status in TaskStatus:
        task = make_task(chain_plan("a"), project=PROJECT, title=status.value)
        set_status(task, status.value)
        made[status.value] = fresh(task)
    preview = bulk_preview(actor=admin, operation=operation, task_filter=ALL)
    predicted = {r.task.pk: r.verdict for r in preview.rows}
    assert set(predicted) == {t.pk for t in made.values()}
    # The preview changes a task exactly where the table allows the change (a cancel already recorded is left alone).
    allowed = {
        status
        for status, task in made.items()
        if permits(admin, change, task) is None and not (operation == "cancel" and task.cancel_requested_at)
    }
    assert {status for status, task in made.items() if predicted[task.pk].changes} == allowed
    run = bulk_run_create(actor=admin, operation=operation, reason=REASON, seen=seen_of(preview, everything=True))
    bulk_run_apply(run_id=run.pk)
    for item in BulkRunItem.objects.filter(run=run):
        judged = predicted[item.task_id]
        assert (item.status == BulkItemStatus.DONE) == judged.changes, (item.task_id, judged, item.detail)
        assert item.status != BulkItemStatus.FAILED, item.detail
