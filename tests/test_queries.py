"""The read side (tasks/querysets.py, tasks/reads/queries.py): what the recovery scan, the console and the agent API
select, each checked against the rule it mirrors (next_directive, can_operate) and pinned in queries."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, Group, Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm

from audit.principals import Principal
from leases.clock import ControllableClock
from leases.models import Lease
from leases.services import lease_acquire, lease_release, lease_reserve
from tasks.access.permissions import OPERATE, can_operate, operable_condition, permission_grant
from tasks.core.lifecycle import FailureClass, TaskStatus, TempResourceStatus
from tasks.core.outcomes import Committed, Failed, Unprovable
from tasks.engine.plans import plan_accept, plan_propose
from tasks.engine.protocol import next_directive
from tasks.engine.recovery import tasks_needing_work
from tasks.models import Node, ScopeGrant, Task, TempResource
from tasks.people.approvals import node_approve_and_resume
from tasks.people.takeover import takeover_claim
from tasks.querysets import Attention
from tasks.reads.queries import (
    InvalidCursor,
    Order,
    TaskFilter,
    attention_queue,
    attention_reasons,
    page,
    task_overview,
    task_queue,
)
from tests.conftest import chain_plan, effect_node, person
from tests.steps import asked, record, send, version

pytestmark = pytest.mark.django_db

A = Attention
TEST_CLOCK: list[ControllableClock] = []  # the test's clock, for the cases that move it


def approval(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}, **extra}


def fresh(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def set_status(task: Task, status: str, **fields: Any) -> None:
    Task.objects.filter(pk=task.pk).update(status=status, **fields)


def succeed(task: Task, key: str, lease: Lease) -> None:
    record(send(task, lease, key), Committed(remote_id=f"r-{key}"), lease)


def reasons(task: Task) -> list[Attention]:
    return attention_reasons(Task.objects.with_attention().get(pk=task.pk))


# --- workable: the recovery scan's selection ---------------------------------------------------------------------


def test_the_recovery_scan_selects_exactly_the_workable_tasks(make_task, agent_lease, clock) -> None:
    free, held, paused = make_task(), make_task(), make_task()
    agent_lease(held)
    set_status(paused, "paused", status_reason="needs_replan")
    assert set(Task.objects.workable().values_list("pk", flat=True)) == {free.pk}
    assert list(tasks_needing_work()) == list(Task.objects.workable().order_by("pk"))


# --- with_progress -----------------------------------------------------------------------------------------------


def test_progress_counts_the_current_plans_nodes_and_the_open_operations(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b", "c"))
    lease = agent_lease(task)
    succeed(task, "a", lease)
    record(send(task, lease, "b"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)  # unknown: open
    other = make_task(chain_plan("x"))
    row = Task.objects.with_progress().get(pk=task.pk)
    assert (row.nodes_total, row.nodes_done, row.open_operations) == (3, 1, 1)
    empty = Task.objects.with_progress().get(pk=other.pk)
    assert (empty.nodes_total, empty.nodes_done, empty.open_operations) == (1, 0, 0)


def test_progress_counts_only_the_current_plan(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    succeed(task, "a", lease)
    set_status(task, "paused", status_reason="needs_replan")
    revision = plan_propose(
        task_id=task.pk,
        plan=chain_plan("x", "y", "z"),
        proposed_by="agent:t",
        expected_version=version(task),
        lease=lease,
    )
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    row = Task.objects.with_progress().get(pk=task.pk)
    assert Node.objects.filter(task=task).count() == 5
    assert (row.nodes_total, row.nodes_done) == (3, 0)


def test_progress_is_counted_by_correlated_subqueries_not_a_join() -> None:
    sql = str(Task.objects.with_progress().query).upper()
    assert "JOIN" not in sql
    assert "DISTINCT" not in sql


# --- needs_attention ---------------------------------------------------------------------------------------------


def test_a_task_that_runs_on_its_own_needs_nobody(make_task, agent_lease, clock) -> None:
    running = make_task(chain_plan("a", "b"))
    succeed(running, "a", agent_lease(running))
    done = make_task(chain_plan("a"))
    lease = agent_lease(done)
    succeed(done, "a", lease)
    assert fresh(done).status == TaskStatus.COMPLETED
    assert not Task.objects.needs_attention().exists()
    assert reasons(running) == [] and reasons(done) == []


def test_each_state_a_person_must_look_at_is_named(make_task, agent_lease, clock) -> None:
    human, paused, stopped_pending, quarantined = (make_task() for _ in range(4))
    set_status(human, "human")
    set_status(paused, "paused", status_reason="input_changed")
    set_status(stopped_pending, "stopped_pending", cancel_requested_at=clock.now())
    set_status(quarantined, "quarantined", status_detail="the log and the projection disagree")
    approve = make_task({"nodes": [approval("approve")]})
    reserved = make_task()
    lease_reserve(task_id=reserved.pk, operator_id="ann")
    assert reasons(human) == [A.HUMAN]
    assert reasons(paused) == [A.PAUSED]
    assert reasons(stopped_pending) == [A.STOPPED_PENDING]
    assert reasons(quarantined) == [A.QUARANTINED]
    assert reasons(approve) == [A.AWAITING_APPROVAL]
    assert reasons(reserved) == [A.TAKEOVER_REQUESTED]


def test_an_unknown_operation_and_an_unprovable_one_are_told_apart(make_task, agent_lease, clock) -> None:
    unknown, unprovable, timed_out_then_unprovable = make_task(), make_task(), make_task()
    lease = agent_lease(unknown)
    record(send(unknown, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    lease = agent_lease(unprovable)
    op = record(send(unprovable, lease, "a"), Unprovable(), lease)  # a lookup after a crash mid-call
    assert op.failure_class == "unprovable"
    lease = agent_lease(timed_out_then_unprovable)
    op = record(send(timed_out_then_unprovable, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    record(op, Unprovable(), lease)  # the operation keeps its class; the task's pause says unprovable
    assert reasons(unknown) == [A.UNKNOWN_OPERATION]
    assert reasons(unprovable) == [A.PAUSED, A.UNPROVABLE_OPERATION]
    assert reasons(timed_out_then_unprovable) == [A.PAUSED, A.UNPROVABLE_OPERATION]


def test_an_exhausted_budget_is_named_paused_or_not(make_task, agent_lease, clock) -> None:
    spent = make_task(chain_plan("a", "b"), attempt_budget=1)
    succeed(spent, "a", agent_lease(spent))
    assert fresh(spent).status_reason == "budget_exhausted"
    assert reasons(spent) == [A.PAUSED, A.BUDGET_EXHAUSTED]
    handed_back = make_task(chain_plan("a"))
    Task.objects.filter(pk=handed_back.pk).update(attempts_used=handed_back.attempt_budget)
    node_spent = make_task(chain_plan("a"))
    Node.objects.filter(task=node_spent).update(attempts=1, max_attempts=1)
    assert reasons(handed_back) == [A.BUDGET_EXHAUSTED]
    assert reasons(node_spent) == [A.BUDGET_EXHAUSTED]
    completed_on_its_last_attempt = make_task(chain_plan("a"), attempt_budget=1)
    succeed(completed_on_its_last_attempt, "a", agent_lease(completed_on_its_last_attempt))
    assert reasons(completed_on_its_last_attempt) == []


def test_a_stuck_temp_resource_is_named_once_the_task_has_ended(make_task, clock) -> None:
    task = make_task()
    set_status(task, "completed")
    now = clock.now()
    TempResource.objects.create(
        task=task, locator="staging/1", status=TempResourceStatus.STUCK, created_at=now, retention_until=now
    )
    TempResource.objects.create(task=task, locator="staging/2", created_at=now, retention_until=now)
    # staging/2 is still to delete, and its kind has no connector here and no agent holds the task: left.
    assert reasons(task) == [A.TEMP_RESOURCE_STUCK, A.TEMP_RESOURCE_LEFT]


def test_needs_attention_lists_every_named_task_and_no_other(make_task, clock) -> None:
    calm = make_task()
    human = make_task()
    set_status(human, "human")
    approve = make_task({"nodes": [approval("approve")]})
    found = {task.pk: attention_reasons(task) for task in Task.objects.needs_attention()}
    assert found == {human.pk: [A.HUMAN], approve.pk: [A.AWAITING_APPROVAL]}
    assert calm.pk not in found


def test_attention_reasons_refuse_a_task_read_without_them(make_task, clock) -> None:
    task = make_task()
    with pytest.raises(ValueError, match="with_attention"):
        attention_reasons(fresh(task))


@pytest.mark.parametrize("count", [3, 12])
def test_needs_attention_with_reasons_is_one_query_however_many_tasks(make_task, clock, count) -> None:
    for index in range(count):
        task = make_task()
        set_status(task, "human" if index % 2 else "paused", status_reason="" if index % 2 else "needs_replan")
    with CaptureQueriesContext(connection) as queries:
        found = {task.pk: attention_reasons(task) for task in Task.objects.needs_attention()}
    assert len(found) == count
    assert len(queries) == 1


# --- awaiting approval agrees with next_directive ----------------------------------------------------------------


def _approval_first(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    return make_task({"nodes": [approval("approve"), effect_node("b", depends_on=["approve"])]})


def _approval_after_pending_effect(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    return make_task({"nodes": [effect_node("a"), approval("approve", depends_on=["a"])]})


def _approval_after_succeeded_effect(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    task = _approval_after_pending_effect(make_task, lease_for)
    succeed(task, "a", lease_for(task))
    return task


def _independent_approval_before_effect(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    return make_task({"nodes": [approval("approve"), effect_node("b")]})


def _independent_effect_before_approval(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    return make_task({"nodes": [effect_node("b"), approval("approve")]})


def _approval_blocked_behind_an_unknown(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    task = make_task({"nodes": [effect_node("a"), approval("approve"), effect_node("c", depends_on=["a"])]})
    lease = lease_for(task)
    record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    return task


def _approval_of_a_paused_task(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    task = make_task({"nodes": [approval("approve")]})
    set_status(task, "paused", status_reason="needs_replan")
    return task


def _approval_after_a_hand_back(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    task = make_task({"nodes": [approval("approve")]})
    Task.objects.filter(pk=task.pk).update(inputs_recheck_required=True)
    return task


def _approval_of_a_cancelled_task(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    task = make_task({"nodes": [approval("approve")]})
    set_status(task, "stopping", cancel_requested_at=lease_for(task).granted_at)
    return task


def _approved(task: Task, **given: Any) -> Task:
    """``approve`` approved by a person (bound to b's request) and the task handed back."""
    root = person(f"root-{task.pk}", "admin")
    claim = takeover_claim(actor=root, task_id=task.pk)
    assert claim.granted
    node_approve_and_resume(
        actor=root,
        task_id=task.pk,
        node_key="approve",
        expected_version=version(task),
        approving=asked(task, "approve"),
        **given,
    )
    return task


def _approval_approved(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    return _approved(make_task({"nodes": [approval("approve"), effect_node("b", depends_on=["approve"])]}))


def _approval_marked_succeeded(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    """Succeeded without an approval binding b's request (a row changed by hand): b's start waits for one."""
    task = make_task({"nodes": [approval("approve"), effect_node("b", depends_on=["approve"])]})
    Node.objects.filter(task=task, key="approve").update(status="succeeded")
    return task


def _approval_expired(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    task = _approved(make_task({"nodes": [approval("approve"), effect_node("b", depends_on=["approve"])]}))
    TEST_CLOCK[-1].advance(settings.RECKON_APPROVAL_TTL)  # exactly at its expiry: expired
    return task


def _approval_expired_behind_a_backoff(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    """Expired, but the gated node backs off first: the directive says wait, not awaiting approval."""
    task = _approval_expired(make_task, lease_for)
    Node.objects.filter(task=task, key="b").update(not_before=TEST_CLOCK[-1].now() + timedelta(minutes=5))
    return task


def _approval_under_an_older_plan(make_task: Callable[..., Task], lease_for: Callable[[Task], Lease]) -> Task:
    plan = {"nodes": [approval("approve"), effect_node("b", depends_on=["approve"])]}
    task = _approved(make_task(plan))
    lease = lease_for(task)
    replanned = {"nodes": [*plan["nodes"], effect_node("c", depends_on=["b"])]}  # the approval and b are kept
    revision = plan_propose(
        task_id=task.pk, plan=replanned, proposed_by="agent:worker", expected_version=version(task), lease=lease
    )
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    return task


APPROVAL_CASES = {
    "approval first": (_approval_first, True),
    "approval after a pending effect": (_approval_after_pending_effect, False),
    "approval after a succeeded effect": (_approval_after_succeeded_effect, True),
    "independent approval before an effect": (_independent_approval_before_effect, True),
    "independent effect before an approval": (_independent_effect_before_approval, False),
    "approval behind an unknown operation": (_approval_blocked_behind_an_unknown, False),
    "approval of a paused task": (_approval_of_a_paused_task, False),
    "approval after a hand-back": (_approval_after_a_hand_back, False),
    "approval of a cancelled task": (_approval_of_a_cancelled_task, False),
    "approval already approved": (_approval_approved, False),
    "approval marked succeeded without binding": (_approval_marked_succeeded, True),
    "approval expired": (_approval_expired, True),
    "approval expired behind a backoff": (_approval_expired_behind_a_backoff, False),
    "approval under an older plan": (_approval_under_an_older_plan, True),
}


@pytest.mark.parametrize("case", sorted(APPROVAL_CASES))
def test_awaiting_approval_is_what_next_directive_says(make_task, clock, case, monkeypatch) -> None:
    monkeypatch.setattr(f"{__name__}.TEST_CLOCK", [clock])
    build, expected = APPROVAL_CASES[case]
    leases: dict[int, Lease] = {}

    def lease_for(task: Task) -> Lease:
        if task.pk not in leases:
            leases[task.pk] = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker")
        return leases[task.pk]

    task = build(make_task, lease_for)
    directive = next_directive(task_id=task.pk, lease=lease_for(task))
    assert (directive.reason == "awaiting_approval") is expected, directive
    assert (A.AWAITING_APPROVAL in reasons(task)) is expected
    lease_release(lease=lease_for(task))


# --- operable_condition agrees with can_operate ----------------------------------------------------------------


@pytest.fixture
def people(db: None) -> dict[str, User]:
    """The personas, each a user; grants land once tasks exist (``grants``)."""
    root = person("root", "admin")
    group_member = person("gill", "operator")
    team = Group.objects.create(name="migrations-team")
    group_member.user.groups.add(team)
    global_perm = person("gus", "operator")
    global_perm.user.user_permissions.add(Permission.objects.get(codename="operate_task"))
    inactive_admin = person("ida", "admin")
    inactive_operator = person("ivan", "operator")
    for gone in (inactive_admin, inactive_operator):
        gone.user.is_active = False
        gone.user.save(update_fields=["is_active"])
    inactive_superuser = person("isis", superuser=True)
    inactive_superuser.user.is_active = False
    inactive_superuser.user.save(update_fields=["is_active"])
    return {
        "admin": root.user,
        "superuser": person("sue", superuser=True).user,
        "operator with a project grant": person("pat", "operator").user,
        "operator with a kind grant": person("kim", "operator").user,
        "operator with a project and kind grant": person("pkg", "operator").user,
        "operator with an object permission": person("olga", "operator").user,
        "operator whose group has an object permission": group_member.user,
        "operator with only the model-wide permission": global_perm.user,
        "operator without a grant": person("nora", "operator").user,
        "auditor with grants": person("aud", "auditor").user,
        "outsider with grants": person("otto").user,
        "inactive user with grants": inactive_operator.user,
        "inactive admin": inactive_admin.user,
        "inactive superuser": inactive_superuser.user,
    }


@pytest.fixture
def tasks(make_task, clock) -> dict[str, Task]:
    return {
        "acme copy": make_task(project="acme", kind="copy"),
        "acme switch": make_task(project="acme", kind="switch"),
        "globex copy": make_task(project="globex", kind="copy"),
        "globex switch": make_task(project="globex", kind="switch"),
        "no project": make_task(kind="switch"),
    }


@pytest.fixture
def grants(people: dict[str, User], tasks: dict[str, Task]) -> None:
    root = Principal.of_user(people["admin"])
    for name in ("operator with a project grant", "auditor with grants", "outsider with grants"):
        permission_grant(actor=root, user=people[name], project="acme")
    permission_grant(actor=root, user=people["operator with a kind grant"], kind="copy")
    permission_grant(actor=root, user=people["inactive user with grants"], kind="copy")
    permission_grant(actor=root, user=people["operator with a project and kind grant"], project="globex", kind="switch")
    for name in ("operator with an object permission", "auditor with grants", "outsider with grants"):
        permission_grant(actor=root, user=people[name], task=tasks["no project"])
    assign_perm(OPERATE, Group.objects.get(name="migrations-team"), tasks["globex copy"])


EXPECTED_OPERABLE = {
    "admin": {"acme copy", "acme switch", "globex copy", "globex switch", "no project"},
    "superuser": set(),  # a Django superuser is no Reckon admin without an audited grant (tasks/access/permissions.py)
    "operator with a project grant": {"acme copy", "acme switch"},
    "operator with a kind grant": {"acme copy", "globex copy"},
    "operator with a project and kind grant": {"globex switch"},
    "operator with an object permission": {"no project"},
    "operator whose group has an object permission": {"globex copy"},
    "operator with only the model-wide permission": set(),
    "operator without a grant": set(),
    "auditor with grants": set(),
    "outsider with grants": set(),
    "inactive user with grants": set(),
    "inactive admin": set(),
    "inactive superuser": set(),
}


def test_operable_condition_agrees_with_can_operate_for_every_persona_and_task(people, tasks, grants) -> None:
    assert set(people) == set(EXPECTED_OPERABLE)
    names = {task.pk: name for name, task in tasks.items()}
    for persona, user in people.items():
        user = User.objects.get(pk=user.pk)  # fresh: no permission cache from earlier checks
        selected = {
            names[pk]
            for pk in Task.objects.filter(operable_condition(Principal.of_user(user))).values_list("pk", flat=True)
        }
        decided = {name for name, task in tasks.items() if can_operate(Principal.of_user(user), task)}
        assert selected == decided, persona
        assert selected == EXPECTED_OPERABLE[persona], persona


def test_a_later_task_of_a_granted_project_is_operable_at_once(people, tasks, grants, make_task) -> None:
    later = make_task(project="acme", kind="anything")
    assert (
        Task.objects.filter(operable_condition(Principal.of_user(people["operator with a project grant"])))
        .filter(pk=later.pk)
        .exists()
    )


def test_scope_grants_are_rows_the_query_reads(people, tasks, grants) -> None:
    """A grant revoked behind the service's back is gone from both answers at once: nothing is cached."""
    user = people["operator with a project grant"]
    ScopeGrant.objects.filter(user=user).delete()
    user = User.objects.get(pk=user.pk)
    assert not Task.objects.filter(operable_condition(Principal.of_user(user))).exists()
    assert not can_operate(Principal.of_user(user), tasks["acme copy"])


def test_an_anonymous_visitor_operates_nothing(tasks) -> None:
    assert not Task.objects.filter(operable_condition(Principal.of_user(AnonymousUser()))).exists()


@pytest.mark.parametrize(
    "persona", ["admin", "operator with a project grant", "operator whose group has an object permission"]
)
def test_the_operable_list_is_one_query(people, tasks, grants, persona, django_assert_num_queries) -> None:
    user = User.objects.get(pk=people[persona].pk)
    with django_assert_num_queries(1):
        found = list(Task.objects.filter(operable_condition(Principal.of_user(user))))
    assert {task.pk for task in found} == {tasks[name].pk for name in EXPECTED_OPERABLE[persona]}


# --- keyset pagination -------------------------------------------------------------------------------------------


def walk(qs: Any, size: int) -> list[list[int]]:
    pages, cursor = [], None
    while True:
        rows, cursor = page(qs, after=cursor, size=size)
        pages.append([row.pk for row in rows])
        if cursor is None:
            return pages


def test_pages_run_newest_change_first_and_end_with_no_cursor(make_task, clock) -> None:
    made = []
    for _ in range(7):
        made.append(make_task().pk)
        clock.advance(timedelta(seconds=1))
    assert walk(Task.objects.all(), 3) == [made[6:3:-1], made[3:0:-1], made[:1]]


def test_tasks_changed_at_the_same_moment_page_by_id(make_task, clock) -> None:
    made = [make_task().pk for _ in range(5)]  # the clock stands still: one updated_at for all
    assert walk(Task.objects.all(), 2) == [made[4:2:-1], made[2:0:-1], made[:1]]


def test_tasks_created_while_paging_neither_repeat_nor_push_rows_off(make_task, clock) -> None:
    made = []
    for _ in range(6):
        made.append(make_task().pk)
        clock.advance(timedelta(seconds=1))
    first, cursor = page(Task.objects.all(), after=None, size=2)
    make_task()  # newer than every row: before the cursor, never shown on a later page
    clock.set(clock.now() - timedelta(seconds=3))
    late = make_task()  # stamped inside the part not read yet (a tie with an unread row): shown once, in its place
    seen = [row.pk for row in first]
    while cursor is not None:
        rows, cursor = page(Task.objects.all(), after=cursor, size=2)
        seen += [row.pk for row in rows]
    assert len(seen) == len(set(seen))
    assert set(seen) == {*made, late.pk}


def test_an_exact_page_has_no_next_cursor(make_task, clock) -> None:
    for _ in range(2):
        make_task()
    rows, cursor = page(Task.objects.all(), after=None, size=2)
    assert len(rows) == 2 and cursor is None


@pytest.mark.parametrize("cursor", ["", "nonsense!", "bm90IGEgY3Vyc29y", "MjAzMC0wMS0wMVQwMDowMDowMHw3"])
def test_a_cursor_not_made_by_page_is_refused(cursor) -> None:
    with pytest.raises(InvalidCursor):
        page(Task.objects.all(), after=cursor, size=2)


def test_the_overview_pages_with_progress_and_reasons_in_one_query(make_task, clock) -> None:
    for _ in range(5):
        make_task()
        clock.advance(timedelta(seconds=1))
    _, cursor = page(task_overview(), after=None, size=2)
    with CaptureQueriesContext(connection) as queries:
        rows, _ = page(task_overview(), after=cursor, size=2)
        shown = [attention_reasons(row) for row in rows]
    assert shown == [[], []]
    assert len(queries) == 1


# --- the queues: TaskFilter, task_queue, attention_queue, page orders ---------------------------------------------


def test_the_holder_is_the_open_leases_and_nobody_once_released(make_task, agent_lease, clock) -> None:
    held, released, free = make_task(), make_task(), make_task()
    agent_lease(held, holder="agent-9")
    lease = agent_lease(released)
    lease_release(lease=lease)
    rows = {row.pk: (row.holder_kind, row.holder_id) for row in Task.objects.with_holder()}
    assert rows == {held.pk: ("agent", "agent-9"), released.pk: (None, None), free.pk: (None, None)}


def test_the_queue_reads_holder_progress_and_reasons_without_a_join() -> None:
    sql = str(task_queue(TaskFilter(holder="agent", text="x", attention="any")).query).upper()
    assert "JOIN" not in sql and "DISTINCT" not in sql


@pytest.mark.parametrize(
    ("task_filter", "ended_only"),
    [
        (TaskFilter(), False),
        (TaskFilter(states=frozenset({"completed"})), True),
        (TaskFilter(states=frozenset({"completed", "failed", "stopped"})), True),
        (TaskFilter(states=frozenset({"completed", "quarantined"})), True),  # nothing leaves quarantine either
        (TaskFilter(states=frozenset({"completed", "stopped_pending"})), False),
        (TaskFilter(states=frozenset({"completed", "paused"}), exclude_states=frozenset({"paused"})), True),
        (TaskFilter(pause_reasons=frozenset({"needs_replan"})), False),
        (TaskFilter(states=frozenset({"completed"}), pause_reasons=frozenset({"needs_replan"})), True),  # empty
        (TaskFilter(exclude_states=frozenset(s.value for s in TaskStatus) - {"failed"}), True),
    ],
)
def test_a_filter_knows_when_it_can_only_show_ended_tasks(task_filter: TaskFilter, ended_only: bool) -> None:
    assert task_filter.only_ended() is ended_only


def test_the_attention_queue_is_needs_attention_narrowed(make_task, clock) -> None:
    human, paused, calm = make_task(project="acme"), make_task(project="globex"), make_task(project="acme")
    set_status(human, "human")
    set_status(paused, "paused", status_reason="needs_replan")
    every = set(Task.objects.needs_attention().values_list("pk", flat=True))
    assert set(attention_queue(TaskFilter()).values_list("pk", flat=True)) == every == {human.pk, paused.pk}
    assert set(attention_queue(TaskFilter(project="acme")).values_list("pk", flat=True)) == {human.pk}
    assert calm.pk not in every


def test_newest_first_pages_keep_every_task_in_place_while_tasks_change(make_task, clock) -> None:
    made = [make_task().pk for _ in range(7)]
    seen, cursor = [], None
    while True:
        rows, cursor = page(Task.objects.all(), after=cursor, size=2, order=Order.NEWEST_FIRST)
        seen += [row.pk for row in rows]
        if cursor is None:
            break
        clock.advance(timedelta(seconds=1))
        Task.objects.filter(pk__in=made[::2]).update(updated_at=clock.now())  # shown and unshown rows change
        make_task()
    assert seen == sorted(made, reverse=True)


def test_oldest_change_first_pages_in_waiting_order(make_task, clock) -> None:
    made = []
    for _ in range(5):
        made.append(make_task().pk)
        clock.advance(timedelta(seconds=1))
    pages, cursor = [], None
    while True:
        rows, cursor = page(Task.objects.all(), after=cursor, size=2, order=Order.OLDEST_CHANGE_FIRST)
        pages.append([row.pk for row in rows])
        if cursor is None:
            break
        make_task()  # a task that starts waiting now joins the end of the queue
    assert [pk for p in pages for pk in p][:5] == made
    assert len({pk for p in pages for pk in p}) == sum(len(p) for p in pages)


def test_a_cursor_with_a_huge_or_negative_id_is_refused() -> None:
    import base64

    for pk in ("-1", "9" * 40):
        cursor = base64.urlsafe_b64encode(f"2030-01-01T00:00:00+00:00|{pk}".encode()).decode()
        with pytest.raises(InvalidCursor):
            page(Task.objects.all(), after=cursor, size=2)
