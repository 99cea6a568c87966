"""compare_and_set (DESIGN §3.3, §3.7): every state write checks the task version and the caller's lease epoch,
judges expiry on the database server's clock, and appends exactly one chained event — or writes nothing.
"""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings

from leases.clock import ControllableClock
from leases.errors import LeaseExpired, LeaseLost
from leases.models import Lease
from leases.services import lease_acquire, lease_release, lease_renew
from tasks.core.errors import InputsRecheckRequired, InvalidTransition, TaskNotRunnable, VersionConflict
from tasks.core.lifecycle import (
    OPERATION_TRANSITIONS,
    TASK_TRANSITIONS,
    Actor,
    ChangeKind,
    NodeStatus,
    OperationStatus,
    TaskStatus,
    permitted,
)
from tasks.decide.change import Change
from tasks.engine.cas import Applied, compare_and_set
from tasks.engine.events import find_log_problem
from tasks.models import Event, Node, Task
from tests.conftest import snapshot

TTL = timedelta(seconds=30)
TICK = timedelta(microseconds=1)


def grace() -> timedelta:
    value: timedelta = settings.RECKON_LEASE_GRACE
    return value


def start() -> Change:
    """A legal change for a freshly created (pending) task."""
    return Change(event="task_started", task={"status": TaskStatus.RUNNING.value}, data={"by": "agent:agent-1"})


def acquire(task: Task, holder: str = "agent-1") -> Lease:
    return lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=holder, ttl=TTL)


def rows_of(task: Task) -> dict[str, Any]:
    """Everything stored for one task, by table."""
    return {
        "task": Task.objects.filter(pk=task.pk).values().get(),
        "events": list(Event.objects.filter(task=task).order_by("seq").values()),
        "nodes": list(Node.objects.filter(task=task).order_by("pk").values()),
        "leases": list(Lease.objects.filter(task=task).order_by("pk").values()),
    }


def test_it_applies_a_change_and_appends_one_chained_event(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    clock.advance(timedelta(seconds=3))
    v = task.version
    previous = Event.objects.get(task=task, seq=v)
    events_before = Event.objects.filter(task=task).count()

    applied = compare_and_set(task.pk, v, start(), lease=lease)

    assert applied == Applied(version=v + 1, at=clock.now())
    task.refresh_from_db()
    assert (task.version, task.status, task.updated_at) == (v + 1, TaskStatus.RUNNING, clock.now())
    assert Event.objects.filter(task=task).count() == events_before + 1
    event = Event.objects.get(task=task, seq=v + 1)
    assert (event.type, event.prev_digest, event.created_at) == ("task_started", previous.digest, clock.now())
    assert event.payload == {"task": {"status": "running"}, "data": {"by": "agent:agent-1"}}
    assert find_log_problem(task) is None


def test_a_builder_change_sees_the_task_at_the_expected_version_and_the_database_time(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    seen: list[tuple[int, datetime]] = []

    def build(current: Task, now: datetime) -> Change:
        seen.append((current.version, now))
        return start()

    compare_and_set(task.pk, task.version, build, lease=lease)

    assert seen == [(task.version, clock.now())]


def test_it_refuses_a_stale_expected_version(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    compare_and_set(task.pk, task.version, start(), lease=lease)
    before = snapshot()

    with pytest.raises(VersionConflict) as refused:
        compare_and_set(task.pk, task.version, Change(event="touched"), lease=lease)

    assert refused.value.details == {"expected": task.version, "actual": task.version + 1}
    assert snapshot() == before


def test_it_refuses_a_stale_lease_epoch_even_with_the_right_version(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    old = agent_lease(task, ttl=TTL)
    clock.set(old.expires_at + grace())
    new = agent_lease(task, holder="agent-2", ttl=TTL)
    assert new.epoch == old.epoch + 1
    task.refresh_from_db()
    before = snapshot()

    with pytest.raises(LeaseLost) as refused:
        compare_and_set(task.pk, task.version, start(), lease=old)

    assert refused.value.epoch == old.epoch
    assert snapshot() == before


def test_it_refuses_a_lease_row_replayed_with_an_old_epoch(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    """The fencing token is the epoch, not the row id: a caller holding the live row with a forged epoch loses."""
    task = make_task()
    old = agent_lease(task, ttl=TTL)
    lease_release(lease=old)
    new = agent_lease(task, holder="agent-2", ttl=TTL)
    forged = Lease.objects.get(pk=new.pk)
    forged.epoch = old.epoch
    before = snapshot()

    with pytest.raises(LeaseLost):
        compare_and_set(task.pk, task.version, start(), lease=forged)

    assert snapshot() == before


@pytest.mark.parametrize(
    "after_expiry",
    [timedelta(0), TICK, grace() - TICK],
    ids=["exactly-at-expiry", "one-tick-after-expiry", "last-tick-of-the-grace"],
)
def test_it_refuses_an_expired_lease_even_inside_the_grace(
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    clock: ControllableClock,
    after_expiry: timedelta,
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    clock.set(lease.expires_at + after_expiry)
    before = snapshot()

    with pytest.raises(LeaseExpired):
        compare_and_set(task.pk, task.version, start(), lease=lease)

    assert snapshot() == before


def test_it_accepts_a_lease_one_tick_before_expiry(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    clock.set(lease.expires_at - TICK)

    assert compare_and_set(task.pk, task.version, start(), lease=lease).version == task.version + 1


def test_a_lease_renewed_inside_the_grace_writes_again(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    clock.set(lease.expires_at + grace() / 2)
    lease_renew(lease=lease, expected_renewal_seq=0, ttl=TTL)

    # The caller's copy still carries the old expiry: the database row decides.
    assert compare_and_set(task.pk, task.version, start(), lease=lease).version == task.version + 1


def test_it_refuses_a_released_lease(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    lease_release(lease=lease)
    before = snapshot()

    with pytest.raises(LeaseLost):
        compare_and_set(task.pk, task.version, start(), lease=lease)

    assert snapshot() == before


def test_it_refuses_a_live_lease_of_another_task(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task, other = make_task(), make_task()
    agent_lease(task, ttl=TTL)
    others_lease = agent_lease(other, holder="agent-2", ttl=TTL)
    before = snapshot()

    with pytest.raises(LeaseLost):
        compare_and_set(task.pk, task.version, start(), lease=others_lease)

    assert snapshot() == before


def test_a_change_the_table_does_not_permit_in_this_status_is_refused_by_name(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    assert TaskStatus.PENDING not in permitted(ChangeKind.CLEANUP, Actor.AGENT)
    before = snapshot()

    with pytest.raises(TaskNotRunnable, match="pending: an agent may not cleanup"):
        compare_and_set(task.pk, task.version, Change(event="touched", kind=ChangeKind.CLEANUP), lease=lease)

    assert snapshot() == before


def test_a_failing_field_condition_raises_its_own_error(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    Task.objects.filter(pk=task.pk).update(inputs_recheck_required=True)
    change = Change(event="touched", kind=ChangeKind.START, requires={"inputs_recheck_required": False})
    before = snapshot()

    with pytest.raises(InputsRecheckRequired):
        compare_and_set(task.pk, task.version, change, lease=lease)

    assert snapshot() == before


def test_a_write_without_a_lease_must_name_a_person_or_the_system(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    before = snapshot()

    with pytest.raises(InvalidTransition, match="person or the system"):
        compare_and_set(task.pk, task.version, Change(event="touched", kind=ChangeKind.CANCEL), lease=None)

    assert snapshot() == before


@pytest.mark.parametrize(
    ("source", "target"),
    [(TaskStatus.PENDING, TaskStatus.COMPLETED), (TaskStatus.COMPLETED, TaskStatus.RUNNING)],
    ids=["pending-to-completed", "completed-to-running"],
)
def test_it_refuses_an_invalid_status_transition(
    make_task: Callable[..., Task],
    agent_lease: Callable[..., Lease],
    clock: ControllableClock,
    source: TaskStatus,
    target: TaskStatus,
) -> None:
    assert (source, target) not in TASK_TRANSITIONS
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    if source != task.status:
        for step in (TaskStatus.RUNNING, source):
            task.version = compare_and_set(
                task.pk, task.version, Change(event="moved", task={"status": step.value}), lease=lease
            ).version
    before = snapshot()

    # An agent's settling change may not touch an ended task at all (the table); otherwise the transition is refused.
    with pytest.raises(TaskNotRunnable if source == TaskStatus.COMPLETED else InvalidTransition):
        compare_and_set(task.pk, task.version, Change(event="moved", task={"status": target.value}), lease=lease)

    assert snapshot() == before


def test_a_failure_in_before_event_rolls_back_the_whole_change(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=TTL)
    node = Node.objects.filter(task=task).order_by("position").first()
    assert node is not None and node.status == NodeStatus.PENDING
    change = Change(event="task_started", task={"status": "running"}, nodes=[(node, {"status": "running"})])
    seen: list[int] = []

    def fail(current: Task, now: datetime) -> None:
        seen.append(current.version)  # the task row was already won when this runs
        raise RuntimeError("receipt store unavailable")

    before = snapshot()

    with pytest.raises(RuntimeError, match="receipt store unavailable"):
        compare_and_set(task.pk, task.version, change, lease=lease, before_event=fail)

    assert seen == [task.version + 1]
    assert snapshot() == before


def test_it_never_touches_another_task(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease], clock: ControllableClock
) -> None:
    task, other = make_task(), make_task()
    lease = agent_lease(task, ttl=TTL)
    agent_lease(other, holder="agent-2", ttl=TTL)
    others_node = Node.objects.filter(task=other).order_by("position").first()
    assert others_node is not None
    untouched = rows_of(other)

    compare_and_set(task.pk, task.version, start(), lease=lease)
    task.refresh_from_db()
    # A change that smuggles in another task's node is refused as a whole.
    with pytest.raises(VersionConflict):
        compare_and_set(
            task.pk,
            task.version,
            Change(event="node_started", nodes=[(others_node, {"status": NodeStatus.RUNNING.value})]),
            lease=lease,
        )

    assert rows_of(other) == untouched
    task.refresh_from_db()
    assert find_log_problem(task) is None and find_log_problem(other) is None


def test_terminal_task_statuses_only_move_to_quarantined() -> None:
    ends = {"completed", "failed", "stopped", "quarantined"}

    from_the_end = {(source, target) for source, target in TASK_TRANSITIONS if source in ends}

    assert from_the_end == {
        ("completed", "quarantined"),
        ("failed", "quarantined"),
        ("stopped", "quarantined"),
    }


def test_operation_transitions_are_exactly_the_documented_set() -> None:
    assert set(OPERATION_TRANSITIONS) == {
        ("intent", "dispatched"),
        ("intent", "rejected"),
        ("dispatched", "committed"),
        ("dispatched", "accepted"),
        ("dispatched", "rejected"),
        ("dispatched", "unknown"),
        ("dispatched", "intent"),
        ("accepted", "accepted"),
        ("accepted", "committed"),
        ("accepted", "rejected"),
        ("accepted", "unknown"),
        ("unknown", "committed"),
        ("unknown", "accepted"),
        ("unknown", "rejected"),
        ("unknown", "intent"),
        # an intent sent before ("not found", to be sent again) when a cancel came: a copy may still land
        ("intent", "unknown"),
    }


def test_a_cloned_row_is_the_copy_copy_would_make_and_shares_nothing_it_could_change() -> None:
    """The step copies rows it must not change under its caller (tasks.rows.clone): the same values, a state as
    ``copy.copy`` copies it (its own relation cache, no peers carried over)."""
    import copy

    from tasks.rows import clone

    node = Node(key="a", status="pending", task_id=7)
    node._state.adding, node._state.db = False, "default"
    parent = Task(pk=7, title="t")
    node._state.fields_cache["task"] = parent
    node._state.peers = ()  # what a fetched row carries (weak references to its batch)
    copied, made = copy.copy(node), clone(node)
    assert made.__dict__.keys() == node.__dict__.keys()
    assert {k: v for k, v in made.__dict__.items() if k != "_state"} == {
        k: v for k, v in node.__dict__.items() if k != "_state"
    }
    assert made._state.__dict__.keys() == copied._state.__dict__.keys()
    assert "peers" not in made._state.__dict__
    assert (made._state.db, made._state.adding) == ("default", False)
    assert made._state.fields_cache == {"task": parent}
    made.status = "running"
    made._state.fields_cache.clear()
    made._state.adding = True
    assert node.status == "pending" and node._state.fields_cache == {"task": parent} and not node._state.adding


@pytest.mark.parametrize("model", ["event", "operation", "receipt"])
def test_a_row_made_by_new_row_is_the_row_the_model_makes(model: str) -> None:
    """tasks.rows.new_row makes the rows the step makes on every commit without Model.__init__: the same fields,
    defaults made anew per row (no two rows share a dict), the related row cached, a state of an unsaved row."""
    from tasks.models import Operation, Receipt
    from tasks.rows import new_row

    at = datetime(2026, 1, 1, tzinfo=UTC)
    node = Node(pk=3, key="a", task_id=7)
    op = Operation(pk=5, node=node, op_key="k", request={"x": 1})
    cases: dict[str, tuple[type[Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
        "event": (Event, {"task_id": 7, "seq": 2, "type": "t", "digest": "d", "created_at": at}, {}, {}),
        "operation": (Operation, {"node_id": 3, "op_key": "k2", "action": "copy"}, {"node": node}, {"node": node}),
        "receipt": (Receipt, {"operation_id": 5, "remote_id": "r", "count": 2}, {"operation": op}, {"operation": op}),
    }
    cls, values, related, kwargs_related = cases[model]
    plain = {k: v for k, v in values.items() if not (k.endswith("_id") and k[:-3] in kwargs_related)}
    expected = cls(**plain, **kwargs_related)
    made, other = new_row(cls, values, related), new_row(cls, values, related)

    def fields(row: Any) -> dict[str, Any]:
        return {k: v for k, v in row.__dict__.items() if k != "_state"}

    assert fields(made) == fields(expected)
    assert made._state.adding and made._state.db is None and made.pk is None
    assert made._state.fields_cache == expected._state.fields_cache
    for name, value in fields(made).items():
        if isinstance(value, dict | list):
            assert value is not fields(other)[name], f"{name}: one default shared by two rows"


@pytest.mark.django_db
def test_the_batch_adapts_every_value_as_its_field_would() -> None:
    """tasks.engine.sql._adapt skips a field's own adaptation only where it would return the value unchanged (plain
    values; an aware datetime on PostgreSQL): for any other value it asks the field."""
    import warnings
    from decimal import Decimal

    from django.db import connection

    from tasks.engine.sql import RawJSON, _adapt
    from tasks.models import Operation, Receipt

    aware = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
    naive = aware.replace(tzinfo=None)
    cases: list[tuple[type[Any], str, Any]] = [
        (Operation, "registered_at", aware),
        (Operation, "registered_at", naive),
        (Operation, "settled_at", None),
        (Operation, "status", "committed"),
        (Operation, "status", OperationStatus.COMMITTED),
        (Operation, "dispatch_count", 3),
        (Operation, "request", {"a": [1, 2]}),
        (Receipt, "count", Decimal(4)),
        (Receipt, "data", {}),
    ]
    for model, name, value in cases:
        field = model._meta.get_field(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a naive datetime: the field warns, and makes it aware
            expected = field.get_db_prep_save(value, connection)
            (adapted,) = _adapt(model, (name,), [value])
        if hasattr(expected, "obj"):  # psycopg's Jsonb wrapper: compare what it wraps
            assert type(adapted) is type(expected) and adapted.obj == expected.obj, (name, value)
        else:  # the same value and type (a plain int where psycopg's Int4 wraps one: the same number stored)
            same_type = type(adapted) is type(expected) or (type(adapted) is int and isinstance(expected, int))
            assert adapted == expected and same_type, (name, value, adapted, expected)
    assert _adapt(Receipt, ("data",), [RawJSON('{"a":1}')]) == ['{"a":1}']
