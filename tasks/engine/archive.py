"""The archive step: an ended task's events move out of the hot table, so it holds the live work, not the history.

A task qualifies once it is terminal (completed, failed or stopped; a quarantined log stays where it is, as evidence)
and has not changed for ``RECKON_ARCHIVE_AFTER`` (database clock), and — when heads are anchored (RECKON_ANCHOR_KEY)
— once a signed checkpoint vouches for its current head: the log that moves is one an outside record already pins,
so a rewrite of the archive is found as a rewrite of the hot table would be (tasks/engine/anchors.py). Without
anchoring the move happens and says so (``ArchiveRun.anchored``).

A move is two statements per batch of tasks, in one transaction with the tasks' rows locked (no append runs
meanwhile): INSERT … SELECT copies the rows into ``tasks_archivedevent`` as they are, DELETE removes them from
``tasks_event`` — which its trigger allows only for a row with an identical archived copy (migration 0022). The
chain, the task's version and its head do not change; every read of a log goes through the ``tasks_event_log`` view
(``LoggedEvent``), so a page, verify_log and the anchors see the same log before and after. An event appended to an
archived task later (a temp resource's cleanup) goes to the hot table and moves with the task's next archive. Each
batch is one audit event (``events_archived``: which tasks, how many events), and adds its events to the archive's
count by type (``ArchivedEventCount``), which the metrics' counters read instead of the archive's rows.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef

from audit.anchors import read_anchors
from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from tasks.core.lifecycle import TERMINAL_TASK_STATUSES
from tasks.engine.anchors import anchored_task_heads
from tasks.models import Event, Task

ARCHIVE_ACTION = "events_archived"
ARCHIVER = Principal.system("archive")
# A batch moves whole tasks, at most this many events (a task with a longer log moves alone) and this many tasks
# (the audit event names each): a transaction of bounded size, its locks held for well under a second.
BATCH_EVENTS = 20_000
BATCH_TASKS = 200
# Candidates read per query while looking for tasks to move.
SCAN_CHUNK = 1_000

_COLUMNS = "id, task_id, seq, type, payload, prev_digest, digest, created_at"


@dataclass
class ArchiveRun:
    """What one run moved: tasks and events, in how many batches; tasks that qualified but whose head no checkpoint
    vouches for yet (left for a later run); and whether heads are anchored at all."""

    anchored: bool
    tasks: int = 0
    events: int = 0
    batches: int = 0
    waiting_for_anchor: int = 0

    def sentence(self) -> str:
        moved = f"archived {self.events} events of {self.tasks} tasks in {self.batches} batches"
        if not self.anchored:
            return f"{moved} (heads not anchored: RECKON_ANCHOR_KEY is not set)"
        if self.waiting_for_anchor:
            return f"{moved}; {self.waiting_for_anchor} tasks wait for a checkpoint to anchor their head"
        return moved


def archive_after() -> timedelta:
    return timedelta(seconds=settings.RECKON_ARCHIVE_AFTER_SECONDS)


def archive_ended(
    *, limit: int | None = None, after: timedelta | None = None, now: datetime | None = None
) -> ArchiveRun:
    """Move the events of every qualifying task (at most ``limit`` tasks), oldest change first, batch by batch."""
    now = now or clock.now()
    cutoff = now - (archive_after() if after is None else after)
    anchors = read_anchors()
    anchored = anchored_task_heads(anchors) if anchors.enabled else None
    run = ArchiveRun(anchored=anchors.enabled)
    vouched = _vouched(anchored)
    candidates = (
        Task.objects.filter(status__in=TERMINAL_TASK_STATUSES, updated_at__lt=cutoff)
        .filter(Exists(Event.objects.filter(task=OuterRef("pk"))))
        .order_by("updated_at", "pk")
    )
    last: tuple[datetime, int] | None = None
    while limit is None or run.tasks < limit:
        page = candidates
        if last is not None:
            page = page.filter(updated_at__gte=last[0]).exclude(updated_at=last[0], pk__lte=last[1])
        rows = list(page.values_list("pk", "version", "log_head", "updated_at")[:SCAN_CHUNK])
        if not rows:
            break
        last = (rows[-1][3], rows[-1][0])
        ready = []
        for pk, version, head, _updated in rows:
            if vouched(pk, version, head):
                ready.append((pk, version))
            else:
                run.waiting_for_anchor += 1
        if limit is not None:
            ready = ready[: limit - run.tasks]
        for batch in _batches(ready):
            _move(batch, cutoff=cutoff, now=now, run=run, vouched=vouched)
    return run


def _vouched(anchored: dict[int, tuple[int, str, str]] | None) -> Callable[[int, int, str], bool]:
    """Whether a checkpoint vouches for the task's current (version, head); always, when nothing is anchored."""
    if anchored is None:
        return lambda _pk, _version, _head: True
    return lambda pk, version, head: anchored.get(pk, (0, ""))[:2] == (version, head)


def _batches(tasks: list[tuple[int, int]]) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    size = 0
    for pk, version in tasks:
        if current and (size + version > BATCH_EVENTS or len(current) >= BATCH_TASKS):
            batches.append(current)
            current, size = [], 0
        current.append(pk)
        size += version
    if current:
        batches.append(current)
    return batches


def _move(
    pks: list[int], *, cutoff: datetime, now: datetime, run: ArchiveRun, vouched: Callable[[int, int, str], bool]
) -> None:
    """One batch in one transaction: lock the rows, check again what qualified them, copy, delete."""
    with transaction.atomic():
        rows = (
            Task.objects.select_for_update()
            .filter(pk__in=pks, status__in=TERMINAL_TASK_STATUSES, updated_at__lt=cutoff)
            .order_by("pk")
            .values_list("pk", "version", "log_head")
        )
        moving = [pk for pk, version, head in rows if vouched(pk, version, head)]
        if not moving:
            return
        marks = ", ".join(["%s"] * len(moving))
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO tasks_archivedevent ({_COLUMNS}, archived_at)"  # noqa: S608 - placeholders only
                f" SELECT {_COLUMNS}, %s FROM tasks_event WHERE task_id IN ({marks})",
                [now, *moving],
            )
            copied = cursor.rowcount
            cursor.execute(
                "INSERT INTO tasks_archivedeventcount (type, events)"  # noqa: S608 - placeholders only
                f" SELECT type, COUNT(*) FROM tasks_event WHERE task_id IN ({marks}) GROUP BY type"
                " ON CONFLICT (type) DO UPDATE SET events = tasks_archivedeventcount.events + excluded.events",
                moving,
            )
            cursor.execute(f"DELETE FROM tasks_event WHERE task_id IN ({marks})", moving)  # noqa: S608
            if cursor.rowcount != copied:  # the trigger refuses a row without its copy; this is the count's check
                raise RuntimeError(f"archive moved {copied} events but deleted {cursor.rowcount}")
        if not copied:
            return
        audit_append(actor=ARCHIVER, action=ARCHIVE_ACTION, at=now, details={"task_ids": moving, "events": copied})
    run.tasks += len(moving)
    run.events += copied
    run.batches += 1
