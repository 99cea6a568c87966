"""The permit table (tasks.core.lifecycle.PERMITS and NEEDS): which actor may make which kind of change in which task
status, and who the principal must be.

Pinned as a literal table, compared with its drawing in docs/design.md, then checked against the compare-and-set
itself: for every kind of change, every actor and every task status, a change lands exactly when the table says so —
whatever the caller computed — and a refusal writes nothing. ``tasks.access.permits.permits`` asks the same table of
a principal; "ended" has one definition; a quarantined task's temp resources are kept.
"""

import ast
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from guardian.shortcuts import assign_perm

from audit.errors import Refused
from audit.principals import Principal
from leases.models import Lease
from leases.services import lease_acquire, lease_release
from tasks.access.permissions import PermissionDenied
from tasks.access.permits import permits, permits_known
from tasks.core.errors import InvalidTransition, TaskNotRunnable
from tasks.core.lifecycle import (
    ENDED_TASK_STATUSES,
    NEEDS,
    NEEDS_FREE_TASK,
    NOT_ENDED,
    PERMITS,
    TASK_TRANSITIONS,
    TERMINAL_TASK_STATUSES,
    Actor,
    ChangeKind,
    Need,
    TaskStatus,
    permitted,
    task_ended,
)
from tasks.core.outcomes import Committed
from tasks.decide.change import Change
from tasks.engine.cas import Applied, compare_and_set
from tasks.engine.cleanup import cleanup_temp_resources, temp_resource_reset, temp_resources_due
from tasks.engine.verification import task_quarantine
from tasks.models import Task, TempResource
from tests.conftest import chain_plan, person, snapshot
from tests.steps import record, send, version
from tests.test_layout import project_packages

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


def set_status(task: Task, status: str) -> None:
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
        set_status(task, status.value)
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


# -- who the principal must be, and the drawing in docs/design.md -------------------------------------------------

EXPECTED_NEEDS: dict[tuple[str, str], str] = {
    ("start", "agent"): "its lease",
    ("settle", "agent"): "its lease",
    ("settle", "operator"): "operate",
    ("confirm", "agent"): "its lease",
    ("cleanup", "agent"): "its lease",
    ("cleanup", "person"): "operate",
    ("cancel", "agent"): "its lease",
    ("cancel", "operator"): "operate",
    ("cancel", "person"): "operate",
    ("cancel", "system"): "creator",
    ("takeover", "person"): "operate",
    ("takeover", "operator"): "operate",
    ("decide", "operator"): "operate",
    ("propose", "agent"): "its lease",
    ("propose", "operator"): "operate",
    ("accept", "agent"): "its lease",
    ("accept", "operator"): "operate",
    ("accept", "system"): "system",
    ("force_release", "person"): "admin",
    ("quarantine", "system"): "system",
}


def test_who_each_change_needs_is_exactly_the_documented_table_with_the_same_keys() -> None:
    assert {(kind.value, actor.value): need.value for (kind, actor), need in NEEDS.items()} == EXPECTED_NEEDS
    assert set(NEEDS) == set(PERMITS)


DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"
# The drawing's column heads, each naming one task status.
COLUMNS = {
    "pend": "pending",
    "run": "running",
    "obs": "observing",
    "back": "backing_off",
    "paus": "paused",
    "hum": "human",
    "stopg": "stopping",
    "st_p": "stopped_pending",
    "stop": "stopped",
    "comp": "completed",
    "fail": "failed",
    "quar": "quarantined",
}


def drawn_permit_table() -> dict[tuple[str, str], tuple[str, frozenset[str], bool]]:
    """The permit table as docs/design.md draws it: (change, actor) → (what the principal needs, the statuses
    ticked, whether the row carries the ¹ of a change that needs a free task)."""
    lines = DESIGN.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| change | actor | needs |"))
    heads = [cell.strip() for cell in lines[header].strip().strip("|").split("|")]
    statuses = [COLUMNS[head] for head in heads[3:]]
    assert sorted(statuses) == sorted(s.value for s in TaskStatus), "one column per task status"
    drawn: dict[tuple[str, str], tuple[str, frozenset[str], bool]] = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        change, actor, needs, *ticks = (cell.strip() for cell in line.strip().strip("|").split("|"))
        key = (change.strip("`"), actor.rstrip("¹"))
        assert key not in drawn, f"{key} is drawn twice"
        assert set(ticks) <= {"✓", ""}, line
        ticked = frozenset(status for status, tick in zip(statuses, ticks, strict=True) if tick)
        drawn[key] = (needs, ticked, actor.endswith("¹"))
    return drawn


def test_the_drawing_in_the_design_is_the_permit_table() -> None:
    """Either the table or its drawing changed alone: redraw docs/design.md §6 from tasks/core/lifecycle.py."""
    table = {
        (kind.value, actor.value): (
            NEEDS[(kind, actor)].value,
            frozenset(s.value for s in statuses),
            (kind, actor) in NEEDS_FREE_TASK,
        )
        for (kind, actor), statuses in PERMITS.items()
    }
    assert drawn_permit_table() == table


# -- permits: the one table, asked of every principal --------------------------------------------------------------


@dataclass(frozen=True)
class LeaseOf:
    """A lease as a write carries it (leases.services.LeaseRef)."""

    holder_kind: str
    holder_id: str
    task_id: int = 1
    pk: int = 1
    epoch: int = 1
    ttl: timedelta | None = None


def meeting(need: Need, actor: Actor) -> tuple[Principal, LeaseOf | None]:
    """A principal who is what ``need`` asks for, acting as ``actor`` (with its own lease when the actor holds one)."""
    if actor is Actor.AGENT:
        return Principal.agent("worker-1"), LeaseOf("agent", "worker-1")
    if actor is Actor.OPERATOR:
        return Principal(kind="user", id="ann"), LeaseOf("operator", "ann")
    if need is Need.ADMIN:
        return person("ada", "admin"), None
    if need is Need.OPERATE:
        return Principal(kind="user", id="ann"), None
    if need is Need.CREATOR:
        return Principal.agent("tester"), None
    return Principal.system("scheduler"), None


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "actor"), list(PERMITS), ids=lambda value: str(value))
def test_permits_allows_who_the_table_needs_exactly_in_the_statuses_it_allows_and_no_copy_decides(
    monkeypatch: pytest.MonkeyPatch, kind: ChangeKind, actor: Actor
) -> None:
    who, lease = meeting(NEEDS[(kind, actor)], actor)
    stranger = Principal.agent("stranger")  # no lease, created nothing, not the system, not a person

    def ask(principal: Principal, status: TaskStatus, held: LeaseOf | None) -> Refused | None:
        return permits_known(
            principal, kind, task_id=1, status=status.value, operable=True, created_by="agent:tester", lease=held
        )

    for status in TaskStatus:
        refusal = ask(who, status, lease)
        if status in permitted(kind, actor):
            assert refusal is None, (who, kind, status, refusal)
        else:
            assert isinstance(refusal, TaskNotRunnable) and refusal.code == "task_not_runnable", (status, refusal)
        assert isinstance(ask(stranger, status, None), PermissionDenied)
        if lease is not None:  # the same lease held by someone else
            assert isinstance(ask(Principal(kind=who.kind, id="other"), status, lease), PermissionDenied)
    # The compare-and-set's own table, changed, changes the answer: nothing else holds a copy of it.
    dropped = sorted(permitted(kind, actor))[0]
    monkeypatch.setitem(PERMITS, (kind, actor), permitted(kind, actor) - {dropped})
    assert isinstance(ask(who, dropped, lease), TaskNotRunnable)


def test_permits_answers_each_principal_with_the_refusal_its_service_raises(make_task, agent_lease, clock) -> None:
    task = make_task()  # pending, created by agent:tester
    lease = agent_lease(task, holder="worker-1")
    ada, ann, aud = person("ada", "admin"), person("ann", "operator"), person("aud", "auditor")
    cases: list[tuple[Principal, ChangeKind, Lease | None, type[Refused] | None]] = [
        (Principal.agent("worker-1"), ChangeKind.START, lease, None),
        (Principal.agent("worker-2"), ChangeKind.START, lease, PermissionDenied),  # another agent's lease
        (Principal.agent("worker-1"), ChangeKind.CLEANUP, lease, TaskNotRunnable),  # not before it has ended
        (Principal.agent("tester"), ChangeKind.CANCEL, None, None),  # its creator, without the lease
        (Principal.agent("worker-1"), ChangeKind.CANCEL, None, PermissionDenied),  # its lease not given
        (Principal.system("cron"), ChangeKind.CANCEL, None, PermissionDenied),
        (Principal.system("verifier"), ChangeKind.QUARANTINE, None, None),
        (Principal.agent("worker-1"), ChangeKind.QUARANTINE, None, PermissionDenied),  # an agent is not the system
        (ada, ChangeKind.FORCE_RELEASE, None, None),
        (ada, ChangeKind.TAKEOVER, None, None),
        (ada, ChangeKind.START, None, PermissionDenied),  # a person never starts
        (ada, ChangeKind.CLEANUP, None, TaskNotRunnable),
        (ann, ChangeKind.FORCE_RELEASE, None, PermissionDenied),
        (ann, ChangeKind.CANCEL, None, PermissionDenied),  # not granted the task
        (aud, ChangeKind.TAKEOVER, None, PermissionDenied),
    ]
    for who, kind, held, expected in cases:
        refusal = permits(who, kind, Task.objects.get(pk=task.pk), lease=held)
        assert (None if refusal is None else type(refusal)) is expected, (who, kind, refusal)
    assign_perm("tasks.operate_task", ann.user, task)
    assert permits(ann, ChangeKind.CANCEL, task) is None


# -- "ended": one definition ------------------------------------------------------------------------------------------


def test_ended_is_one_definition_terminal_or_quarantined() -> None:
    assert {s.value for s in ENDED_TASK_STATUSES} == _ENDED | {"quarantined"}
    assert {s.value for s in TERMINAL_TASK_STATUSES} == _ENDED
    assert frozenset(TaskStatus) - ENDED_TASK_STATUSES == NOT_ENDED
    assert {s for s in TaskStatus if task_ended(s)} == ENDED_TASK_STATUSES
    assert {target for source, target in TASK_TRANSITIONS if source in ENDED_TASK_STATUSES} == {TaskStatus.QUARANTINED}


def _statuses_named(node: ast.AST) -> tuple[set[str], bool]:
    """The task statuses a set, list or tuple (or a ``|`` of them) names, by member or by value, and whether it also
    names TERMINAL_TASK_STATUSES."""
    names = {s.name: s.value for s in TaskStatus}
    found: set[str] = set()
    terminal = False
    for part in ast.walk(node):
        if isinstance(part, ast.Attribute) and part.attr in names:
            found.add(names[part.attr])
        elif isinstance(part, ast.Constant) and part.value in names.values():
            found.add(str(part.value))
        elif isinstance(part, ast.Name) and part.id == "TERMINAL_TASK_STATUSES":
            terminal = True
    return found, terminal


def test_no_module_keeps_a_list_of_its_own_of_the_ended_statuses() -> None:
    """A set of ended statuses written anywhere but tasks/core/lifecycle.py is a second definition that can drift
    (the console's, cancel's and cleanup's each did): ask task_ended, ENDED_TASK_STATUSES, TERMINAL_TASK_STATUSES or
    NOT_ENDED instead. Caught: the terminal statuses with quarantined added by hand, or three or more ended statuses
    listed with no other status."""
    root = DESIGN.parent.parent
    ended = {s.value for s in ENDED_TASK_STATUSES}
    copies = set()
    for package in sorted(project_packages() - {"tests"}):
        for path in sorted((root / package).rglob("*.py")):
            if path == root / "tasks" / "core" / "lifecycle.py" or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Set | ast.List | ast.Tuple) or (
                    isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                ):
                    found, terminal = _statuses_named(node)
                    if (terminal and "quarantined" in found) or (len(found) >= 3 and found <= ended):
                        copies.add(f"{path.relative_to(root)}:{node.lineno}")
    assert not copies, f"ended statuses listed outside tasks/core/lifecycle.py: {sorted(copies)}"


# -- cleanup and a quarantined task -----------------------------------------------------------------------------------


class NoDeletes:
    """A connector that must not be asked anything: a quarantined task's temp resources are never deleted."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the connector was asked {name} for a quarantined task")


def test_a_quarantined_tasks_temp_resources_are_kept_for_a_person_and_no_scan_wakes_it(
    make_task, agent_lease, clock
) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a", "staging/b"]}), lease)
    lease_release(lease=lease)
    task = Task.objects.get(pk=task.pk)
    assert task.status == "completed" and temp_resources_due(task).count() == 2  # completed: they would be deleted
    assert task.pk in set(Task.objects.workable().values_list("pk", flat=True))
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="the log and the rows disagree")
    task = Task.objects.get(pk=task.pk)
    assert task_ended(task.status) and not temp_resources_due(task).exists()
    assert task.pk not in set(Task.objects.workable().values_list("pk", flat=True))
    before = snapshot()
    report = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=NoDeletes())
    assert (report.deleted, report.remaining) == (0, 0)
    assert snapshot() == before
    assert set(TempResource.objects.filter(task=task).values_list("status", flat=True)) == {"active"}


def test_a_stuck_temp_resource_of_a_quarantined_task_cannot_be_reset(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a"]}), lease)
    lease_release(lease=lease)
    temp = TempResource.objects.get(task=task)
    TempResource.objects.filter(pk=temp.pk).update(status="stuck")
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="the log and the rows disagree")
    ada = person("ada", "admin")
    assert isinstance(permits(ada, ChangeKind.CLEANUP, Task.objects.get(pk=task.pk)), TaskNotRunnable)
    before = snapshot()
    with pytest.raises(TaskNotRunnable):
        temp_resource_reset(
            actor=ada, task_id=task.pk, temp_id=temp.pk, expected_version=version(task), reason="granted back again"
        )
    assert snapshot() == before
