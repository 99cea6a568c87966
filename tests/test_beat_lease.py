"""One beat sends, however many are started (leases/beat.py): the lease's rules on a controllable clock, racing
takers, and real ``celery beat`` processes against one database — only the holder sends; SIGKILL of the holder
hands the lease to a standby once the TTL has passed, never before; SIGTERM gives it back at once."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from kombu import Connection

from harness.killmatrix import database_url
from harness.wait_for import alive
from leases import clock as db_clock
from leases.beat import BEAT_LEASE, LeasedScheduler, beat_lease_hold, beat_lease_holder, beat_lease_release
from leases.clock import ControllableClock
from leases.models import BeatLease
from tests.simulator_fixture import ROOT

TTL = timedelta(seconds=30)

# -- the rules, on a controllable clock ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_one_holder_until_its_ttl_passes_then_the_next_and_a_release_frees_it_at_once(
    clock: ControllableClock,
) -> None:
    first = beat_lease_hold(holder="beat:a", ttl=TTL)
    assert first is not None and (first.epoch, first.how) == (1, "new")
    assert beat_lease_hold(holder="beat:b", ttl=TTL) is None  # live: refused
    clock.advance(TTL - timedelta(seconds=1))
    renewed = beat_lease_hold(holder="beat:a", ttl=TTL)  # renewed from now, not from the grant
    assert renewed is not None and (renewed.epoch, renewed.how) == (1, "renewed")
    clock.advance(TTL - timedelta(seconds=1))
    assert beat_lease_hold(holder="beat:b", ttl=TTL) is None
    assert beat_lease_holder() == "beat:a"

    clock.advance(timedelta(seconds=1))  # a's lease lapses exactly at its expiry: b takes it, a is refused
    taken = beat_lease_hold(holder="beat:b", ttl=TTL)
    assert taken is not None and (taken.epoch, taken.how) == (2, "lapsed")
    assert beat_lease_hold(holder="beat:a", ttl=TTL) is None
    assert not beat_lease_release(holder="beat:a")  # a lost it: its release changes nothing
    assert beat_lease_holder() == "beat:b"

    assert beat_lease_release(holder="beat:b")
    assert beat_lease_holder() == ""
    again = beat_lease_hold(holder="beat:a", ttl=TTL)  # free at once, no TTL to wait out
    assert again is not None and (again.epoch, again.how) == (3, "released")


@pytest.mark.django_db
def test_an_empty_holder_is_refused() -> None:
    with pytest.raises(ValueError, match="holder"):
        beat_lease_hold(holder="", ttl=TTL)
    assert not BeatLease.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("row", ["missing", "released", "lapsed"])
def test_beats_racing_for_a_free_row_one_gets_it(row: str) -> None:
    """Eight threads, each with its own connection, try at once: one holds, seven are refused, whatever the row's
    state (not made yet: the insert's primary key decides; free or lapsed: the conditional UPDATE does)."""
    if row != "missing":
        beat_lease_hold(holder="beat:old", ttl=timedelta(milliseconds=1) if row == "lapsed" else TTL)
        if row == "released":
            beat_lease_release(holder="beat:old")
        time.sleep(0.01)
    barrier = threading.Barrier(8)
    results: dict[str, object] = {}

    def take(name: str) -> None:
        try:
            barrier.wait()
            results[name] = beat_lease_hold(holder=name, ttl=TTL)
        except Exception as exc:  # reported below
            results[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(f"beat:{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [name for name, result in results.items() if result is not None]
    assert len(results) == 8 and len(winners) == 1, results
    assert beat_lease_holder() == winners[0]


# -- real beat processes --------------------------------------------------------------------------------------------

BEAT_TTL = 5  # seconds: a standby tries every 1.7 s
SCAN_EVERY = 0.5


@dataclass
class Beat:
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def sent(self) -> int:
        return self.text().count("Sending due task recovery-scan")

    def holder_id(self) -> str:
        found = re.search(r"beat lease taken \(epoch \d+, \w+\): (\S+)", self.text())
        return found.group(1) if found else ""

    def takes(self) -> list[tuple[int, str]]:
        return [(int(e), how) for e, how in re.findall(r"beat lease taken \(epoch (\d+), (\w+)\)", self.text())]


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Polls; the bound only turns a hang into a failure."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g}s")
        time.sleep(0.05)


def _broker() -> Connection:
    return Connection(settings.CELERY_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)


def _queued(queue: str) -> int:
    with _broker() as conn:
        channel: Any = conn.default_channel
        return int(channel.queue_declare(queue=queue, passive=True).message_count)


@pytest.fixture
def beats(transactional_db: None, tmp_path: Path) -> Iterator[tuple[Callable[[str], Beat], str]]:
    """Starts ``celery beat`` processes (the configured scheduler: leases.beat) on the test database; the recovery
    scan every 0.5 s on a queue of this test's own, the other periodic jobs too rarely to fire."""
    queue = f"beat-{uuid.uuid4().hex[:10]}"
    env = os.environ | {
        "DATABASE_URL": database_url(),
        "RECKON_BEAT_LEASE_SECONDS": str(BEAT_TTL),
        "RECKON_SCAN_SECONDS": str(SCAN_EVERY),
        "RECKON_SCAN_QUEUE": queue,
        "RECKON_RETENTION_SWEEP_SECONDS": "3600",
        "RECKON_WEBHOOK_SWEEP_SECONDS": "3600",
        "RECKON_ANCHOR_SECONDS": "3600",
    }
    started: list[Beat] = []

    def start(name: str) -> Beat:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            command = [sys.executable, "-m", "celery", "-A", "console", "beat", "--loglevel=INFO"]
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
        beat = Beat(process, log)
        started.append(beat)
        return beat

    try:
        yield start, queue
    finally:
        for beat in started:
            if beat.process.poll() is None:
                beat.process.kill()
                beat.process.wait(10)
        with _broker() as conn:
            channel: Any = conn.default_channel
            channel.queue_delete(queue)


def test_two_beats_one_sends_sigkill_hands_over_after_the_ttl_sigterm_at_once(
    beats: tuple[Callable[[str], Beat], str],
) -> None:
    start, queue = beats
    a = start("a")
    _wait(lambda: a.sent() >= 1 or a.process.poll() is not None, 60, "beat a sending")
    b = start("b")
    _wait(lambda: "beat: Starting" in b.text() or b.process.poll() is not None, 60, "beat b started")
    time.sleep(1)  # b ticks and is refused at least once
    a_before = a.sent()
    _wait(lambda: a.sent() >= a_before + 4, 30, "a sending while b runs")
    assert alive(b.process.pid), b.text()
    assert b.sent() == 0 and b.takes() == [], b.text()  # b ran all along and sent nothing
    assert beat_lease_holder() == a.holder_id() != ""

    # SIGKILL: a cannot give the lease back. b takes it only once a's expiry has passed on the database's clock.
    a.process.send_signal(signal.SIGKILL)
    a.process.wait(10)
    a_row = BeatLease.objects.get(name=BEAT_LEASE)  # as a left it: its last renewal (b cannot have taken it yet)
    assert a_row.holder == a.holder_id()
    a_total = a.sent()
    killed_at = time.monotonic()
    _wait(lambda: b.sent() >= 1, BEAT_TTL * 4, "b taking over after a's TTL")
    print(f"SIGKILL: b took over {time.monotonic() - killed_at:.1f}s after the kill (TTL {BEAT_TTL}s)")
    b_row = BeatLease.objects.get(name=BEAT_LEASE)
    assert b_row.holder == b.holder_id() and b.takes() == [(a_row.epoch + 1, "lapsed")]
    assert b_row.granted_at is not None and a_row.expires_at is not None
    assert b_row.granted_at >= a_row.expires_at  # never before the killed holder's TTL ran out

    # SIGTERM: b gives the lease back on its way out; a standby c takes the released row at its next try.
    c = start("c")
    _wait(lambda: "beat: Starting" in c.text() or c.process.poll() is not None, 60, "beat c started")
    time.sleep(1)
    assert c.sent() == 0, c.text()
    b.process.send_signal(signal.SIGTERM)
    assert b.process.wait(30) == 0, b.text()
    stopped_at = time.monotonic()
    assert "beat lease released" in b.text()
    assert BeatLease.objects.get(name=BEAT_LEASE).holder in ("", c.holder_id() or "<c not yet>")
    _wait(lambda: c.sent() >= 1, BEAT_TTL * 4, "c taking over after b's release")
    print(f"SIGTERM: c took over {time.monotonic() - stopped_at:.1f}s after b ended (TTL {BEAT_TTL}s)")
    assert c.takes() == [(b_row.epoch + 1, "released")]  # the row b gave back, not one that lapsed

    # Everything on the queue came from the holder of the moment: a until killed, b until stopped, then c.
    c.process.send_signal(signal.SIGTERM)
    assert c.process.wait(30) == 0
    # (a killed between logging a send and making it would leave one line without its message)
    assert _queued(queue) in (a_total + b.sent() + c.sent(), a_total - 1 + b.sent() + c.sent())
    assert beat_lease_holder() == ""


# -- the scheduler, in process --------------------------------------------------------------------------------------


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LeasedScheduler, list[str]]]:
    """A LeasedScheduler with one entry due every 10 ms, whose sends are recorded instead of published (lazy: no
    signal handlers are installed in the test process)."""
    from console.celery import app

    sched = LeasedScheduler(app=app, lazy=True)
    sched.update_from_dict({"probe": {"task": "tasks.recovery_scan", "schedule": 0.01}})
    sent: list[str] = []
    monkeypatch.setattr(sched, "apply_entry", lambda entry, producer=None: sent.append(entry.name))
    sched.__dict__["producer"] = None  # never connects to the broker
    yield sched, sent
    sched.epoch = None  # nothing to give back: the test's transaction is rolled back


def now_plus(delta: timedelta) -> object:
    return db_clock.now() + delta


def _tick_for(sched: LeasedScheduler, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(0.02, sched.tick())))  # as Celery's loop: no sleep for 0 or less


@pytest.mark.django_db
def test_the_scheduler_sends_only_while_it_holds_the_lease(
    scheduler: tuple[LeasedScheduler, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sched, sent = scheduler
    _tick_for(sched, 0.2)
    assert sched.holds() and sent, "the first beat takes the free row and sends"
    assert beat_lease_holder() == sched.holder_id

    # Another beat holds the row (ours lapsed during a pause, say): at its next try ours stops sending at once.
    BeatLease.objects.filter(name=BEAT_LEASE).update(holder="beat:other", expires_at=now_plus(TTL))
    sched._next_try = 0.0
    sent.clear()
    _tick_for(sched, 0.2)
    assert sent == [] and not sched.holds()

    # The database does not answer: a beat that cannot renew sends nothing.
    BeatLease.objects.filter(name=BEAT_LEASE).update(holder="")  # given back: ours takes it at its next try
    sched._next_try = 0.0
    _tick_for(sched, 0.1)
    assert sched.holds()

    def unreachable(**kwargs: object) -> None:
        raise OperationalError("the server closed the connection")

    monkeypatch.setattr("leases.beat.beat_lease_hold", unreachable)
    sched._next_try = 0.0
    sent.clear()
    _tick_for(sched, 0.2)
    assert sent == [] and not sched.holds()


@pytest.mark.django_db
def test_past_its_own_bound_a_holder_sends_nothing_before_it_has_renewed(
    scheduler: tuple[LeasedScheduler, list[str]],
) -> None:
    """The local bound: the TTL on the monotonic clock from the start of the last successful renewal. A process
    whose bound passed (frozen, or its renewals slow) sends nothing until a renewal succeeds again."""
    sched, sent = scheduler
    _tick_for(sched, 0.1)
    assert sent
    sched._valid_until = time.monotonic() - 0.01  # as if the TTL had passed since the last renewal
    sched._next_try = time.monotonic() + 60  # and no renewal due yet
    sent.clear()
    _tick_for(sched, 0.1)
    assert sent == []


@pytest.mark.django_db
def test_a_stop_signal_ends_the_tick_first_and_closing_gives_the_lease_back(
    scheduler: tuple[LeasedScheduler, list[str]],
) -> None:
    """SIGTERM in the middle of a tick (possibly of a statement) only asks to stop; the tick ends, then SystemExit;
    Celery's loop closes the scheduler, which releases the row. Outside a tick (sleeping) it stops at once."""
    sched, _ = scheduler
    sched._ticking = True
    sched._stop_signal(signal.SIGTERM, None)  # no exception here: a statement may be running
    sched._ticking = False
    with pytest.raises(SystemExit):
        sched.tick()
    assert beat_lease_holder() == sched.holder_id  # the tick's renewal ran to its end
    with pytest.raises(SystemExit):
        sched._stop_signal(signal.SIGTERM, None)
    sched.close()
    assert beat_lease_holder() == "" and BeatLease.objects.get(name=BEAT_LEASE).holder == ""
    sched.close()  # twice (Celery may): nothing more to give back
