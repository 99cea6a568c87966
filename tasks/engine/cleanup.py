"""Temp resources — what a task's effects left behind (a staging copy, …) — deleted once the task has ended.

Each delete is an operation of its own (``purpose=cleanup``, op key ``rk-<task uid>-cleanup-<temp id>-<n>``): the
intent is registered before the call, the call goes through ``connector.delete(op_key, locator)``, and the temp
resource is marked deleted only together with the cleanup receipt. A crash anywhere is finished by the next run: a
dispatched or unknown cleanup is first looked up by its op key, never sent again blindly. Only the task's own temp
resources are ever named, one exact locator at a time; receipts of the effects are evidence and are never touched.
A cleanup the remote refuses definitely ``MAX_CLEANUP_ATTEMPTS`` times (each under its own op key) stops: the temp
resource is marked ``stuck`` (an event records it) and waits for a person; no scan wakes the task for it again. A
temporary refusal (``dependency_unavailable``) spends no attempt: the temp resource backs off (``not_before``, the
node retry's backoff of ``tasks.core.failures.backoff`` on the database clock) and the next delete waits for it.

Who sends the deletes: a server worker (``cleanup_temp_resources``, from the runner's wake-up) for a kind with a
connector here, or the task's agent over the API (``cleanup_work`` tells it, ``cleanup_record`` records its answer).
``cleanup_next`` is the one rule both follow.

When: the permit table allows cleanup (``PERMITS``, change ``cleanup``) once the task completed, failed or stopped —
not while it runs, and never once it is quarantined. A quarantined task has ended (nothing runs on it again), but its
log and its projection disagree, so its temp resource rows — the locators a delete would name — cannot be trusted to
be its own, and a delete cannot be undone: cleanup never touches another task's resources. Its temp resources stay
as recorded for the person who investigates it: none is due (``temp_resources_due``), the recovery scan does not
wake the task for them, a cleanup operation left open stays open (the compare-and-set refuses to record its
outcome), and a stuck one cannot be reset.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.db.models import QuerySet

from audit.hygiene import digest_of
from audit.principals import Principal
from audit.reasons import MIN_REASON
from leases import clock
from leases.models import Lease
from leases.services import LeaseRef
from tasks.access.permits import permits
from tasks.core import opkeys
from tasks.core.errors import InvalidTransition, TaskNotFound, VersionConflict
from tasks.core.failures import backoff
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    Actor,
    ChangeKind,
    FailureClass,
    OperationStatus,
    TempResourceStatus,
    permitted,
)
from tasks.core.outcomes import Accepted, Committed, Failed, Fenced, NotFound, Outcome, Unprovable, operation_after
from tasks.decide.change import AtCommit, Change
from tasks.decide.receipts import receipt_of, receipt_summary
from tasks.engine.cas import Audit, audited_compare_and_set, compare_and_set
from tasks.engine.connectors import Connector
from tasks.engine.failpoints import failpoint
from tasks.engine.verification import temp_locator_verified
from tasks.models import LoggedEvent, Operation, OperationPurpose, Task, TempResource
from tasks.rows import get_task

# The task statuses in which its temp resources are deleted: the permit table's, for the worker's cleanup.
CLEANABLE = tuple(sorted(s.value for s in permitted(ChangeKind.CLEANUP, Actor.AGENT)))
MAX_CLEANUP_ATTEMPTS = 3
MIN_RESET_REASON = MIN_REASON  # audit.reasons: the one minimum of a person's reason
RESET_EVENT = "temp_resource_reset"
_UNDONE = (TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value)


@dataclass(frozen=True)
class CleanupReport:
    deleted: int
    remaining: int
    stopped_by: str = ""  # remote_unreachable, remote_unavailable, unprovable or needs_person
    wake_at: datetime | None = None  # a temporary refusal's backoff: ask again then (database clock)


@dataclass(frozen=True)
class CleanupWork:
    """The next step of one temp resource's cleanup, decided by ``cleanup_next`` (the one rule, for a server worker
    and for an agent over the API): ``delete`` — send the delete of ``locator`` under ``op_key`` (registered and
    marked sent before this answer); ``lookup`` — ask the remote what became of ``op_key`` (a delete may have been
    sent: never send it again blindly); ``wait`` — the remote refused for now, ask again at ``until``."""

    temp: TempResource
    ask: Literal["delete", "lookup", "wait"]
    op_key: str = ""
    until: datetime | None = None

    @property
    def locator(self) -> str:
        return self.temp.locator


DUE_CHUNK = 20


def temp_resources_due(task: Task) -> QuerySet[TempResource]:
    """The temp resources of ``task`` still to delete; none while the task may still need them, and none of a
    quarantined task (the module's docstring says why)."""
    if task.status not in CLEANABLE:
        return TempResource.objects.none()
    return TempResource.objects.filter(task=task, status__in=_UNDONE).order_by("pk")


def cleanup_temp_resources(*, task_id: int, lease: Lease, connector: Connector) -> CleanupReport:
    """Delete every temp resource of an ended task, each as its own operation. Idempotent; safe to re-run after a
    crash at any point; stops at the first answer that leaves an outcome unknown (the next run asks again) and at
    the first temporary refusal (``wake_at``: when its backoff ends, the next run asks again)."""
    deleted, stopped_by, wake_at = 0, "", None
    for temp in list(temp_resources_due(get_task(task_id))):
        result = _clean_one(temp, lease, connector)
        if isinstance(result, datetime):  # refused for now: the remote is asked again once the backoff ends
            stopped_by, wake_at = "remote_unavailable", result
            break
        if result != "deleted":
            stopped_by = result
            break
        deleted += 1
    return CleanupReport(deleted, temp_resources_due(get_task(task_id)).count(), stopped_by, wake_at)


def _clean_one(temp: TempResource, lease: Lease, connector: Connector) -> str | datetime:
    for _round in range(MAX_CLEANUP_ATTEMPTS * 2 + 2):
        work = cleanup_next(temp, lease)
        if work is None:
            return "needs_person"
        if work.ask == "wait":
            assert work.until is not None  # noqa: S101
            return work.until
        if work.ask == "delete":
            outcome = connector.delete(work.op_key, temp.locator)
            failpoint("mid_cleanup", task_id=temp.task_id)
        else:
            outcome = connector.lookup(work.op_key)
        op = _record(Operation.objects.get(op_key=work.op_key), temp, outcome, lease)
        if op.status == OperationStatus.COMMITTED:
            return "deleted"
        if op.status == OperationStatus.UNKNOWN:
            return "unprovable" if op.failure_class == "unprovable" else "remote_unreachable"
        temp = TempResource.objects.get(pk=temp.pk)
    return "needs_person"


def cleanup_next(temp: TempResource, lease: LeaseRef, *, expected_version: int | None = None) -> CleanupWork | None:
    """The next step of ``temp``'s cleanup, writing what must be written before it (under ``lease``): a new delete
    registered (event ``cleanup_registered``) and marked sent (``cleanup_dispatched``), or the temp resource marked
    stuck once definite refusals used up its attempts (``cleanup_needs_person``: None, a person decides). A
    temporary refusal (``dependency_unavailable``) spends no attempt: the temp resource waits until its
    ``not_before`` (the node retry's backoff, on the database clock). ``expected_version``: the task version the
    caller read (an agent's If-Match); the first write is refused with VersionConflict if it moved."""
    temp = TempResource.objects.select_related("task").get(pk=temp.pk)
    op = temp.cleanup_operation
    if temp.not_before is not None and (op is None or op.status == OperationStatus.REJECTED):
        now = clock.now()
        if temp.not_before > now:
            return CleanupWork(temp, "wait", until=temp.not_before)
    if op is None or op.status == OperationStatus.REJECTED:
        spent = cleanup_attempts_spent(temp)
        if spent >= MAX_CLEANUP_ATTEMPTS * (1 + resets_of(temp)):
            _give_up(temp, spent, lease, expected_version)
            return None
        temp_locator_verified(temp)  # before a delete of it is registered: a refusal leaves nothing written
        op = _register(temp, cleanup_tries(temp), lease, expected_version)
        expected_version = None
    elif op.status == OperationStatus.INTENT:
        temp_locator_verified(temp)  # the row alone is not trusted with what gets deleted
    if op.status == OperationStatus.INTENT:
        op = _dispatch(op, lease, expected_version)
        return CleanupWork(temp, "delete", op.op_key)
    if op.status in OPEN_OPERATION_STATUSES:
        return CleanupWork(temp, "lookup", op.op_key)
    raise InvalidTransition(f"temp resource {temp.locator} is {temp.status} with its delete {op.status}")


def cleanup_work(*, task_id: int, lease: LeaseRef, expected_version: int | None = None) -> CleanupWork | None:
    """The next cleanup step of an ended task for its lease holder — an agent over the API, which sends the delete
    itself (docs/api.md, directive ``cleanup``): the first due temp resource's ``cleanup_next``. None once none is
    due (all deleted, stuck for a person, or the task is not one whose temp resources are deleted)."""
    # A few at a time, by id: the first due one has work, almost always (a finished 10,000-node task has 10,000).
    due, after = temp_resources_due(get_task(task_id)), 0
    while ids := list(due.filter(pk__gt=after).values_list("pk", flat=True)[:DUE_CHUNK]):
        for temp_id in ids:
            work = cleanup_next(TempResource(pk=temp_id), lease, expected_version=expected_version)
            if work is not None:
                return work
            expected_version = None  # it was marked stuck (a write): the next one is judged on the version that left
        after = ids[-1]
    return None


def cleanup_tries(temp: TempResource) -> int:
    """The delete operations registered for ``temp`` so far (each under its own op key)."""
    return _deletes_of(temp).count()


def cleanup_attempts_spent(temp: TempResource) -> int:
    """The attempts ``temp``'s cleanup has spent: its deletes the remote refused definitely. A temporary refusal
    (``dependency_unavailable``: the remote could not do it now) spends none — it only backs off."""
    rejected = _deletes_of(temp).filter(status=OperationStatus.REJECTED.value)
    return rejected.exclude(failure_class=FailureClass.DEPENDENCY_UNAVAILABLE.value).count()


def _deletes_of(temp: TempResource) -> QuerySet[Operation]:
    return Operation.objects.filter(task_id=temp.task_id, op_key__startswith=_key(temp, 0)[:-1])


def _unavailable_in_a_row(temp: TempResource, op: Operation) -> int:
    """How many of ``temp``'s deletes before ``op`` were refused for now (dependency_unavailable) in a row: with
    ``op``'s refusal, the backoff's attempt number, so a remote that stays down is asked later and later."""
    run = 0
    earlier = _deletes_of(temp).filter(pk__lt=op.pk).order_by("-pk")
    for status, failure in earlier.values_list("status", "failure_class"):
        if status != OperationStatus.REJECTED or failure != FailureClass.DEPENDENCY_UNAVAILABLE:
            break
        run += 1
    return run


def resets_of(temp: TempResource) -> int:
    """How many times a person made ``temp`` eligible for deletion again: each reset allows MAX_CLEANUP_ATTEMPTS
    more deletes (read from the log, which records every reset)."""
    return LoggedEvent.objects.filter(task_id=temp.task_id, type=RESET_EVENT, payload__data__temp_id=temp.pk).count()


def temp_resource_reset(
    *, actor: Principal, task_id: int, temp_id: int, expected_version: int, reason: str
) -> TempResource:
    """A person makes a stuck temp resource eligible for deletion again (after granting the permission back, or
    fixing the remote): it becomes active, the next wake-up deletes it under a new op key, and MAX_CLEANUP_ATTEMPTS
    more refusals make it stuck again. A compare-and-set on ``expected_version`` (event ``temp_resource_reset``),
    audited with the person's reason (at least MIN_RESET_REASON characters)."""
    task = get_task(task_id)
    refused = permits(actor, ChangeKind.CLEANUP, task)  # never while it runs, nor once it is quarantined
    if refused is not None:
        raise refused
    temp = TempResource.objects.filter(pk=temp_id, task_id=task_id).first()
    if temp is None:
        raise TaskNotFound(f"task {task_id} has no temp resource {temp_id}")
    if temp.status != TempResourceStatus.STUCK:
        raise InvalidTransition(f"temp resource {temp.locator} is {temp.status}, not stuck: nothing to reset")
    if len(reason.strip()) < MIN_RESET_REASON:
        raise InvalidTransition(f"a reset needs the reason (at least {MIN_RESET_REASON} characters): what changed?")
    tries = cleanup_attempts_spent(temp)

    def make_active(_task: Task, _now: datetime) -> None:
        moved = TempResource.objects.filter(pk=temp.pk, status=TempResourceStatus.STUCK.value).update(
            status=TempResourceStatus.ACTIVE.value, cleanup_operation=None, not_before=None
        )
        if moved != 1:  # rolls the whole change back
            raise VersionConflict(f"temp resource {temp.locator} changed meanwhile; look again")

    audited_compare_and_set(
        task_id,
        expected_version,
        Change(
            event=RESET_EVENT,
            kind=ChangeKind.CLEANUP,
            data={"temp": temp.locator, "temp_id": temp.pk, "by": str(actor), "attempts": tries},
        ),
        lease=None,
        actor=Actor.PERSON,
        audit=Audit(actor, RESET_EVENT, reason=reason, details={"temp": temp.locator, "attempts": tries}),
        before_event=make_active,
    )
    return TempResource.objects.get(pk=temp.pk)


def _give_up(temp: TempResource, tries: int, lease: LeaseRef, expected_version: int | None = None) -> None:
    """Every delete was refused: mark the temp resource stuck (an event says so) so that no scan wakes the task
    for it again; a person decides (delete it by hand, grant the permission back and reset it)."""
    task = get_task(temp.task_id)

    def mark_stuck(_task: Task, _now: datetime) -> None:
        TempResource.objects.filter(pk=temp.pk).update(status=TempResourceStatus.STUCK.value)

    change = Change(
        event="cleanup_needs_person", kind=ChangeKind.CLEANUP, data={"temp": temp.locator, "attempts": tries}
    )
    compare_and_set(task.pk, _version(task, expected_version), change, lease=lease, before_event=mark_stuck)


def _version(task: Task, expected_version: int | None) -> int:
    """The version a cleanup write is conditional on: the caller's (an agent's If-Match), else the one just read."""
    return task.version if expected_version is None else expected_version


def _key(temp: TempResource, tries: int) -> str:
    return opkeys.cleanup(temp.task.uid, temp.pk, tries)


def _register(temp: TempResource, tries: int, lease: LeaseRef, expected_version: int | None = None) -> Operation:
    request = {"action": "delete", "locator": temp.locator}
    task = get_task(temp.task_id)
    node_id = temp.node_id
    if node_id is None:  # every temp resource recorded from a receipt names its node
        raise ValueError(f"temp resource {temp.pk} names no node: it was not recorded by the protocol")

    def build(current: Task, now: datetime) -> Change:
        op = Operation(
            task=current,
            node_id=node_id,
            op_key=_key(temp, tries),
            action="delete",
            target=temp.locator[:300],
            request=request,
            request_digest=digest_of(request),
            registered_at=now,
            purpose=OperationPurpose.CLEANUP.value,
        )
        return Change(
            event="cleanup_registered",
            kind=ChangeKind.CLEANUP,
            operations=[(op, {"status": OperationStatus.INTENT.value})],
            data={"op_key": op.op_key, "temp": temp.locator},
        )

    def mark_cleaning(_task: Task, _now: datetime) -> None:
        op = Operation.objects.get(op_key=_key(temp, tries))
        TempResource.objects.filter(pk=temp.pk).update(
            status=TempResourceStatus.CLEANING.value, cleanup_operation=op, not_before=None
        )

    compare_and_set(task.pk, _version(task, expected_version), build, lease=lease, before_event=mark_cleaning)
    return Operation.objects.get(op_key=_key(temp, tries))


def _dispatch(op: Operation, lease: LeaseRef, expected_version: int | None = None) -> Operation:
    task = get_task(op.task_id)
    change = Change(
        event="cleanup_dispatched",
        kind=ChangeKind.CLEANUP,
        operations=[(op, {"status": OperationStatus.DISPATCHED.value, "dispatch_count": op.dispatch_count + 1})],
        data={"op_key": op.op_key},
    )
    compare_and_set(task.pk, _version(task, expected_version), change, lease=lease)
    return Operation.objects.get(pk=op.pk)


def cleanup_record(
    *, task_id: int, temp_id: int, op_key: str, outcome: Outcome, lease: LeaseRef, expected_version: int
) -> TempResource:
    """What the remote said of a temp resource's delete, reported by the agent that sent it (or looked it up) over
    the API, at the task version it read: recorded exactly as a server worker's answer is (``_record``). Refused,
    writing nothing, when the task has no such temp resource (TaskNotFound), ``op_key`` is not the delete in flight
    for it (InvalidTransition: a delete is never settled on another temp resource's key) or the task moved
    (VersionConflict); a permit or a lease that fails is the compare-and-set's refusal."""
    temp = TempResource.objects.select_related("task", "cleanup_operation").filter(pk=temp_id, task_id=task_id).first()
    if temp is None:
        raise TaskNotFound(f"task {task_id} has no temp resource {temp_id}", task_id=task_id)
    op = temp.cleanup_operation
    if op is None or op.op_key != op_key:
        raise InvalidTransition(
            f"{op_key} is not the delete in flight for temp resource {temp.locator}: nothing is recorded",
            op_key=op_key,
        )
    if op.status not in OPEN_OPERATION_STATUSES:
        raise InvalidTransition(f"the delete {op_key} is {op.status}: nothing to settle", op_key=op_key)
    _record(op, temp, outcome, lease, expected_version)
    return TempResource.objects.get(pk=temp.pk)


def _record(
    op: Operation, temp: TempResource, outcome: Outcome, lease: LeaseRef, expected_version: int | None = None
) -> Operation:
    """Record what the remote said of a delete. The operation's status is the one mapping's (``operation_after``,
    the same as every other operation's); a delete may always be sent again, a cancel recorded or not. A temporary
    refusal (``dependency_unavailable``) sets the temp resource's ``not_before``: the backoff of
    ``tasks.core.failures.backoff`` (the node retry's rule), counted in refusals in a row, on the database clock."""
    task = get_task(op.task_id)
    version = _version(task, expected_version)
    data: dict[str, Any] = {"op_key": op.op_key, "temp": temp.locator, "outcome": type(outcome).__name__.lower()}
    after = operation_after(outcome)
    fields: dict[str, Any] = after.fields()
    before_event = None
    if isinstance(outcome, Committed) and after.status == OperationStatus.COMMITTED:
        receipt = receipt_of(op, outcome)

        def save(_task: Task, now: datetime) -> None:
            receipt.received_at = now
            receipt.save(force_insert=True)
            TempResource.objects.filter(pk=temp.pk).update(
                status=TempResourceStatus.DELETED.value, cleanup_receipt=receipt, not_before=None
            )

        before_event = save
        event = "cleanup_committed"
        fields["remote_id"] = outcome.remote_id
        data["receipt"] = receipt_summary(receipt)
    elif isinstance(outcome, Accepted):
        event = "cleanup_accepted"
        fields["remote_id"] = outcome.remote_id
    elif isinstance(outcome, Failed) and after.status == OperationStatus.REJECTED:
        event = "cleanup_rejected"
        fields["failure_detail"] = outcome.detail[:500]
        if outcome.failure_class == FailureClass.DEPENDENCY_UNAVAILABLE:
            wait = backoff(
                now=task.updated_at, attempt=_unavailable_in_a_row(temp, op) + 1, seed=f"{task.uid}:{temp.pk}"
            )

            def back_off(_task: Task, now: datetime) -> None:
                TempResource.objects.filter(pk=temp.pk).update(not_before=now + wait.delay)

            before_event = back_off
            data |= {"not_before": AtCommit(wait.delay), "attempt_spent": False}
        else:
            data["attempt_spent"] = True
    elif isinstance(outcome, Fenced):
        event = "cleanup_fenced"  # the delete never took effect and never will: a definite refusal
        data["attempt_spent"] = True
    elif isinstance(outcome, NotFound):
        event = "cleanup_not_found"  # never happened: send again
    elif isinstance(outcome, Unprovable):
        event = "cleanup_unprovable"
    elif isinstance(outcome, Failed) and op.status == OperationStatus.UNKNOWN:
        return op  # the lookup itself failed: still unknown
    else:  # the connection dropped, or a Committed without a remote id (it proves nothing)
        event = "cleanup_unknown"
    if fields["status"] == op.status and len(fields) == 1:
        return op
    change = Change(event=event, kind=ChangeKind.CLEANUP, operations=[(op, fields)], data=data)
    compare_and_set(task.pk, version, change, lease=lease, before_event=before_event)
    return Operation.objects.get(pk=op.pk)
