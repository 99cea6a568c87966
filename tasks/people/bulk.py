"""Bulk operations on a filtered set of tasks: preview, confirm, apply one task at a time.

A person picks a named operation for the tasks a queue filter selects. ``bulk_preview`` is the dry run: for every
task it reads the facts the operation depends on and asks ``verdict`` — a pure function, the one place the bulk
rules live — whether it will change the task or skip it, and why. Whether the person may make the operation's change
in the task's status at all is not a bulk rule: ``verdict`` asks the permit table (tasks.access.permits), as the
service will when the run reaches the task; bulk's own rules only say what each operation applies to.
``bulk_run_create`` records the confirmed run: the tasks the preview said it would change, each with the version
(and lease epoch) seen then, audited, and enqueues the job on commit. ``bulk_run_apply`` (the job) takes the items
one by one; for each it reads the facts again, skips a task that moved since the preview (never forced), asks the
same ``verdict``, and makes the change through the existing service — cancel (tasks.people.cancel), request takeover
(tasks.people.takeover.takeover_claim), release (takeover_release), resume (takeover_claim then takeover_submit
``resume_agent``: the agent re-reads its inputs' versions before anything new starts) — which checks the permission
again and writes its own event and audit row. Each task is its own transaction: a refusal rolls back everything
written for that task and nothing else.
"""

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, OuterRef, QuerySet, Subquery

from audit.errors import Refused
from audit.principals import Principal
from audit.reasons import MIN_REASON
from audit.services import audit_append
from leases import clock
from leases.errors import LeaseError
from leases.models import HolderKind, Lease, LeaseReservation
from leases.services import lease_open
from leases.state import held_at
from tasks.access.permissions import (
    ADMIN,
    OPERATOR,
    PermissionDenied,
    can_operate,
    operable_condition,
    operate_denied,
    principal_roles,
    viewable_condition,
)
from tasks.access.permits import permits_known
from tasks.core.errors import TaskError
from tasks.core.lifecycle import ChangeKind, PauseReason, TaskStatus, task_ended
from tasks.engine.enqueue import enqueue_on_commit
from tasks.models import BulkItemStatus, BulkOperation, BulkRun, BulkRunItem, BulkRunStatus, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import takeover_claim, takeover_release, takeover_submit
from tasks.reads.queries import TaskFilter, filter_condition

MAX_TASKS = 500  # one run touches at most this many tasks: a wider filter is narrowed first
# What "resume" hands back to the agent: a task people hold or last held, or one paused for a person.
RESUMABLE = frozenset({TaskStatus.PAUSED.value, TaskStatus.HUMAN.value})
# Pauses the agent cannot get past by itself: handed back as they are, it would stop again at once (the plan, the
# inputs or the budget must change first; an unprovable operation must be settled by a person). takeover_submit
# would accept them; a bulk resume skips them and says what each needs instead.
NOT_RESUMABLE: dict[str, str] = {
    PauseReason.NEEDS_REPLAN: "It needs a new plan first (re-plan it from its takeover page).",
    PauseReason.INPUT_CHANGED: "Its inputs changed: it needs a new plan, or an approval, first.",
    PauseReason.BUDGET_EXHAUSTED: "Its attempt budget is spent: the agent would stop at once. Submit the step by "
    "hand, or re-plan it with a larger attempt_budget stated in the plan.",
    PauseReason.UNPROVABLE: "An operation of unprovable outcome must be settled by hand first.",
}
# The change of the permit table each operation makes first: a resume claims the task (and then decides, as its
# holder, in ``human``); a release gives a lease back and changes no task, so it needs only that the person may
# operate the task.
CHANGE_OF: dict[str, ChangeKind | None] = {
    BulkOperation.RESUME: ChangeKind.TAKEOVER,
    BulkOperation.CANCEL: ChangeKind.CANCEL,
    BulkOperation.REQUEST_TAKEOVER: ChangeKind.TAKEOVER,
    BulkOperation.RELEASE: None,
}
_LEASE_MATTERS = frozenset({BulkOperation.RESUME, BulkOperation.REQUEST_TAKEOVER, BulkOperation.RELEASE})


class BulkRefused(TaskError):
    """A bulk run that cannot be recorded: no task, too many, an unknown operation, no reason."""

    code = "bulk_refused"


@dataclass(frozen=True)
class Facts:
    """What a bulk rule reads of one task, at one moment."""

    task_id: int
    version: int
    status: str
    status_reason: str  # why it is paused ("" unless paused)
    cancel_requested: bool
    operable: bool  # tasks.access.permissions: the person may operate it
    epoch: int | None  # the open lease's epoch (live, in its grace, or lapsed but not yet closed)
    lease_kind: str | None  # the open lease's holder kind and id, whether it still binds or not
    lease_holder: str | None
    lease_live: bool  # held: live or in its grace; past both, the next acquire closes it (leases.state)
    reserved_for: str | None  # the operator waiting for the agent's lease to end

    @property
    def holder_kind(self) -> str | None:
        """Who holds the task now: the open lease's holder while it binds; None when free or lapsed."""
        return self.lease_kind if self.lease_live else None

    @property
    def holder_id(self) -> str | None:
        return self.lease_holder if self.lease_live else None


@dataclass(frozen=True)
class Verdict:
    changes: bool
    code: str  # stable: what tests and the preview's groups compare
    sentence: str  # what will happen to the task, or why it is skipped


def _skip(code: str, sentence: str) -> Verdict:
    return Verdict(False, code, sentence)


NO_PERMISSION = _skip("no_permission", "You may not operate it (or it does not exist).")
ENDED = _skip("ended", "It has ended (or is quarantined): nothing to do.")
CANCEL_RECORDED = _skip("cancel_recorded", "A cancel is already recorded on it.")


def verdict(operation: str, me: str, facts: Facts | None) -> Verdict:
    """Will ``operation`` by the person ``me`` (a principal id) change this task, or skip it and why. Pure: the
    preview and the run both ask it, so the preview's counts are what the run does on tasks that did not move."""
    if facts is None:
        return NO_PERMISSION
    rule = _RULES.get(operation)
    if rule is None:
        raise BulkRefused(f"unknown bulk operation {operation!r}")
    refused = permit(operation, me, facts)
    if isinstance(refused, PermissionDenied):
        return NO_PERMISSION
    return rule(me, facts, refused)


def permit(operation: str, me: str, facts: Facts) -> Refused | None:
    """The permit table's answer (tasks.access.permits) for the change ``operation`` makes first, by the person
    ``me`` without a lease, on the facts read (``operable`` read for every task of a preview in one query)."""
    person = Principal(kind="user", id=me)
    change = CHANGE_OF[operation]
    if change is None:
        return None if facts.operable else operate_denied(person, facts.task_id)
    return permits_known(person, change, task_id=facts.task_id, status=facts.status, operable=facts.operable)


def _refused(f: Facts, refused: Refused | None) -> Verdict | None:
    """The skip for a change the permit table refuses in the task's status; None when it allows it."""
    if refused is None:
        return None
    return ENDED if task_ended(f.status) else _skip(refused.code, f"Refused ({refused.code}): {refused}")


def _person_holds(me: str, f: Facts) -> Verdict | None:
    """The skip when a lease or a reservation stands in a takeover's way; None when the way is free."""
    if f.holder_kind == HolderKind.OPERATOR and f.holder_id != me:
        return _skip("person_holds", f"Another person ({f.holder_id}) holds it.")
    if f.reserved_for is not None and f.reserved_for != me:
        return _skip("person_waits", f"Another person ({f.reserved_for}) waits to take it over.")
    return None


def _resume_rule(me: str, f: Facts, refused: Refused | None) -> Verdict:
    skipped = _refused(f, refused)
    if skipped is not None:
        return skipped
    if f.cancel_requested:
        return CANCEL_RECORDED
    if f.status not in RESUMABLE:
        return _skip("not_waiting", f"It is {f.status.replace('_', ' ')}, not paused or with people: it runs already.")
    if f.status == TaskStatus.PAUSED and f.status_reason in NOT_RESUMABLE:
        return _skip(f"paused_{f.status_reason}", NOT_RESUMABLE[f.status_reason])
    if f.holder_kind == HolderKind.AGENT:
        return _skip("agent_holds", f"An agent ({f.holder_id}) holds it.")
    return _person_holds(me, f) or Verdict(
        True, "resumed", "Handed back to the agent, which re-reads its inputs' versions before anything new starts."
    )


def _cancel_rule(me: str, f: Facts, refused: Refused | None) -> Verdict:
    # As the service answers: an ended task, or one whose cancel is recorded, is left as it is (nothing refused).
    if task_ended(f.status):
        return ENDED
    if f.cancel_requested:
        return CANCEL_RECORDED
    return _refused(f, refused) or Verdict(
        True, "cancelled", "Cancel recorded: nothing new starts; work in flight is awaited."
    )


def _takeover_rule(me: str, f: Facts, refused: Refused | None) -> Verdict:
    skipped = _refused(f, refused)
    if skipped is not None:
        return skipped
    if f.holder_kind == HolderKind.OPERATOR and f.holder_id == me:
        return _skip("you_hold", "You hold it already.")
    if f.reserved_for == me:
        return _skip("you_wait", "You asked for it already; you wait for its agent.")
    blocked = _person_holds(me, f)
    if blocked is not None:
        return blocked
    if f.holder_kind == HolderKind.AGENT:
        return Verdict(True, "takeover_requested", "Takeover requested: its agent starts nothing new and lets go.")
    return Verdict(True, "taken_over", "Taken over by you now (a takeover lease; renew it on the task's page).")


def _release_rule(me: str, f: Facts, refused: Refused | None) -> Verdict:
    if f.lease_kind != HolderKind.OPERATOR or f.lease_holder != me:  # live, in its grace or lapsed: still open
        return _skip("not_yours", "You hold no takeover lease on it.")
    return Verdict(True, "released", "Your takeover lease is given back; the task stays with people.")


_RULES: dict[str, Callable[[str, Facts, Refused | None], Verdict]] = {
    BulkOperation.RESUME: _resume_rule,
    BulkOperation.CANCEL: _cancel_rule,
    BulkOperation.REQUEST_TAKEOVER: _takeover_rule,
    BulkOperation.RELEASE: _release_rule,
}


# ------------------------------------------------------------------------------------------------ reading facts


def _with_lease_facts(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """Annotates the open lease (kind, holder, epoch, expiry) and the reservation: correlated subqueries, no JOIN."""
    held = Lease.objects.open().filter(task_id=OuterRef("pk"))
    reserved = LeaseReservation.objects.filter(task_id=OuterRef("pk"))
    return tasks.annotate(
        lease_holder_kind=Subquery(held.values("holder_kind")[:1]),
        lease_holder_id=Subquery(held.values("holder_id")[:1]),
        lease_epoch=Subquery(held.values("epoch")[:1]),
        lease_expires_at=Subquery(held.values("expires_at")[:1]),
        reserved_for=Subquery(reserved.values("holder_id")[:1]),
    )


def _facts(task: Task, operable: bool, now: datetime) -> Facts:
    expires_at: datetime | None = getattr(task, "lease_expires_at", None)
    return Facts(
        task_id=task.pk,
        version=task.version,
        status=task.status,
        status_reason=task.status_reason,
        cancel_requested=task.cancel_requested_at is not None,
        operable=operable,
        epoch=getattr(task, "lease_epoch", None),
        lease_kind=getattr(task, "lease_holder_kind", None),
        lease_holder=getattr(task, "lease_holder_id", None),
        # Past expiry and grace the lease binds nobody: the next acquire closes it (leases.services.lease_acquire).
        lease_live=expires_at is not None and held_at(expires_at, now),
        reserved_for=getattr(task, "reserved_for", None),
    )


def task_facts(actor: Principal, task_id: int) -> Facts | None:
    """The facts of one task, read now (None: no such task): the run's fresh read before each change."""
    task = _with_lease_facts(Task.objects.filter(pk=task_id)).first()
    if task is None:
        return None
    return _facts(task, can_operate(actor, task), clock.now())


# ------------------------------------------------------------------------------------------------ preview


@dataclass(frozen=True)
class PreviewRow:
    task: Task
    facts: Facts
    verdict: Verdict


@dataclass(frozen=True)
class Group:
    """The tasks of a preview that share one verdict."""

    verdict: Verdict
    rows: list[PreviewRow]

    @property
    def count(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Preview:
    operation: str
    rows: list[PreviewRow]
    too_many: bool  # more than MAX_TASKS tasks match: the run is refused until the filter is narrower

    @property
    def changing(self) -> list[PreviewRow]:
        return [row for row in self.rows if row.verdict.changes]

    @property
    def groups(self) -> list[Group]:
        """Changes first, then skips, each group by its verdict, largest first."""
        by: dict[Verdict, list[PreviewRow]] = {}
        for row in self.rows:
            by.setdefault(row.verdict, []).append(row)
        return sorted((Group(v, rows) for v, rows in by.items()), key=lambda g: (not g.verdict.changes, -g.count))

    @property
    def counts(self) -> Counter[str]:
        return Counter(row.verdict.code for row in self.rows)


def require_bulk_role(actor: Principal) -> None:
    """Operators and admins run bulk operations; auditors and everyone else may not."""
    if not principal_roles(actor) & {OPERATOR, ADMIN}:
        raise PermissionDenied(f"{actor} is neither an operator nor an admin: no bulk operations")


def bulk_preview(*, actor: Principal, operation: str, task_filter: TaskFilter) -> Preview:
    """The dry run: what ``operation`` would do to each task ``task_filter`` selects that ``actor`` may see (at most
    MAX_TASKS, oldest first), written nowhere. A fixed number of queries: the tasks with their lease facts, the
    ones ``actor`` may operate, the database clock."""
    require_bulk_role(actor)
    if operation not in _RULES:
        raise BulkRefused(f"unknown bulk operation {operation!r}")
    # The attention filter reads with_attention()'s annotations: they come first.
    annotated = Task.objects.with_attention() if task_filter.attention else Task.objects.all()
    selected = annotated.filter(filter_condition(task_filter)).filter(viewable_condition(actor))
    tasks = list(_with_lease_facts(selected).order_by("pk")[: MAX_TASKS + 1])
    too_many = len(tasks) > MAX_TASKS
    tasks = tasks[:MAX_TASKS]
    operable = set(
        Task.objects.filter(pk__in=[t.pk for t in tasks]).filter(operable_condition(actor)).values_list("pk", flat=True)
    )
    now = clock.now()
    rows = []
    for task in tasks:
        facts = _facts(task, task.pk in operable, now)
        rows.append(PreviewRow(task, facts, verdict(operation, actor.id, facts)))
    return Preview(operation, rows, too_many)


# ------------------------------------------------------------------------------------------------ the run


@dataclass(frozen=True)
class Seen:
    """One task as the preview saw it."""

    task_id: int
    version: int
    epoch: int | None


def bulk_run_create(
    *, actor: Principal, operation: str, reason: str, seen: Iterable[Seen], filter_query: str = ""
) -> BulkRun:
    """Record a confirmed bulk run and enqueue its job once committed. Audited (``bulk_run_confirmed``). Each task's
    permission and state are checked when the job reaches it, by the services, not here: an id posted for a task
    the person may not operate is recorded and skipped."""
    require_bulk_role(actor)
    if operation not in _RULES:
        raise BulkRefused(f"unknown bulk operation {operation!r}")
    reason = reason.strip()
    if len(reason) < MIN_REASON:
        raise BulkRefused(f"give a reason of at least {MIN_REASON} characters")
    items = {s.task_id: s for s in seen}
    if not items:
        raise BulkRefused("no task would change: there is nothing to run")
    if len(items) > MAX_TASKS:
        raise BulkRefused(f"a bulk run takes at most {MAX_TASKS} tasks: narrow the filter")
    with transaction.atomic():
        now = clock.now()
        run = BulkRun.objects.create(
            operation=operation, actor=actor.user, reason=reason, filter_query=filter_query[:2000], created_at=now
        )
        BulkRunItem.objects.bulk_create(
            BulkRunItem(run=run, task_id=s.task_id, seen_version=s.version, seen_epoch=s.epoch)
            for s in sorted(items.values(), key=lambda s: s.task_id)
        )
        audit_append(
            actor=actor,
            action="bulk_run_confirmed",
            at=now,
            reason=reason,
            details={"run": run.pk, "operation": operation, "tasks": sorted(items), "filter": filter_query},
        )
        enqueue_on_commit("tasks.apply_bulk_run", run.pk)
    return run


class _Skip(Exception):
    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


def bulk_run_apply(*, run_id: int) -> BulkRun:
    """Apply the run's pending items one by one, each in its own transaction through the operation's service.
    Running it twice (a redelivered message) changes nothing more: an item is finished once, and a second attempt
    at a task finds its version moved and writes nothing."""
    run = BulkRun.objects.select_related("actor").get(pk=run_id)
    BulkRun.objects.filter(pk=run.pk, status=BulkRunStatus.PENDING).update(status=BulkRunStatus.RUNNING)
    actor = Principal.of_user(User.objects.get(pk=run.actor_id))  # roles read afresh: a revoked role acts no more
    for item in BulkRunItem.objects.filter(run=run, status=BulkItemStatus.PENDING).order_by("pk"):
        _apply_item(run, item, actor)
    BulkRun.objects.filter(pk=run.pk).exclude(status=BulkRunStatus.DONE).update(
        status=BulkRunStatus.DONE, finished_at=clock.now()
    )
    run.refresh_from_db()
    return run


def _apply_item(run: BulkRun, item: BulkRunItem, actor: Principal) -> None:
    try:
        with transaction.atomic():
            done = _change(run, item, actor)
            _finish(item, BulkItemStatus.DONE, done)
    except _Skip as skipped:
        _finish(item, BulkItemStatus.SKIPPED, skipped.sentence)
    except (Refused, LeaseError) as refused:
        _finish(item, BulkItemStatus.SKIPPED, f"Refused ({refused.code}): {refused}")
    except Exception as error:  # one task's unexpected error never stops the others; its writes rolled back
        _finish(item, BulkItemStatus.FAILED, f"Failed ({type(error).__name__}): {error}")


def _finish(item: BulkRunItem, status: str, detail: str) -> None:
    BulkRunItem.objects.filter(pk=item.pk, status=BulkItemStatus.PENDING).update(
        status=status, detail=detail[:500], finished_at=clock.now()
    )


def _change(run: BulkRun, item: BulkRunItem, actor: Principal) -> str:
    """Check the task against what the preview saw and the operation's rule, then change it through its service.
    Raises _Skip (nothing written) or the service's refusal (its transaction rolls back)."""
    facts = task_facts(actor, item.task_id)
    if facts is not None and facts.operable:
        if facts.version != item.seen_version:
            raise _Skip(f"Changed since the preview (version {item.seen_version} → {facts.version}): not touched.")
        if run.operation in _LEASE_MATTERS and facts.epoch != item.seen_epoch:
            raise _Skip("Its lease changed since the preview (granted, released or taken): not touched.")
    judged = verdict(run.operation, actor.id, facts)
    if not judged.changes or facts is None:
        raise _Skip(judged.sentence)
    _APPLY[run.operation](actor, facts, run.reason)
    return judged.sentence


def _cancel(actor: Principal, facts: Facts, reason: str) -> None:
    task = task_request_cancel(actor=actor, task_id=facts.task_id, reason=reason, expected_version=facts.version)
    if task.version == facts.version:  # a cancel committed meanwhile by someone else: nothing of ours to record
        raise _Skip(CANCEL_RECORDED.sentence)


def _claim(actor: Principal, facts: Facts) -> Lease:
    """Take the task over as takeover_claim does (a lease already held by ``actor`` is renewed, nothing recorded).
    The claim must be the only change since the facts were read, or the task moved while being claimed and
    everything written for it is rolled back."""
    claim = takeover_claim(actor=actor, task_id=facts.task_id)
    held_already = facts.holder_kind == HolderKind.OPERATOR and facts.holder_id == actor.id
    _check_version(facts, facts.version if held_already else facts.version + 1)
    if not claim.granted or claim.lease is None:
        raise _Skip(f"Waits for {claim.waiting_for}: not resumed.")
    return claim.lease


def _request_takeover(actor: Principal, facts: Facts, reason: str) -> None:
    """Granted at once on a free task, recorded as a request while an agent holds it: either is one event."""
    takeover_claim(actor=actor, task_id=facts.task_id)
    _check_version(facts, facts.version + 1)


def _check_version(facts: Facts, expected: int) -> None:
    version = Task.objects.values_list("version", flat=True).get(pk=facts.task_id)
    if version != expected:
        raise _Skip(f"Changed while being taken over (version {facts.version} → {version}): not touched.")


def _release(actor: Principal, facts: Facts, reason: str) -> None:
    lease = lease_open(facts.task_id)
    if lease is None or lease.epoch != facts.epoch:
        raise _Skip("Its lease changed since the preview: not touched.")
    takeover_release(actor=actor, lease=lease, reason=reason)


def _resume(actor: Principal, facts: Facts, reason: str) -> None:
    """Claim (or renew one's own lease), then hand back with ``resume_agent``: the task goes ``pending`` with its
    inputs to re-check before anything new starts, and the agent is woken once committed."""
    lease = _claim(actor, facts)
    version = Task.objects.values_list("version", flat=True).get(pk=facts.task_id)
    takeover_submit(actor=actor, lease=lease, based_on_version=version, decision="resume_agent", note=reason)


_APPLY: dict[str, Callable[[Principal, Facts, str], None]] = {
    BulkOperation.RESUME: _resume,
    BulkOperation.CANCEL: _cancel,
    BulkOperation.REQUEST_TAKEOVER: _request_takeover,
    BulkOperation.RELEASE: _release,
}


# ------------------------------------------------------------------------------------------------ reads for pages


@dataclass(frozen=True)
class RunProgress:
    run: BulkRun
    items: list[tuple[BulkRunItem, str | None]]  # each item, and its task's title when the reader may see the task
    counts: dict[str, int]  # item status → how many

    @property
    def finished(self) -> bool:
        return self.run.status == BulkRunStatus.DONE


def bulk_run_progress(*, actor: Principal, run_id: int) -> RunProgress | None:
    """The run and its items, if ``actor`` started it (None otherwise: another person's run is not disclosed), with
    the titles of the tasks ``actor`` may see (an id posted for another task stays a bare number). Three queries
    whatever the number of items."""
    run = BulkRun.objects.filter(pk=run_id, actor_id=getattr(actor.user, "pk", None)).first()
    if run is None:
        return None
    items = list(BulkRunItem.objects.filter(run=run).order_by(F("finished_at").asc(nulls_last=True), "pk"))
    visible = Task.objects.filter(pk__in=[i.task_id for i in items]).filter(viewable_condition(actor))
    titles: dict[int, str] = dict(visible.values_list("pk", "title"))
    counts = Counter(item.status for item in items)
    return RunProgress(
        run,
        [(item, titles.get(item.task_id)) for item in items],
        {status: counts.get(status, 0) for status in BulkItemStatus.values},
    )


STALLED_AFTER_SECONDS = 120


def bulk_runs_stalled(now: datetime) -> list[int]:
    """Confirmed runs still unfinished some time after they were confirmed: their job's message may be lost. Sending
    one again is safe (an item is finished once, every change is version-checked)."""
    cutoff = now - timedelta(seconds=STALLED_AFTER_SECONDS)
    unfinished = [BulkRunStatus.PENDING, BulkRunStatus.RUNNING]
    return list(BulkRun.objects.filter(status__in=unfinished, created_at__lt=cutoff).values_list("pk", flat=True))
