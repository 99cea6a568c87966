"""A lease's live / grace / lapsed / closed state is decided in one place, leases/state.py: the Python function at
every boundary (just before expiry, exactly at it, just after, just before the grace ends, exactly at its end, after
it, and a closed lease), the ORM conditions and the SQL text agreeing with it on the database at each of those
moments, and no other module of the project comparing a lease's expiry or reading its grace — the source is read
with ``ast`` (as tests/test_layout.py reads imports) and one that comes back fails here."""

import ast
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from leases.clock import ControllableClock
from leases.models import Lease
from leases.services import lease_acquire, lease_release
from leases.state import (
    LeaseState,
    Phase,
    grace_q,
    held_at,
    held_q,
    held_sql,
    lapsed_q,
    lease_state,
    live_at,
    live_q,
    live_sql,
)
from tasks.models import Task
from tests.test_layout import ROOT, sources

TICK = timedelta(microseconds=1)
EXPIRES = datetime(2030, 1, 1, 0, 2, tzinfo=UTC)


def grace() -> timedelta:
    grace: timedelta = settings.RECKON_LEASE_GRACE
    return grace


# (what the moment is, now - expiry, the phase, seconds left, seconds left of the grace)
BOUNDARIES: list[tuple[str, Callable[[], timedelta], Phase, int, int | None]] = [
    ("ten seconds before expiry", lambda: -timedelta(seconds=10), Phase.LIVE, 10, None),
    ("one tick before expiry", lambda: -TICK, Phase.LIVE, 0, None),
    ("exactly at expiry", lambda: timedelta(0), Phase.GRACE, 0, int(grace().total_seconds())),
    ("one tick after expiry", lambda: TICK, Phase.GRACE, 0, int(grace().total_seconds()) - 1),
    ("five seconds into the grace", lambda: timedelta(seconds=5), Phase.GRACE, -5, int(grace().total_seconds()) - 5),
    ("one tick before the grace ends", lambda: grace() - TICK, Phase.GRACE, -int(grace().total_seconds()) + 1, 0),
    ("exactly at the end of the grace", lambda: grace(), Phase.LAPSED, -int(grace().total_seconds()), None),
    ("one tick after the grace", lambda: grace() + TICK, Phase.LAPSED, -int(grace().total_seconds()), None),
    ("44 seconds after expiry", lambda: timedelta(seconds=44), Phase.LAPSED, -44, None),
]
IDS = [row[0] for row in BOUNDARIES]


@pytest.mark.parametrize(("moment", "offset", "phase", "seconds_left", "grace_left"), BOUNDARIES, ids=IDS)
def test_the_state_of_an_open_lease_at_each_boundary(
    moment: str, offset: Callable[[], timedelta], phase: Phase, seconds_left: int, grace_left: int | None
) -> None:
    now = EXPIRES + offset()
    state = lease_state(expires_at=EXPIRES, now=now)
    assert state.phase is phase, moment
    assert (state.live, state.in_grace, state.lapsed, state.closed) == (
        phase is Phase.LIVE,
        phase is Phase.GRACE,
        phase is Phase.LAPSED,
        False,
    )
    assert state.held is (phase in (Phase.LIVE, Phase.GRACE))
    assert (state.seconds_left, state.seconds_since_expiry) == (seconds_left, -seconds_left)
    assert state.grace_left_seconds == grace_left
    assert live_at(EXPIRES, now) is state.live and held_at(EXPIRES, now) is state.held


@pytest.mark.parametrize("offset", [-timedelta(seconds=10), timedelta(0), grace(), timedelta(hours=1)])
def test_a_released_lease_is_closed_whatever_the_time(offset: timedelta) -> None:
    state = lease_state(expires_at=EXPIRES, now=EXPIRES + offset, released_at=EXPIRES - timedelta(seconds=20))
    assert state.phase is Phase.CLOSED and state.closed
    assert not (state.live or state.in_grace or state.lapsed or state.held)


def test_a_grace_given_replaces_the_deployment_s() -> None:
    short = timedelta(seconds=1)
    assert lease_state(expires_at=EXPIRES, now=EXPIRES + short, grace=short).lapsed
    assert lease_state(expires_at=EXPIRES, now=EXPIRES + short - TICK, grace=short).in_grace
    assert isinstance(lease_state(expires_at=EXPIRES, now=EXPIRES), LeaseState)


# --- the ORM conditions and the SQL say the same at every boundary ----------------------------------------------


@pytest.fixture
def open_lease(make_task: Callable[..., Task], clock: ControllableClock) -> Lease:
    task = make_task()
    return lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="agent-1", ttl=timedelta(seconds=30))


def _selected(lease: Lease, now: datetime) -> dict[str, bool]:
    """Which of the module's conditions select ``lease`` at ``now``: ORM and SQL alike."""
    rows = Lease.objects.filter(pk=lease.pk)
    held, held_params = held_sql(now)
    with connection.cursor() as cursor:
        adapted = connection.ops.adapt_datetimefield_value(now)
        cursor.execute(f"SELECT COUNT(*) FROM leases_lease WHERE id = %s AND {live_sql('%s')}", [lease.pk, adapted])  # noqa: S608
        live_by_sql = cursor.fetchone()[0] == 1
        cursor.execute(f"SELECT COUNT(*) FROM leases_lease WHERE id = %s AND {held}", [lease.pk, *held_params])  # noqa: S608
        held_by_sql = cursor.fetchone()[0] == 1
    return {
        "live": rows.filter(live_q(now)).exists(),
        "held": rows.filter(held_q(now)).exists(),
        "grace": rows.filter(grace_q(now)).exists(),
        "lapsed": rows.filter(lapsed_q(now)).exists(),
        "live (SQL)": live_by_sql,
        "held (SQL)": held_by_sql,
    }


def _expected(state: LeaseState) -> dict[str, bool]:
    return {
        "live": state.live,
        "held": state.held,
        "grace": state.in_grace,
        "lapsed": state.lapsed,
        "live (SQL)": state.live,
        "held (SQL)": state.held,
    }


@pytest.mark.django_db
@pytest.mark.parametrize(("moment", "offset", "phase", "_left", "_grace"), BOUNDARIES, ids=IDS)
def test_the_queries_select_a_lease_exactly_when_the_function_says_so(
    open_lease: Lease,
    moment: str,
    offset: Callable[[], timedelta],
    phase: Phase,
    _left: int,
    _grace: int | None,
) -> None:
    now = open_lease.expires_at + offset()
    state = lease_state(expires_at=open_lease.expires_at, now=now)
    assert state.phase is phase
    assert _selected(open_lease, now) == _expected(state), moment


@pytest.mark.django_db
def test_the_queries_select_no_closed_lease(open_lease: Lease) -> None:
    released = lease_release(lease=open_lease)
    for _moment, offset, _phase, _left, _grace in BOUNDARIES:
        now = released.expires_at + offset()
        state = lease_state(expires_at=released.expires_at, now=now, released_at=released.released_at)
        assert state.closed
        assert not any(_selected(released, now).values())


# --- no other definition ----------------------------------------------------------------------------------------

DEFINITION = Path("leases/state.py")
# Expiries that are not a task lease's, each with its own rule and no grace.
OTHER_EXPIRIES = (
    Path("leases/beat.py"),  # the beat lease (leases.models.BeatLease)
    Path("retention"),  # retained objects
    Path("tasks/decide/approval_binding.py"),  # an approval's expiry (Binding.expired), no grace
)
_SQL_COMPARISON = re.compile(r"expires_at\s*[<>]|[<>]=?\s*\w*\.?expires_at\b")
# approval_expires_at is an approval's (tasks/decide/approval_binding.py), filtered in its SQL form by querysets.py.
_LOOKUP = re.compile(r"(?<!approval_)expires_at__(gt|gte|lt|lte)$")


def _mentions_expiry(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id.endswith("expires_at"))
        or (isinstance(n, ast.Attribute) and n.attr.endswith("expires_at"))
        for n in ast.walk(node)
    )


def _is_column(value: ast.expr) -> bool:
    """``F("granted_at")``: a comparison of two columns of one row (a constraint), not a judgement at a time."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name | ast.Attribute)
        and ((value.func.id if isinstance(value.func, ast.Name) else value.func.attr) == "F")
    )


def second_definitions(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, what) of every place in ``source`` that judges a lease's state by itself: reads the grace, compares an
    expiry in Python, filters on one with the ORM, or compares one in SQL text."""
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "lease_grace":
                yield node.lineno, "calls lease_grace()"
            for keyword in node.keywords:
                if keyword.arg and _LOOKUP.search(keyword.arg) and not _is_column(keyword.value):
                    yield node.lineno, f"filters on {keyword.arg}"
        elif isinstance(node, ast.Attribute) and node.attr == "RECKON_LEASE_GRACE":
            yield node.lineno, "reads RECKON_LEASE_GRACE"
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in node.ops
        ):
            if _mentions_expiry(node):
                yield node.lineno, "compares an expiry"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_COMPARISON.search(node.value):
            yield node.lineno, "compares an expiry in SQL"


def _exempt(path: Path) -> bool:
    relative = path.relative_to(ROOT)
    return relative == DEFINITION or any(relative == p or p in relative.parents for p in OTHER_EXPIRIES)


def test_no_module_but_leases_state_judges_a_lease_s_state() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} {what}"
        for path, _module in sources()
        if not _exempt(path)
        for line, what in second_definitions(path.read_text(), str(path))
    ]
    assert not found, "a lease's state is judged outside leases/state.py (use it): " + "; ".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "grace = lease_grace()\n",
        "from django.conf import settings\ngrace = settings.RECKON_LEASE_GRACE\n",
        "lapsed = lease.expires_at <= now - grace\n",
        "live = now < snap.lease_expires_at\n",
        "held = Lease.objects.filter(expires_at__gt=now - grace)\n",
        'sql = "SELECT 1 FROM leases_lease l WHERE l.released_at IS NULL AND l.expires_at > %s"\n',
        'sql = f"... AND {alias}.expires_at <= {now}"\n',
        'sql = "... WHERE %s < l.expires_at"\n',
    ],
)
def test_the_check_sees_a_second_definition(source: str) -> None:
    assert len(list(second_definitions(source))) == 1, source


def test_the_check_lets_through_what_is_not_a_judgement() -> None:
    source = (
        "Lease.objects.create(expires_at=now + ttl)\n"
        'Q(expires_at__gt=models.F("granted_at"))\n'
        'renew = "UPDATE leases_lease SET expires_at = GREATEST(expires_at, %s) WHERE id = %s"\n'
        "state = lease_state(expires_at=lease.expires_at, now=now)\n"
    )
    assert list(second_definitions(source)) == []
