"""The permit table (tasks.core.lifecycle.PERMITS): which actor may make which kind of change in which task status.

Pinned as a literal table, then checked against the compare-and-set itself: for every kind of change, every actor
and every task status, a change lands exactly when the table says so — whatever the caller computed — and a refusal
writes nothing.
"""

from datetime import timedelta

import pytest

from leases.models import Lease
from leases.services import lease_acquire
from tasks.core.errors import InvalidTransition, TaskNotRunnable
from tasks.core.lifecycle import PERMITS, Actor, ChangeKind, TaskStatus, permitted
from tasks.decide.change import Change
from tasks.engine.cas import Applied, compare_and_set
from tasks.models import Task
from tests.conftest import snapshot

_ACTIVE = {"pending", "running", "observing", "backing_off"}
_SETTLING = {"stopping", "stopped_pending"}
_ENDED = {"completed", "failed", "stopped"}
_ALL = {s.value for s in TaskStatus}

EXPECTED: dict[tuple[str, str], set[str]] = {
    ("start", "agent"): {"pending", "running", "backing_off"},
    ("settle", "agent"): _ACTIVE | _SETTLING | {"paused"},
    ("settle", "operator"): _SETTLING | {"human"},
    ("confirm", "agent"): _ACTIVE,
    ("cleanup", "agent"): _ENDED,
    ("cleanup", "person"): _ENDED,
    ("cancel", "agent"): _ACTIVE | {"paused"},
    ("cancel", "operator"): {"human"},
    ("cancel", "person"): _ACTIVE | {"paused", "human"},
    ("cancel", "system"): _ACTIVE | {"paused", "human"},
    ("takeover", "person"): _ALL - _ENDED - {"quarantined"},
    ("takeover", "operator"): _ALL - _ENDED - {"quarantined"},
    ("decide", "operator"): _SETTLING | {"human", "stopped"},
    ("propose", "agent"): _ACTIVE | {"paused"},
    ("propose", "operator"): {"human"},
    ("accept", "agent"): {"pending", "paused"},
    ("accept", "operator"): {"human"},
    ("accept", "system"): {"pending", "paused", "human"},
    ("force_release", "person"): _ALL,
    ("quarantine", "system"): _ALL - {"quarantined"},
}


def test_the_permit_table_is_exactly_the_documented_one() -> None:
    actual = {(kind.value, actor.value): {s.value for s in statuses} for (kind, actor), statuses in PERMITS.items()}
    assert actual == EXPECTED


def test_nothing_starts_outside_a_runnable_status_and_nobody_but_an_agent_starts() -> None:
    for actor in Actor:
        allowed = permitted(ChangeKind.START, actor)
        assert allowed <= {TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.BACKING_OFF}
        assert not allowed or actor == Actor.AGENT


def _set_status(task: Task, status: str) -> None:
    """Put the row in ``status`` as the constraints allow it (a paused task has a reason, a stopping one a cancel)."""
    Task.objects.filter(pk=task.pk).update(
        status=status,
        status_reason="needs_replan" if status == "paused" else "",
        status_detail="probe",
        cancel_requested_at=task.created_at if status in ("stopping", "stopped_pending", "stopped") else None,
    )


@pytest.mark.parametrize(
    ("kind", "actor"),
    [(kind, actor) for kind in ChangeKind for actor in Actor if kind != ChangeKind.CREATE],
    ids=lambda value: str(value),
)
def test_the_compare_and_set_enforces_the_table_in_every_status(make_task, clock, kind, actor) -> None:
    task = make_task()
    lease: Lease | None = None
    if actor in (Actor.AGENT, Actor.OPERATOR):
        lease = lease_acquire(task_id=task.pk, holder_kind=actor.value, holder_id="h", ttl=timedelta(hours=1))
    allowed = permitted(kind, actor)
    for status in TaskStatus:
        _set_status(task, status.value)
        version = Task.objects.values_list("version", flat=True).get(pk=task.pk)
        probe = Change(event="probe", kind=kind, data={"status": status.value})

        def write(v: int = version, c: Change = probe) -> Applied:
            return compare_and_set(task.pk, v, c, lease=lease, actor=None if lease else actor)

        if status in allowed:
            assert write().version == version + 1, f"{actor} {kind} in {status} should land"
        else:
            before = snapshot()
            with pytest.raises((TaskNotRunnable, InvalidTransition)):
                write()
            assert snapshot() == before, f"{actor} {kind} in {status} wrote despite the refusal"
