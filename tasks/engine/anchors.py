"""The tasks' part of the head checkpoints (audit/anchors.py): every task's log head, anchored outside the database,
and the check that each log still reaches the head a checkpoint vouched for.

A checkpoint carries the heads of the tasks that moved since the checkpoint before it (``updated_at`` no older than
that checkpoint's ``as_of`` less an overlap that covers transactions still open when it was written), so its size
follows the work done, not the number of tasks; the first carries every task. The verify side folds every verified
checkpoint: per task, the furthest version anchored. A task whose log was cut and whose row was rolled back to an
earlier version and head, consistently, is found: the log no longer holds, at the anchored seq, the anchored digest.
"""

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from audit.anchors import AnchorFile, Checkpoint, read_anchors, register_head_checker, register_head_source
from leases import clock
from tasks.models import LoggedEvent, Task

# A transaction open longer than this when a checkpoint is written may have its change left out of every checkpoint
# (it is anchored with the task's next change): the cost is a weaker check, never a false alarm.
OVERLAP = timedelta(minutes=10)


def task_heads(previous: Checkpoint | None) -> dict[str, Any]:
    """The section a new checkpoint carries: when it was read (database time) and id → [version, log head]."""
    as_of = clock.now()
    tasks = Task.objects.all()
    since = _as_of(previous)
    if since is not None:
        tasks = tasks.filter(updated_at__gte=since - OVERLAP)
    heads = {str(pk): [version, head] for pk, version, head in tasks.values_list("pk", "version", "log_head")}
    return {"as_of": as_of.isoformat(), "heads": heads}


def _as_of(checkpoint: Checkpoint | None) -> datetime | None:
    section = checkpoint.sections.get("tasks") if checkpoint else None
    if not isinstance(section, dict) or not isinstance(section.get("as_of"), str):
        return None
    return datetime.fromisoformat(section["as_of"])


register_head_source("tasks", task_heads)

type Anchored = dict[int, tuple[int, str, str]]  # task id → (version, log head, the checkpoint's time)
_folded: tuple[AnchorFile, Anchored] | None = None


def anchored_task_heads(anchors: AnchorFile | None = None) -> Anchored:
    """Per task, the furthest version any verified checkpoint anchored, with its head (a task's version only grows)."""
    global _folded
    anchors = anchors or read_anchors()
    if _folded is not None and _folded[0] is anchors:
        return _folded[1]
    anchored: Anchored = {}
    for checkpoint in anchors.checkpoints:
        section = checkpoint.sections.get("tasks")
        heads = section.get("heads") if isinstance(section, dict) else None
        for key, value in heads.items() if isinstance(heads, dict) else ():
            try:
                task_id, version, head = int(key), int(value[0]), str(value[1])
            except (ValueError, TypeError, IndexError):
                continue
            if task_id not in anchored or anchored[task_id][0] <= version:
                anchored[task_id] = (version, head, checkpoint.at)
    _folded = (anchors, anchored)
    return anchored


def find_anchor_problem(task: Task, anchors: AnchorFile | None = None) -> str | None:
    """The task's log against its newest anchored head: still there, unchanged, and not cut below it."""
    anchored = anchored_task_heads(anchors).get(task.pk)
    if anchored is None:
        return None
    version = anchored[0]
    digest = None
    if task.version >= version:
        digest = LoggedEvent.objects.filter(task=task, seq=version).values_list("digest", flat=True).first()
    return _problem(task.version, digest, anchored)


def _problem(version_now: int, digest: str | None, anchored: tuple[int, str, str]) -> str | None:
    """What the log shows against its anchored (version, head, checkpoint time): ``digest`` is its event's at the
    anchored seq (None: missing)."""
    version, head, at = anchored
    if version_now < version:
        return (
            f"the log was cut: the checkpoint of {at} anchored version {version}, the task is at version {version_now}"
        )
    if digest is None:
        return f"the log was cut: event seq {version}, anchored by the checkpoint of {at}, is missing"
    if digest != head:
        return f"event seq {version} is not the one the checkpoint of {at} anchored: the log was rewritten"
    return None


# Tasks checked per round trip by anchored_tasks_problems (one OR of (task, seq) pairs: SQLite's expression depth
# stays far below its limit of 1000).
CHUNK = 200


def anchored_tasks_problems(anchors: AnchorFile) -> list[str]:
    """Every task a checkpoint anchored, against its furthest anchored head, in bulk — two queries per CHUNK tasks:
    its log cut or rewritten (find_anchor_problem's rule and words), or the task gone. For the console's "Verify
    now" (audit.anchors.anchors_verify), where checking a task costs no query of its own."""
    anchored = anchored_task_heads(anchors)
    ids = sorted(anchored)
    problems: list[str] = []
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        versions = dict(Task.objects.filter(pk__in=chunk).values_list("pk", "version"))
        reached = [task_id for task_id in chunk if versions.get(task_id, -1) >= anchored[task_id][0]]
        digests: dict[tuple[int, int], str] = {}
        if reached:
            pairs = Q()
            for task_id in reached:
                pairs |= Q(task_id=task_id, seq=anchored[task_id][0])
            digests = {
                (t, seq): d for t, seq, d in LoggedEvent.objects.filter(pairs).values_list("task_id", "seq", "digest")
            }
        for task_id in chunk:
            version, _head, at = anchored[task_id]
            if task_id not in versions:
                problems.append(f"task {task_id}: {_gone(version, at)}")
                continue
            problem = _problem(versions[task_id], digests.get((task_id, version)), anchored[task_id])
            if problem:
                problems.append(f"task {task_id}: {problem}")
    return problems


register_head_checker("tasks", anchored_tasks_problems)


def _gone(version: int, at: str) -> str:
    return f"anchored at version {version} by the checkpoint of {at}, no longer in the database"


def anchored_tasks_gone(anchors: AnchorFile | None = None) -> list[str]:
    """Tasks a checkpoint anchored whose row is no longer in the database (deleted with their logs)."""
    anchored = anchored_task_heads(anchors)
    present = set(Task.objects.values_list("pk", flat=True)) if anchored else set()
    return [
        f"task {task_id}: {_gone(version, at)}"
        for task_id, (version, _head, at) in sorted(anchored.items())
        if task_id not in present
    ]
