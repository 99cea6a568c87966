"""A holder's next request over HTTP reads the task's row only: when that row is still at the version the last answer
left, the task's nodes and operations are those of the snapshot the process kept (api.steps.RECENT,
``task_snapshot(known=…)``). These tests try to make a reused snapshot show what the database does not hold: a
change that does not move the version (a person's reservation, a lease renewed or lapsed), a change that does (a
cancel), a write rolled back, a task id used again by another task, and rows changed under a kept snapshot.

Every reuse in the transactional tests here is checked against a full read of the same moment (``checked``): the
same task row, nodes, operations, reservation and lease, field by field."""

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api import steps
from audit.principals import Principal
from leases.models import Lease
from leases.services import lease_acquire, lease_reserve
from tasks.access.permissions import permission_grant
from tasks.core.errors import VersionConflict
from tasks.core.outcomes import Committed
from tasks.decide.change import Snapshot
from tasks.engine import cas
from tasks.engine import snapshot as snapshot_module
from tasks.engine.protocol import operation_start, record_outcome
from tasks.engine.snapshot import RecentSnapshots, after_write, task_snapshot
from tasks.models import Node, Operation, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import takeover_claim
from tests.conftest import chain_plan, person, snapshot
from tests.test_api_steps import Agent, admin, agent, created, issue, problem_of, version_of

__all__ = ["admin", "agent", "issue"]  # the fixtures of tests/test_api_steps.py

COMMITTED = {"result": "committed", "remote_id": "r", "start_next": True}


def fields(row: Any) -> dict[str, Any]:
    return {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}


def same(reused: Snapshot, full: Snapshot) -> None:
    """Everything a decision reads, equal in both (the database time aside: two reads, two times)."""
    assert fields(reused.task) == fields(full.task)
    assert [(fields(n), getattr(n, "retries", 0)) for n in reused.nodes] == [
        (fields(n), getattr(n, "retries", 0)) for n in full.nodes
    ]
    assert [(fields(op), fields(op.node)) for op in reused.unsettled] == [
        (fields(op), fields(op.node)) for op in full.unsettled
    ]
    assert (reused.reserved_for, reused.lease_expires_at) == (full.reserved_for, full.lease_expires_at)


def _watched(monkeypatch: pytest.MonkeyPatch, compare: bool) -> list[int]:
    real = snapshot_module._read
    reused: list[int] = []

    def read(task_id: int, lease: Any, known: Snapshot | None) -> Snapshot | None:
        snap = real(task_id, lease, known)
        if known is not None and snap is not None and snap.nodes is known.nodes:
            if compare:
                full = real(task_id, lease, None)
                assert full is not None
                same(snap, full)
            reused.append(task_id)
        return snap

    monkeypatch.setattr(snapshot_module, "_read", read)
    steps.RECENT.clear()  # nothing kept from another test
    return reused


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Each reuse compared with a full read made right after it; yields the ids of the tasks whose snapshot was
    reused (a test that expects reuse asserts it happened: a check that never runs proves nothing)."""
    yield _watched(monkeypatch, compare=True)
    steps.RECENT.clear()


@pytest.fixture
def reuses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The ids of the tasks whose snapshot was reused, without the comparison: for rows changed behind the version,
    where a reuse differs from a full read by construction."""
    yield _watched(monkeypatch, compare=False)
    steps.RECENT.clear()


def outcome(agent: Agent, task_id: int, lease: int, op_key: str, version: int) -> Any:
    path = f"/tasks/{task_id}/operations/{op_key}/outcome"
    return agent.call("post", path, COMMITTED, Reckon_Lease=str(lease), If_Match=f'"{version}"')


def started(agent: Agent, nodes: tuple[str, ...] = ("a", "b", "c")) -> tuple[int, int, str, int]:
    """A task with its lease and node a's operation sent: (task id, lease id, op key, version)."""
    task = created(agent, plan=chain_plan(*nodes))
    lease = agent.acquire(task["id"], ttl_seconds=300)["lease_id"]
    d = agent.directive(task["id"], lease)
    answer = agent.start(task["id"], lease, "a", d["task_version"])
    assert answer.status_code == 201, answer.content
    return task["id"], lease, answer.json()["op_key"], d["task_version"] + 1


@pytest.mark.django_db(transaction=True)
def test_a_chain_driven_by_outcomes_reuses_each_answer_and_ends_as_a_full_read_would(
    agent: Agent, checked: list[int]
) -> None:
    task_id, lease, op_key, version = started(agent, ("a", "b", "c", "d"))
    while True:
        answer = outcome(agent, task_id, lease, op_key, version)
        assert answer.status_code == 200, answer.content
        following = answer.json()["next"]
        if following["kind"] != "execute":
            break
        op_key, version = following["op_key"], following["task_version"]
    assert following["kind"] == "done" and Task.objects.get(pk=task_id).status == "completed"
    assert checked.count(task_id) >= 4  # every outcome decided on the kept snapshot, each checked


@pytest.mark.django_db(transaction=True)
def test_a_reservation_made_between_two_requests_is_seen_though_the_version_did_not_move(
    agent: Agent, checked: list[int]
) -> None:
    """The lease's reservation for a person is its own row: written by the lease service without a new version (the
    takeover service moves the version too, but the snapshot does not count on it). The agent's next outcome,
    decided on the kept snapshot, must still see it and start nothing new."""
    task_id, lease, op_key, version = started(agent)
    lease_reserve(task_id=task_id, operator_id="olga")
    assert version_of(task_id) == version

    answer = outcome(agent, task_id, lease, op_key, version)
    assert answer.status_code == 200, answer.content
    following = answer.json()["next"]
    assert (following["kind"], following["reason"]) == ("stop", "takeover_requested")
    assert not following.get("started")
    assert Operation.objects.filter(task_id=task_id).count() == 1
    assert task_id in checked


@pytest.mark.django_db(transaction=True)
def test_a_takeover_asked_between_two_requests_refuses_the_stale_one_and_it_writes_nothing(
    agent: Agent, admin: Principal, checked: list[int]
) -> None:
    task_id, lease, op_key, version = started(agent)
    operator = person("olga", "operator")
    permission_grant(actor=admin, user=operator.user, task=Task.objects.get(pk=task_id))
    assert not takeover_claim(actor=operator, task_id=task_id).granted  # reserved: waits for the agent's lease
    rows = snapshot()
    problem_of(outcome(agent, task_id, lease, op_key, version), 412, "version_conflict")
    assert snapshot() == rows


@pytest.mark.django_db(transaction=True)
def test_a_cancel_between_two_requests_moves_the_version_and_the_stale_request_writes_nothing(
    agent: Agent, admin: Principal, checked: list[int]
) -> None:
    task_id, lease, op_key, version = started(agent)
    task_request_cancel(actor=admin, task_id=task_id, reason="stop")
    rows = snapshot()
    problem_of(outcome(agent, task_id, lease, op_key, version), 412, "version_conflict")
    assert snapshot() == rows
    fresh = agent.directive(task_id, lease)
    assert fresh["task_version"] == version_of(task_id) != version


@pytest.mark.django_db(transaction=True)
def test_a_lease_that_lapsed_since_the_kept_answer_is_refused_and_writes_nothing(
    agent: Agent, checked: list[int], clock: Any
) -> None:
    task = created(agent, plan=chain_plan("a", "b"))
    lease = agent.acquire(task["id"], ttl_seconds=30)["lease_id"]
    d = agent.directive(task["id"], lease)
    op_key = agent.start(task["id"], lease, "a", d["task_version"]).json()["op_key"]
    clock.advance(timedelta(minutes=10))  # past the ttl and its grace
    rows = snapshot()
    path = f"/tasks/{task['id']}/operations/{op_key}/outcome"
    headers = {"Reckon_Lease": str(lease), "If_Match": f'"{d["task_version"] + 1}"', "Idempotency_Key": "late"}
    refused = agent.call("post", path, COMMITTED, **headers)
    assert refused.status_code == 409 and refused.json()["code"] in ("lease_expired", "lease_lost"), refused.content
    assert snapshot() == rows
    # Its answer was made before the write (the Idempotency-Key's record rides in the write's statement) and never
    # committed: nothing is kept that a later commit of the same version could be mistaken for.
    assert steps.RECENT.get(task["id"]) is None
    assert task["id"] in checked


@pytest.mark.django_db(transaction=True)
def test_a_write_rolled_back_is_not_kept(make_task: Callable[..., Task]) -> None:
    task = make_task(plan=chain_plan("a"))
    steps.RECENT.clear()
    read = steps._kept(task_snapshot(task_id=task.pk))  # outside a transaction: kept at once
    assert steps.RECENT.get(task.pk) is read
    with transaction.atomic():
        moved = replace(read, task=Task(**{**fields(read.task), "version": read.version + 1}))
        steps._kept(moved)
        transaction.set_rollback(True)
    assert steps.RECENT.get(task.pk) is read
    steps.RECENT.clear()


@pytest.mark.django_db
def test_a_kept_snapshot_of_another_task_under_the_same_id_is_not_used(make_task: Callable[..., Task]) -> None:
    """SQLite may give a new task the id of a deleted one: the task's uid, not its id, says it is the same task."""
    task = make_task(plan=chain_plan("a", "b"))
    known = task_snapshot(task_id=task.pk)
    with CaptureQueriesContext(connection) as reused:
        assert task_snapshot(task_id=task.pk, known=known).nodes is known.nodes
    impostor = replace(known, task=Task(**{**fields(known.task), "uid": Task().uid}))
    with CaptureQueriesContext(connection) as full:
        snap = task_snapshot(task_id=task.pk, known=impostor)
    assert snap.nodes is not impostor.nodes and [n.key for n in snap.nodes] == ["a", "b"]
    assert len(reused) == 1 and len(full) == 3


@pytest.mark.django_db
def test_writes_leave_the_snapshot_they_were_decided_on_as_it_was(make_task: Callable[..., Task]) -> None:
    """A kept snapshot may be read by another request while a write made on it commits: the write copies what it
    changes, and the snapshot's operations still point to its own nodes."""
    task = make_task(plan=chain_plan("a", "b"))
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    first = operation_start(task_snapshot(task_id=task.pk, lease=lease), "a", lease=lease).snapshot
    before = ([fields(n) for n in first.nodes], [(fields(op), op.node) for op in first.unsettled])
    op_key = first.unsettled[0].op_key

    after = record_outcome(first, op_key, Committed(remote_id="r"), lease=lease, start_next=True).snapshot

    assert ([fields(n) for n in first.nodes], [(fields(op), op.node) for op in first.unsettled]) == before
    assert all(op.node in first.nodes for op in first.unsettled)
    assert after.version > first.version and after.node("a").status == "succeeded"  # type: ignore[union-attr]


@pytest.mark.django_db
def test_a_node_changed_under_an_operation_not_written_is_a_copy_in_the_new_snapshot(
    make_task: Callable[..., Task],
) -> None:
    """The write changes a node whose open operation it does not write: the new snapshot's operation points to the
    changed node, the old snapshot's operation still to the old one."""
    task = make_task(plan=chain_plan("a", "b"))
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    old = operation_start(task_snapshot(task_id=task.pk, lease=lease), "a", lease=lease).snapshot
    (op,) = old.unsettled
    node_before = op.node

    new = after_write(
        old, task=old.task, nodes={op.node_id: {"status": "failed"}}, operations=[], now=old.now, lease_expires_at=None
    )

    assert op.node is node_before and op.node.status != "failed"
    (moved,) = new.unsettled
    assert moved.node.status == "failed" and moved.node is new.node("a") and moved is not op


def test_recent_snapshots_keep_the_latest_version_within_their_bound() -> None:
    def snap(task_id: int, version: int, nodes: int = 1, uid: Any = None) -> Snapshot:
        task = Task(id=task_id, version=version, **({"uid": uid} if uid is not None else {}))
        return Snapshot(task=task, nodes=tuple(Node() for _ in range(nodes)), unsettled=(), now=timezone.now())

    recent = RecentSnapshots(max_rows=10)
    newer = snap(1, 5)
    recent.keep(newer)
    recent.keep(replace(newer, task=Task(id=1, version=4, uid=newer.task.uid)))  # an older answer, kept late
    assert recent.get(1) is newer
    other_task = snap(1, 2)  # the same id, another task (its own uid): the later keep wins
    recent.keep(other_task)
    assert recent.get(1) is other_task
    recent.keep(snap(2, 1, nodes=4))
    recent.keep(snap(3, 1, nodes=4))  # 2 + 5 + 5 rows > 10: the least recently kept goes
    assert recent.get(1) is None and recent.get(2) is not None and recent.get(3) is not None
    recent.keep(snap(4, 1, nodes=20))  # larger than the bound: not kept, nothing dropped for it
    assert recent.get(4) is None and recent.get(3) is not None
    none = RecentSnapshots(max_rows=0)  # RECKON_API_SNAPSHOT_ROWS=0: every request reads the task whole
    none.keep(snap(5, 1))
    assert none.get(5) is None


@pytest.mark.django_db
def test_a_new_connection_to_a_server_forgets_every_kept_snapshot(make_task: Callable[..., Task]) -> None:
    """A new connection may reach another server (a standby promoted after a failover may not hold a version kept
    here): nothing kept before it is used after it. A SQLite file has no other server: a new connection to the same
    file (runserver opens one per request thread) keeps them; one to another file forgets them."""
    from django.db.backends.signals import connection_created

    task = make_task(plan=chain_plan("a"))
    kept = task_snapshot(task_id=task.pk)

    def opened(vendor: str, name: str) -> bool:
        """Whether the snapshot is still kept after a connection to (vendor, name) opened."""
        steps.RECENT.keep(kept)
        link = SimpleNamespace(vendor=vendor, settings_dict={"NAME": name})
        connection_created.send(sender=type(connection), connection=link)
        return steps.RECENT.get(task.pk) is not None

    assert not opened("postgresql", "reckon")
    assert not opened("postgresql", "reckon"), "every new connection to a server, the same name or not"
    assert not opened("sqlite", "/data/a.sqlite3"), "the first connection to a file: nothing known of it"
    assert opened("sqlite", "/data/a.sqlite3")
    assert not opened("sqlite", "/data/b.sqlite3")
    assert not opened("postgresql", "/data/b.sqlite3")
    # The real signal, from this test's own connection: a second connection to its database.
    connection_created.send(sender=type(connection), connection=connection)
    steps.RECENT.keep(kept)
    connection_created.send(sender=type(connection), connection=connection)
    assert (steps.RECENT.get(task.pk) is not None) == (connection.vendor == "sqlite")


@pytest.mark.django_db(transaction=True)
def test_a_request_row_changed_by_hand_is_refused_though_the_snapshot_was_reused(
    agent: Agent, reuses: list[int]
) -> None:
    """An operation's row changed behind the version (raw SQL, no event) is still caught before it is sent again:
    the check reads the row itself, not the snapshot a process kept."""
    task_id, lease, op_key, version = started(agent, ("a", "b"))
    path = f"/tasks/{task_id}/operations/{op_key}/outcome"
    not_yet = agent.call("post", path, {"result": "not_found"}, Reckon_Lease=str(lease), If_Match=f'"{version}"')
    assert not_yet.status_code == 200, not_yet.content
    d = agent.directive(task_id, lease)
    assert (d["kind"], d["node_key"]) == ("execute", "a"), d
    Operation.objects.filter(op_key=op_key).update(target="tgt/prod/everything")
    rows = snapshot()

    again = agent.start(task_id, lease, "a", d["task_version"])

    problem_of(again, 409, "stored_fact_altered")
    assert snapshot() == rows
    assert task_id in reuses  # decided on the kept snapshot: the row was read again all the same


@pytest.mark.django_db(transaction=True)
def test_after_a_refusal_the_next_request_reads_the_task_whole(agent: Agent, reuses: list[int]) -> None:
    """A refused request keeps nothing: a node changed behind the version makes the write refuse, and the next
    request must see the row as the database holds it, not the snapshot kept before."""
    task_id, lease, op_key, version = started(agent, ("a", "b"))
    Node.objects.filter(task_id=task_id, key="a").update(status="failed")  # behind the version
    refused = outcome(agent, task_id, lease, op_key, version)
    assert refused.status_code in (409, 412), refused.content
    assert steps.RECENT.get(task_id) is None
    assert task_id in reuses  # the refused request was decided on the kept snapshot
    reused_before = reuses.count(task_id)

    agent.directive(task_id, lease)

    assert reuses.count(task_id) == reused_before  # read whole: nothing was kept to reuse


@pytest.mark.django_db(transaction=True)
def test_an_answer_made_before_a_write_the_database_then_refuses_is_not_kept(
    agent: Agent, checked: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an Idempotency-Key the answer is made before the write (its record rides in the write's statement): if
    the database then refuses the write (a row changed under the version), that answer's snapshot never existed
    and must not be kept — a later commit of the same version would be mistaken for it."""
    task_id, lease, op_key, version = started(agent)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise VersionConflict("a row of the change changed under the task version")

    monkeypatch.setattr(cas, "_run", refused)
    path = f"/tasks/{task_id}/operations/{op_key}/outcome"
    headers = {"Reckon_Lease": str(lease), "If_Match": f'"{version}"', "Idempotency_Key": "refused-late"}
    problem_of(agent.call("post", path, COMMITTED, **headers), 412, "version_conflict")
    assert task_id in checked  # the answer was made on the kept snapshot
    assert steps.RECENT.get(task_id) is None


@pytest.mark.django_db(transaction=True)
def test_a_grant_whose_first_start_is_refused_stands_answers_no_next_and_keeps_nothing(
    agent: Agent, checked: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST …/lease`` with start_next: the task moved between the grant and the first node's start (a race made
    here by the start refusing). The lease stands, ``next`` is null, no operation is written, and the snapshot the
    answer was made at is not kept: the agent's next request reads the task whole."""
    task = created(agent, plan=chain_plan("a"))

    def moved(*args: Any, **kwargs: Any) -> Any:
        raise VersionConflict("the task moved")

    monkeypatch.setattr(steps, "operation_start", moved)
    answered = agent.call("post", f"/tasks/{task['id']}/lease", {"start_next": True})

    assert answered.status_code == 201, answered.content
    assert answered.json()["next"] is None
    assert Lease.objects.filter(pk=answered.json()["lease_id"], released_at__isnull=True).exists()
    assert not Operation.objects.filter(task_id=task["id"]).exists()
    assert steps.RECENT.get(task["id"]) is None


# --- a snapshot a few versions back: its nodes lent when the log between changed none --------------------------------


@pytest.mark.django_db
def test_a_known_snapshot_lends_its_nodes_across_writes_that_changed_none(
    make_task: Callable[..., Task], admin: Principal
) -> None:
    """A cancel (the task row and its event only) moves the version: the snapshot read with the one before it reuses
    its nodes — the log between says no node changed — and equals a full read in everything a decision reads."""
    task = make_task(plan=chain_plan("a", "b"))
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    known = task_snapshot(task_id=task.pk, lease=lease)
    task_request_cancel(actor=admin, task_id=task.pk, reason="stop it")
    later = task_snapshot(task_id=task.pk, lease=lease, known=known)
    assert later.version == known.version + 1 and later.nodes is known.nodes
    assert later.task.cancel_requested_at is not None
    same(later, task_snapshot(task_id=task.pk, lease=lease))


@pytest.mark.django_db
def test_a_node_written_between_makes_the_read_whole(make_task: Callable[..., Task]) -> None:
    """A node's write (its start) between the two versions: the nodes are read again, never lent."""
    task = make_task(plan=chain_plan("a", "b"))
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    known = task_snapshot(task_id=task.pk, lease=lease)
    operation_start(known, "a", lease=lease)
    whole = task_snapshot(task_id=task.pk, lease=lease, known=known)
    assert whole.nodes is not known.nodes and whole.node("a").status == "running"  # type: ignore[union-attr]
    same(whole, task_snapshot(task_id=task.pk, lease=lease))


@pytest.mark.parametrize(
    ("event", "payload", "lends"),
    [
        ("cleanup_registered", {"operations": {"k": {"node": "p1/a", "status": "intent"}}, "data": {}}, True),
        ("cancel_requested", {"task": {"cancel_requested_at": "2026-12-04T00:00:00+00:00"}}, True),
        ("node_succeeded", {"nodes": {"p1/a": {"status": "succeeded"}}}, False),
        ("plan_accepted", {"task": {"plan_version": 2}, "data": {"plan_digest": "sha256:x"}}, False),
        ("operation_rejected", {"operations": {"k": {"status": "rejected"}}}, False),  # a node's retries
        ("odd", {"operations": ["not", "a", "mapping"]}, False),
        ("odd", ["not an object"], False),
    ],
)
def test_what_in_the_log_keeps_a_known_snapshots_nodes(event: str, payload: Any, lends: bool) -> None:
    assert snapshot_module.lends_nodes(event, payload) is lends


@pytest.mark.django_db
def test_a_known_snapshot_too_far_back_lends_nothing(make_task: Callable[..., Task]) -> None:
    task = make_task(plan=chain_plan("a"))
    known = task_snapshot(task_id=task.pk)
    far = Task.objects.get(pk=task.pk)
    far.version = known.version + snapshot_module.DELTA_VERSIONS + 1
    assert not snapshot_module._nodes_unchanged_since(None, known, far)  # decided before any read
