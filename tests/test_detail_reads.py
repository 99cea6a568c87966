"""tasks/reads/detail.py, the reads of the task detail page: each at a fixed number of queries, from live rows only; the
timeline's keyset never repeats or skips an entry, even when many share one instant."""

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from audit.principals import Principal
from leases.services import lease_release, lease_reserve
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed, NotFound, Unprovable
from tasks.engine.plans import plan_accept, plan_propose
from tasks.models import Task
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import lease_force_release
from tasks.reads import detail as reads
from tasks.reads.detail import (
    TEMP_NAMED_MAX,
    InvalidTimelineCursor,
    chain_check,
    event_summary,
    lease_view,
    task_detail,
    timeline_page,
)
from tests.conftest import chain_plan, copy_node, effect_node, person, snapshot
from tests.steps import record, send, version

pytestmark = pytest.mark.django_db

CREATOR = Principal.agent("tester")


def parallel(*keys: str) -> dict[str, Any]:
    return {"nodes": [effect_node(key) for key in keys]}


def interrupted() -> Failed:
    return Failed(FailureClass.CONNECTION_INTERRUPTED, "read timeout after sending")


def fresh(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


# --- task_detail -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [3, 30])
def test_the_detail_reads_nine_queries_whatever_the_rows(
    make_task, agent_lease, clock, django_assert_num_queries, nodes
) -> None:
    keys = [f"n{i}" for i in range(nodes)]
    task = make_task(chain_plan(*keys))
    lease = agent_lease(task)
    for key in keys[:-1]:
        record(send(task, lease, key), Committed(remote_id=f"r-{key}", data={"temp": [f"tmp/{key}"]}), lease)
    task = fresh(task)
    with django_assert_num_queries(9):
        detail = task_detail(task)
    assert len(detail.nodes) == nodes and len(detail.operations) == nodes - 1
    assert len(detail.temp_resources) == min(nodes - 1, TEMP_NAMED_MAX) and detail.temps.total == nodes - 1
    assert all(row.satisfied for row in detail.nodes[:-1]) and not detail.nodes[-1].satisfied


def test_unprovable_then_unknown_then_in_flight_then_the_rest(make_task, agent_lease, clock) -> None:
    task = make_task(parallel("a", "b", "c", "d"))
    lease = agent_lease(task)
    committed = record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    clock.advance(timedelta(seconds=1))
    unknown = record(send(task, lease, "b"), interrupted(), lease)
    clock.advance(timedelta(seconds=1))
    unprovable = record(unknown, Unprovable("the remote keeps no record"), lease)
    detail = task_detail(fresh(task))
    assert fresh(task).status == "paused"
    assert [row.op.op_key for row in detail.operations] == [unprovable.op_key, committed.op_key]
    assert detail.operations[0].unprovable
    assert [row.op.op_key for row in detail.waiting.unprovable] == [unprovable.op_key]


def test_stopping_waits_for_what_is_in_flight_and_stopped_pending_for_what_is_unknown(
    make_task, agent_lease, clock
) -> None:
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    in_flight = send(task, lease, "a")
    task_request_cancel(actor=CREATOR, task_id=task.pk, reason="stop")
    stopping = task_detail(fresh(task))
    assert fresh(task).status == "stopping"
    assert [row.op.op_key for row in stopping.waiting.in_flight] == [in_flight.op_key]
    assert stopping.waiting.to_reconcile == []
    record(in_flight, interrupted(), lease)
    pending = task_detail(fresh(task))
    assert fresh(task).status == "stopped_pending"
    assert pending.waiting.in_flight == []
    assert [row.op.op_key for row in pending.waiting.to_reconcile] == [in_flight.op_key]


def test_a_receipt_short_of_the_evidence_is_shown_with_what_it_lacks(make_task, agent_lease, clock) -> None:
    task = make_task({"nodes": [copy_node()]})
    lease = agent_lease(task)
    op = send(task, lease, "copy")
    record(op, Committed(remote_id="r-1", count=99, digest="sha256:" + "ab" * 32, remote_version="7"), lease)
    row = task_detail(fresh(task)).nodes[0]
    assert row.receipt is not None and row.receipt_op_key == op.op_key
    assert not row.satisfied
    assert row.receipt_problems == ["receipt count is 99, the node expects 100"]
    assert row.receipt_fields == [
        ("remote_id", "r-1"),
        ("remote_version", "7"),
        ("count", 99),
        ("digest", "sha256:" + "ab" * 32),
    ]
    assert [line.version for line in row.inputs if line.kind == "ref"] == ["7"]


def test_a_node_kept_across_a_re_plan_shows_the_receipt_of_its_first_plan(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    first = record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    record(send(task, lease, "b"), Failed(FailureClass.INVALID_PARAMS, "bad"), lease)
    assert fresh(task).status == "paused"
    revision = plan_propose(
        task_id=task.pk,
        plan=chain_plan("a", "c"),
        proposed_by="agent:tester",
        expected_version=version(task),
        lease=lease,
    )
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    detail = task_detail(fresh(task))
    kept = detail.nodes[0]
    assert (kept.node.plan_version, kept.node.key, kept.node.status) == (2, "a", "succeeded")
    assert kept.receipt_op_key == first.op_key and kept.satisfied


def test_completed_lists_the_temp_resources_still_to_clean(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/1", "staging/2"]}), lease)
    detail = task_detail(fresh(task))
    assert detail.terminal and fresh(task).status == "completed"
    assert [t.locator for t in detail.waiting.temp_to_clean] == ["staging/1", "staging/2"]
    assert detail.waiting.unsatisfied_nodes == []


# --- lease_view --------------------------------------------------------------------------------------------------


def test_the_lease_view_reads_two_queries_on_the_test_clock(
    make_task, agent_lease, clock, django_assert_num_queries
) -> None:
    task = make_task()
    agent_lease(task)
    with django_assert_num_queries(2):
        view = lease_view(task)
    assert view.held and view.lease is not None and view.lease.holder_id == "agent-1"


def test_the_lease_view_judges_expiry_and_grace_on_the_database_clock(make_task, agent_lease, clock) -> None:
    task = make_task()
    agent_lease(task, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=10))
    assert lease_view(task).expires_in_seconds == 20
    clock.advance(timedelta(seconds=25))
    view = lease_view(task)
    assert (view.held, view.in_grace, view.lapsed, view.expired_seconds_ago) == (False, True, False, 5)
    assert view.grace_left_seconds == int(settings.RECKON_LEASE_GRACE.total_seconds()) - 5
    clock.advance(settings.RECKON_LEASE_GRACE)
    view = lease_view(task)
    assert (view.held, view.in_grace, view.lapsed) == (False, False, True)


def test_the_lease_view_after_a_release_names_the_last_holder_and_a_forced_release(
    make_task, agent_lease, clock
) -> None:
    task = make_task()
    lease = agent_lease(task)
    lease_release(lease=lease)
    view = lease_view(task)
    assert not view.held and view.lease is not None and view.lease.release_reason == "released"
    assert view.forced is None
    agent_lease(task, holder="agent-2")
    lease_force_release(
        actor=person("ada", "admin"),
        task_id=task.pk,
        justification="the agent is stuck in a loop of retries",
        impact="the agent's in-flight work goes to the next holder",
    )
    view = lease_view(fresh(task))
    assert view.lease is not None and view.lease.holder_id == "agent-2"
    assert view.forced is not None and view.forced.forced_by == "user:ada"


def test_the_lease_view_shows_a_waiting_operator(make_task, clock) -> None:
    task = make_task()
    lease_reserve(task_id=task.pk, operator_id="ann")
    view = lease_view(task)
    assert view.lease is None and view.reservation is not None and view.reservation.holder_id == "ann"


# --- timeline_page -----------------------------------------------------------------------------------------------


def walk(task: Task, size: int) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    cursor: str | None = None
    while True:
        entries, cursor = timeline_page(task, before=cursor, size=size)
        assert len(entries) <= size
        seen += [(entry.source, entry.seq) for entry in entries]
        if cursor is None:
            return seen


def busy_task(make_task: Any, agent_lease: Any, clock: Any, *, tick: bool) -> Task:
    """Events and audit rows, many of them at one instant when ``tick`` is false."""
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    for _ in range(5):
        record(send(task, lease, "a"), NotFound(), lease)
        if tick:
            clock.advance(timedelta(milliseconds=1))
    send(task, lease, "a")
    task_request_cancel(actor=person("ada", "admin"), task_id=task.pk, reason="audited")
    return fresh(task)


@pytest.mark.parametrize("tick", [True, False])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_the_timeline_never_repeats_or_skips_an_entry(make_task, agent_lease, clock, tick, size) -> None:
    task = busy_task(make_task, agent_lease, clock, tick=tick)
    everything = walk(task, 1000)
    assert len(everything) == task.version + 1  # every event and the cancel's audit row
    assert walk(task, size) == everything
    events = [seq for source, seq in everything if source == "event"]
    assert events == sorted(events, reverse=True)  # newest first


def test_entries_written_while_paging_appear_on_no_later_page(make_task, agent_lease, clock) -> None:
    task = busy_task(make_task, agent_lease, clock, tick=False)
    before = walk(task, 1000)
    first, cursor = timeline_page(task, before=None, size=3)
    clock.advance(timedelta(seconds=1))
    from tasks.people.takeover import takeover_claim

    takeover_claim(actor=person("ann", "admin"), task_id=task.pk)  # an event and an audit row, both newer
    rest: list[tuple[str, int]] = []
    while cursor is not None:
        entries, cursor = timeline_page(task, before=cursor, size=3)
        rest += [(entry.source, entry.seq) for entry in entries]
    assert [(e.source, e.seq) for e in first] + rest == before


def test_a_timeline_page_is_two_queries(make_task, agent_lease, clock, django_assert_num_queries) -> None:
    task = busy_task(make_task, agent_lease, clock, tick=True)
    _, cursor = timeline_page(task, before=None, size=3)
    with django_assert_num_queries(2):
        timeline_page(task, before=cursor, size=3)


@pytest.mark.parametrize("cursor", ["", "x", "bm90IGEgY3Vyc29y", "MjAzMC0wMS0wMVQwMDowMDowMHw1fDE"])
def test_a_forged_cursor_is_refused(make_task, cursor) -> None:
    with pytest.raises(InvalidTimelineCursor):
        timeline_page(make_task(), before=cursor or "!", size=5)


def test_a_page_holds_at_least_one_entry(make_task) -> None:
    with pytest.raises(ValueError, match="at least one"):
        timeline_page(make_task(), before=None, size=0)


def test_an_event_reads_as_lines_a_person_understands() -> None:
    lines = event_summary(
        {
            "task": {"status": "stopping"},
            "nodes": {"p1/a": {"status": "running", "attempts": 1}},
            "operations": {"rk-1": {"status": "dispatched"}},
            "data": {"reason": "wrong target"},
        }
    )
    assert lines == [
        "task: status stopping",
        "node p1/a: status running, attempts 1",
        "operation rk-1: status dispatched",
        "reason: wrong target",
    ]
    assert event_summary(["not", "a", "payload"]) == ["['not', 'a', 'payload']"]


# --- chain_check -------------------------------------------------------------------------------------------------


def test_the_chain_is_checked_on_open_for_a_short_log(make_task, clock) -> None:
    task = make_task()
    check = chain_check(task)
    assert check.checked and check.ok and check.events == task.version == 2  # created, plan accepted


def test_a_long_log_is_checked_only_on_request(make_task, agent_lease, clock, monkeypatch) -> None:
    monkeypatch.setattr(reads, "CHECK_ON_OPEN_MAX_EVENTS", 3)
    task = busy_task(make_task, agent_lease, clock, tick=True)
    assert not chain_check(task).checked
    assert chain_check(task, force=True).ok


def test_a_check_that_finds_a_problem_reports_it_and_quarantines_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    Task.objects.filter(pk=task.pk).update(attempts_used=0)
    before = snapshot()
    check = chain_check(fresh(task))
    assert check.checked and not check.ok and check.problem is not None and "attempts_used" in check.problem
    assert snapshot() == before
