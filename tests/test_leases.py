"""Leases (DESIGN §3.3, §7): one authority at a time, judged on the database server's clock.

Every refusal is checked against ``snapshot()``: a refused call leaves every row as it was.
"""

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Self

import pytest
from django.conf import settings as django_settings
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django.fixtures import Settings

import leases.clock
import tasks.engine.cas
from leases import services
from leases.clock import ControllableClock, DatabaseClock
from leases.errors import LeaseExpired, LeaseHeld, LeaseLost, RenewalOutOfOrder
from leases.models import Lease, ReleaseReason
from leases.services import lease_acquire, lease_open, lease_release, lease_renew
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.models import Task
from tests.conftest import snapshot

TTL = timedelta(seconds=30)
TICK = timedelta(microseconds=1)  # the finest step both databases store


def grace() -> timedelta:
    value: timedelta = django_settings.RECKON_LEASE_GRACE
    return value


def acquire(task: Task, holder: str = "agent-1", ttl: timedelta = TTL) -> Lease:
    return lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=holder, ttl=ttl)


# --- acquire ---------------------------------------------------------------------------------------------------


def test_it_grants_epoch_one_on_a_free_task_on_the_database_clock(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    now = clock.now()

    lease = acquire(task, ttl=TTL)

    assert (lease.epoch, lease.renewal_seq) == (1, 0)
    assert lease.task_version_at_grant == task.version
    assert (lease.granted_at, lease.expires_at) == (now, now + TTL)
    assert (lease.holder_kind, lease.holder_id) == ("agent", "agent-1")
    assert lease.released_at is None and lease.release_reason == ""
    assert lease_open(task.pk) == lease


def test_it_grants_the_configured_ttl_when_none_is_given(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()

    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1")

    assert lease.expires_at == clock.now() + django_settings.RECKON_LEASE_TTL


@pytest.mark.parametrize("holder", ["agent-2", "agent-1"], ids=["another-holder", "the-same-holder"])
def test_it_refuses_a_second_grant_while_the_lease_is_live(
    make_task: Callable[..., Task], clock: ControllableClock, holder: str
) -> None:
    task = make_task()
    lease = acquire(task)
    clock.set(lease.expires_at - TICK)
    before = snapshot()

    with pytest.raises(LeaseHeld) as refused:
        acquire(task, holder=holder)

    assert refused.value.holder == "agent:agent-1"
    assert snapshot() == before


@pytest.mark.parametrize(
    "after_expiry",
    [timedelta(0), TICK, grace() - TICK],
    ids=["at-expiry", "one-tick-after-expiry", "one-tick-before-the-grace-ends"],
)
def test_it_lets_nobody_else_acquire_inside_the_grace(
    make_task: Callable[..., Task], clock: ControllableClock, after_expiry: timedelta
) -> None:
    task = make_task()
    lease = acquire(task)
    clock.set(lease.expires_at + after_expiry)
    before = snapshot()

    with pytest.raises(LeaseHeld):
        acquire(task, holder="agent-2")

    assert snapshot() == before


def test_it_grants_the_next_epoch_once_expiry_plus_grace_has_passed(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    old = acquire(task)
    clock.set(old.expires_at + grace())  # the first instant the grace is over

    new = acquire(task, holder="agent-2")

    old.refresh_from_db()
    assert (old.released_at, old.release_reason) == (clock.now(), ReleaseReason.EXPIRED)
    assert new.epoch == old.epoch + 1
    assert (new.holder_id, new.renewal_seq, new.released_at) == ("agent-2", 0, None)
    assert (new.granted_at, new.expires_at) == (clock.now(), clock.now() + TTL)
    assert lease_open(task.pk) == new


@pytest.mark.django_db(transaction=True)
def test_a_race_between_two_acquirers_grants_exactly_one_lease(
    make_task: Callable[..., Task], clock: ControllableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads, two connections. On PostgreSQL both pass the open-lease check before either inserts,
    so the constraints, not the check, pick the winner; SQLite's IMMEDIATE transactions serialise them."""
    task = make_task()
    task_id = task.pk
    if connection.vendor == "postgresql":
        barrier = threading.Barrier(2, timeout=10)
        read_state = services._task_state

        def both_past_the_check(task_id: int) -> tuple[int, str]:
            barrier.wait()
            return read_state(task_id)

        monkeypatch.setattr(services, "_task_state", both_past_the_check)
    outcomes: dict[str, Lease | BaseException] = {}

    def contend(holder: str) -> None:
        try:
            outcomes[holder] = lease_acquire(task_id=task_id, holder_kind="agent", holder_id=holder, ttl=TTL)
        except BaseException as exc:  # recorded and asserted on below
            outcomes[holder] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=contend, args=(holder,)) for holder in ("agent-1", "agent-2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    granted = [o for o in outcomes.values() if isinstance(o, Lease)]
    refused = [o for o in outcomes.values() if isinstance(o, LeaseHeld)]
    assert (len(granted), len(refused)) == (1, 1), outcomes
    assert granted[0].epoch == 1
    assert refused[0].holder == f"agent:{granted[0].holder_id}"
    if connection.vendor == "postgresql":
        assert isinstance(refused[0].__cause__, IntegrityError)  # the constraint decided, not the check
    assert list(Lease.objects.filter(task_id=task_id).values_list("epoch", "holder_id")) == [(1, granted[0].holder_id)]


# --- renew -----------------------------------------------------------------------------------------------------


def test_the_same_holder_renews_inside_the_grace_and_the_lease_lives_again(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    lease = acquire(task)
    clock.set(lease.expires_at + grace() / 2)

    renewed = lease_renew(lease=lease, expected_renewal_seq=0, ttl=TTL)

    assert (renewed.pk, renewed.epoch, renewed.renewal_seq) == (lease.pk, lease.epoch, 1)
    assert renewed.expires_at == clock.now() + TTL
    assert renewed.released_at is None
    # Past the old expiry plus grace, the renewed lease still keeps everybody else out.
    clock.set(lease.expires_at + grace() + TICK)
    with pytest.raises(LeaseHeld):
        acquire(task, holder="agent-2")


@pytest.mark.parametrize(
    "after_expiry",
    [timedelta(0), TICK, grace() - TICK],
    ids=["exactly-at-expiry", "one-tick-after-expiry", "one-tick-before-the-grace-ends"],
)
def test_it_renews_from_expiry_until_the_last_tick_of_the_grace(
    make_task: Callable[..., Task], clock: ControllableClock, after_expiry: timedelta
) -> None:
    task = make_task()
    lease = acquire(task)
    clock.set(lease.expires_at + after_expiry)

    renewed = lease_renew(lease=lease, expected_renewal_seq=0, ttl=TTL)

    assert (renewed.renewal_seq, renewed.expires_at) == (1, clock.now() + TTL)


def test_it_refuses_a_renewal_exactly_at_the_end_of_the_grace(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    lease = acquire(task)
    clock.set(lease.expires_at + grace())  # the rule is expires_at > now - grace
    before = snapshot()

    with pytest.raises(LeaseExpired):
        lease_renew(lease=lease, expected_renewal_seq=0, ttl=TTL)

    assert snapshot() == before


@pytest.mark.parametrize(
    ("renewals_before", "carried"), [(1, 0), (0, 1), (2, 1)], ids=["replayed", "from-the-future", "stale"]
)
def test_it_refuses_a_renewal_with_the_wrong_renewal_seq(
    make_task: Callable[..., Task], clock: ControllableClock, renewals_before: int, carried: int
) -> None:
    task = make_task()
    lease = acquire(task)
    for seq in range(renewals_before):
        clock.advance(timedelta(seconds=1))
        lease_renew(lease=lease, expected_renewal_seq=seq, ttl=TTL)
    clock.advance(timedelta(seconds=1))
    before = snapshot()

    with pytest.raises(RenewalOutOfOrder) as refused:
        lease_renew(lease=lease, expected_renewal_seq=carried, ttl=TTL)

    assert (refused.value.expected, refused.value.actual) == (carried, renewals_before)
    assert snapshot() == before


def test_it_refuses_to_renew_a_released_lease(make_task: Callable[..., Task], clock: ControllableClock) -> None:
    task = make_task()
    lease = acquire(task)
    lease_release(lease=lease)
    clock.advance(timedelta(seconds=1))
    before = snapshot()

    with pytest.raises(LeaseLost):
        lease_renew(lease=lease, expected_renewal_seq=0, ttl=TTL)

    assert snapshot() == before


def test_it_refuses_to_renew_a_superseded_lease(make_task: Callable[..., Task], clock: ControllableClock) -> None:
    task = make_task()
    old = acquire(task)
    clock.set(old.expires_at + grace())
    acquire(task, holder="agent-2")
    before = snapshot()

    with pytest.raises(LeaseLost):
        lease_renew(lease=old, expected_renewal_seq=0, ttl=TTL)

    assert snapshot() == before


# --- release ---------------------------------------------------------------------------------------------------


def test_it_releases_a_live_lease_and_frees_the_task(make_task: Callable[..., Task], clock: ControllableClock) -> None:
    task = make_task()
    lease = acquire(task)
    clock.advance(timedelta(seconds=5))

    released = lease_release(lease=lease)

    assert (released.released_at, released.release_reason) == (clock.now(), ReleaseReason.RELEASED)
    assert lease_open(task.pk) is None
    assert acquire(task, holder="agent-2").epoch == 2


def test_it_refuses_to_release_twice(make_task: Callable[..., Task], clock: ControllableClock) -> None:
    task = make_task()
    lease = acquire(task)
    lease_release(lease=lease)
    clock.advance(timedelta(seconds=1))
    before = snapshot()

    with pytest.raises(LeaseLost):
        lease_release(lease=lease)

    assert snapshot() == before


def test_it_refuses_to_release_a_superseded_lease(make_task: Callable[..., Task], clock: ControllableClock) -> None:
    task = make_task()
    old = acquire(task)
    clock.set(old.expires_at + grace())
    acquire(task, holder="agent-2")
    before = snapshot()

    with pytest.raises(LeaseLost):
        lease_release(lease=old)

    assert snapshot() == before


# --- epochs and the constraints behind them --------------------------------------------------------------------


def test_epochs_grow_by_one_per_grant_and_never_repeat_for_a_task(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task, other = make_task(), make_task()
    epochs = []
    for round_ in range(3):
        lease = acquire(task, holder=f"agent-{round_}")
        epochs.append(lease.epoch)
        if round_ % 2:
            clock.set(lease.expires_at + grace())  # lapse: the next acquire closes it
        else:
            lease_release(lease=lease)

    assert epochs == [1, 2, 3]
    assert acquire(other).epoch == 1  # epochs count per task


def _lease_row(task: Task, *, epoch: int, released: bool, now: datetime) -> Lease:
    return Lease(
        task=task,
        holder_kind="agent",
        holder_id="intruder",
        task_version_at_grant=task.version,
        granted_at=now,
        expires_at=now + TTL,
        epoch=epoch,
        released_at=now if released else None,
        release_reason=ReleaseReason.RELEASED if released else "",
    )


def test_the_database_refuses_a_repeated_epoch(make_task: Callable[..., Task], clock: ControllableClock) -> None:
    task = make_task()
    lease = acquire(task)
    lease_release(lease=lease)
    before = snapshot()

    with pytest.raises(IntegrityError), transaction.atomic():
        _lease_row(task, epoch=lease.epoch, released=True, now=clock.now()).save(force_insert=True)

    assert snapshot() == before


def test_the_database_refuses_a_second_open_lease_on_a_task(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    lease = acquire(task)
    before = snapshot()

    with pytest.raises(IntegrityError), transaction.atomic():
        _lease_row(task, epoch=lease.epoch + 1, released=False, now=clock.now()).save(force_insert=True)

    assert snapshot() == before


# --- the clock: decisions are made on the database server's clock ------------------------------------------------

SKEWS = [timedelta(minutes=10), -timedelta(minutes=10)]
SKEW_IDS = ["app-clock-ahead", "app-clock-behind"]


@pytest.fixture
def skewed_app_clock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[timedelta]:
    """Python's clock (django.utils.timezone.now and datetime.now in the lease and CAS modules) off by ``param``."""
    skew: timedelta = request.param
    real_now = timezone.now

    class SkewedDatetime(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Self:
            moment = datetime.now(tz) + skew
            return cls.fromtimestamp(moment.timestamp(), tz)

    monkeypatch.setattr(timezone, "now", lambda: real_now() + skew)
    monkeypatch.setattr(leases.clock, "datetime", SkewedDatetime)
    monkeypatch.setattr(tasks.engine.cas, "datetime", SkewedDatetime)
    assert abs(timezone.now() - real_now() - skew) < timedelta(seconds=1)
    yield skew


def database_server_now() -> datetime:
    """The server's time, asked without going through leases.clock."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            value: datetime = cursor.fetchone()[0]
            return value
        cursor.execute("SELECT datetime('now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


@pytest.mark.django_db
def test_the_database_clock_reads_an_aware_utc_time_from_the_database_server() -> None:
    value = DatabaseClock().now()

    assert value.tzinfo is not None and value.utcoffset() == timedelta(0)
    assert abs(value - database_server_now()) < timedelta(seconds=2)


@pytest.mark.django_db
@pytest.mark.parametrize("skewed_app_clock", SKEWS, ids=SKEW_IDS, indirect=True)
def test_the_database_clock_ignores_a_skewed_app_clock(skewed_app_clock: timedelta) -> None:
    value = DatabaseClock().now()

    assert abs(value - database_server_now()) < timedelta(seconds=2)
    assert abs(value - timezone.now()) > timedelta(minutes=9)


@pytest.mark.django_db
def test_the_database_clock_moves_inside_a_transaction() -> None:
    with transaction.atomic():
        first = DatabaseClock().now()
        time.sleep(0.02)
        second = DatabaseClock().now()

    assert second > first


def estimate_and_count() -> tuple[datetime, int]:
    with CaptureQueriesContext(connection) as queries:
        value = DatabaseClock().estimate()
    return value, len(queries)


@pytest.mark.django_db
@pytest.mark.parametrize("skewed_app_clock", SKEWS, ids=SKEW_IDS, indirect=True)
def test_the_estimated_database_clock_reads_once_then_follows_the_server_not_the_app_clock(
    skewed_app_clock: timedelta,
) -> None:
    connection.reckon_clock_anchor = None  # type: ignore[attr-defined]
    first, reads = estimate_and_count()
    assert reads == 1
    time.sleep(0.05)
    second, reads = estimate_and_count()
    reading = DatabaseClock().now()

    assert reads == 0  # estimated: no round trip
    assert second - first >= timedelta(milliseconds=50)
    # Within a few milliseconds of a later reading (SQLite reads in whole milliseconds), never a minute off.
    assert reading - timedelta(milliseconds=20) <= second <= reading + timedelta(milliseconds=20)
    assert abs(second - timezone.now()) > timedelta(minutes=9)


@pytest.mark.django_db
def test_the_estimated_database_clock_reads_again_after_its_interval_and_on_another_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection.reckon_clock_anchor = None  # type: ignore[attr-defined]
    assert estimate_and_count()[1] == 1
    assert estimate_and_count()[1] == 0
    # A reading taken on another connection (before a reconnect or a failover) is not trusted.
    _old, reading, tick = connection.reckon_clock_anchor  # type: ignore[attr-defined]
    connection.reckon_clock_anchor = (object(), reading, tick)  # type: ignore[attr-defined]
    assert estimate_and_count()[1] == 1
    monkeypatch.setattr(leases.clock, "ANCHOR_SECONDS", 0.0)
    time.sleep(0.001)
    assert estimate_and_count()[1] == 1


@pytest.mark.django_db
def test_a_write_never_records_a_time_before_the_tasks_last_write(make_task: Callable[..., Task]) -> None:
    """Each process estimates the database clock on its own: a task's times still follow its versions."""
    task = make_task()
    lease = acquire(task)
    ahead = database_server_now() + timedelta(minutes=1)  # as another process's estimate, a little ahead, wrote it
    Task.objects.filter(pk=task.pk).update(updated_at=ahead)

    applied = compare_and_set(task.pk, task.version, Change(event="touched"), lease=lease)

    assert applied.at == ahead
    stored = Task.objects.get(pk=task.pk)
    assert stored.updated_at == ahead
    assert stored.events.get(seq=applied.version).created_at == ahead


@pytest.mark.parametrize("skewed_app_clock", SKEWS, ids=SKEW_IDS, indirect=True)
def test_live_lease_decisions_do_not_follow_a_skewed_app_clock(
    make_task: Callable[..., Task], skewed_app_clock: timedelta
) -> None:
    task = make_task()

    lease = acquire(task, ttl=TTL)

    assert abs(lease.granted_at - database_server_now()) < timedelta(seconds=2)
    assert lease.expires_at == lease.granted_at + TTL
    before = snapshot()
    with pytest.raises(LeaseHeld):  # an app clock 10 minutes ahead would call it lapsed already
        acquire(task, holder="agent-2")
    assert snapshot() == before
    renewed = lease_renew(lease=lease, expected_renewal_seq=0, ttl=TTL)
    assert renewed.renewal_seq == 1
    assert abs(renewed.expires_at - TTL - database_server_now()) < timedelta(seconds=2)
    applied = compare_and_set(task.pk, task.version, Change(event="touched"), lease=renewed)
    assert applied.version == task.version + 1
    assert abs(applied.at - database_server_now()) < timedelta(seconds=2)


@pytest.mark.parametrize("skewed_app_clock", SKEWS, ids=SKEW_IDS, indirect=True)
def test_lease_expiry_does_not_follow_a_skewed_app_clock(
    make_task: Callable[..., Task], skewed_app_clock: timedelta, settings: Settings
) -> None:
    settings.RECKON_LEASE_GRACE = timedelta(milliseconds=50)
    task = make_task()
    lease = acquire(task, ttl=timedelta(milliseconds=50))
    deadline = lease.expires_at + timedelta(milliseconds=50)
    while DatabaseClock().now() <= deadline:
        time.sleep(0.01)
    before = snapshot()

    with pytest.raises(LeaseExpired):  # an app clock 10 minutes behind would still call it live
        lease_renew(lease=lease, expected_renewal_seq=0)
    assert snapshot() == before
    successor = acquire(task, holder="agent-2")

    assert successor.epoch == lease.epoch + 1
    lease.refresh_from_db()
    assert lease.release_reason == ReleaseReason.EXPIRED
    with pytest.raises(LeaseLost):
        compare_and_set(task.pk, task.version, Change(event="touched"), lease=lease)
