"""A task's attempt budget scales with its plan, within the deployment's policy, and attempts spent stay spent
(tasks/core/budget.py): every test tries to make it lie — a long plan stopped by a constant, a budget refreshed by a
re-plan, one stated past the policy, a projection the log cannot rebuild."""

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from leases.models import Lease
from tasks.core.budget import budget_ceiling, default_budget
from tasks.core.errors import BudgetExhausted, PlanInvalid
from tasks.core.lifecycle import FailureClass, PauseReason, TaskStatus
from tasks.core.outcomes import Committed, Failed
from tasks.core.plan import MAX_NODES
from tasks.engine.events import find_log_problem
from tasks.engine.plans import plan_accept, plan_propose
from tasks.engine.protocol import next_directive
from tasks.models import Event, Node, Task
from tests.conftest import chain_plan, effect_node, snapshot
from tests.steps import record, send


def fresh(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def accept(task: Task, lease: Lease, plan: dict[str, Any]) -> Task:
    revision = plan_propose(
        task_id=task.pk, plan=plan, proposed_by="agent:model", expected_version=fresh(task).version, lease=lease
    )
    plan_accept(revision_id=revision.pk, expected_version=fresh(task).version, lease=lease)
    return fresh(task)


def stating(plan: dict[str, Any], budget: Any) -> dict[str, Any]:
    return plan | {"attempt_budget": budget}


def keys(n: int, prefix: str = "n") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_a_plan_longer_than_the_old_constant_finishes_with_a_retry_on_every_node(make_task, agent_lease, clock) -> None:
    """30 nodes, each refused once by an unavailable remote and then done: 60 attempts. A constant budget of 20
    paused this task at its eleventh node; the budget of a plan that states none is 2 per node."""
    task = make_task(chain_plan(*keys(30)))
    assert task.attempt_budget == 2 * 30 == default_budget(30)
    lease = agent_lease(task)
    for key in keys(30):
        record(send(task, lease, key), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
        clock.set(Node.objects.get(task=task, key=key).not_before)
        record(send(task, lease, key), Committed(remote_id=f"r-{key}"), lease)
    done = fresh(task)
    assert (done.status, done.attempts_used, done.attempt_budget) == (TaskStatus.COMPLETED, 60, 60)
    assert find_log_problem(done) is None


def test_a_small_plan_keeps_the_floor(make_task) -> None:
    assert make_task(chain_plan("a")).attempt_budget == settings.RECKON_DEFAULT_TASK_ATTEMPTS == default_budget(1)


@pytest.mark.parametrize("budget", [31, 10**9])
def test_a_budget_past_the_policy_is_refused_naming_the_limit_and_nothing_is_written(make_task, budget) -> None:
    plan = stating(chain_plan(*keys(3)), budget)
    before = snapshot()
    with pytest.raises(PlanInvalid, match=r"at most 30 \(RECKON_MAX_TASK_ATTEMPTS_PER_NODE = 10 per node\)") as refused:
        make_task(plan)
    assert refused.value.fields == [("attempt_budget", refused.value.problems[0])]
    assert snapshot() == before
    assert make_task(stating(chain_plan(*keys(3)), 30)).attempt_budget == 30 == budget_ceiling(3)


@override_settings(RECKON_MAX_TASK_ATTEMPTS_PER_NODE=1)
def test_the_policy_is_the_deployments(make_task) -> None:
    assert budget_ceiling(50) == 50
    with pytest.raises(PlanInvalid, match="at most 50"):
        make_task(stating(chain_plan(*keys(50)), 51))


@pytest.mark.parametrize("budget", [0, -1, True, 2.5, "5", None, [3]])
def test_a_budget_that_is_not_a_whole_number_of_attempts_is_refused(make_task, budget) -> None:
    before = snapshot()
    plan = stating(chain_plan("a"), budget)
    if budget is None:  # stated as null: the same as leaving it out
        assert make_task(plan).attempt_budget == default_budget(1)
        return
    with pytest.raises(PlanInvalid, match="attempt_budget must be at least 1"):
        make_task(plan)
    assert snapshot() == before


def test_a_budget_said_in_two_places_must_say_the_same(make_task) -> None:
    before = snapshot()
    with pytest.raises(PlanInvalid, match="state it once"):
        make_task(stating(chain_plan("a", "b"), 5), attempt_budget=6)
    assert snapshot() == before
    assert make_task(stating(chain_plan("a", "b"), 5), attempt_budget=5).attempt_budget == 5
    assert make_task(chain_plan("a", "b"), attempt_budget=4).attempt_budget == 4


def test_a_proposal_past_the_policy_is_refused_before_it_is_stored(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    before = snapshot()
    with pytest.raises(PlanInvalid, match="at most 20"):
        plan_propose(
            task_id=task.pk,
            plan=stating(chain_plan("a"), 21),
            proposed_by="agent:model",
            expected_version=task.version,
            lease=lease,
        )
    assert snapshot() == before


def test_re_planning_the_same_work_does_not_refresh_a_spent_budget(make_task, agent_lease, clock) -> None:
    plan = chain_plan("a", "b")
    plan["nodes"][0]["max_attempts"] = 10
    task = make_task(stating(plan, 3))
    lease = agent_lease(task)
    for _ in range(3):
        record(send(task, lease, "a"), Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "503"), lease)
        node = Node.objects.get(task=task, plan_version=fresh(task).plan_version, key="a")
        clock.set(node.not_before)
    spent = fresh(task)
    assert (spent.status, spent.status_reason, spent.attempts_used) == (
        TaskStatus.PAUSED,
        PauseReason.BUDGET_EXHAUSTED,
        3,
    )
    replanned = accept(task, lease, chain_plan("a", "b"))  # the same two nodes, no budget stated
    assert (replanned.attempt_budget, replanned.attempts_used) == (3, 3)
    directive = next_directive(task_id=task.pk, lease=lease)
    assert (directive.kind, directive.reason) == ("stop", "budget_exhausted")
    with pytest.raises(BudgetExhausted):
        send(task, lease, "a")
    assert find_log_problem(fresh(task)) is None


def test_a_plan_that_grows_grows_the_budget_and_a_stated_one_is_set_never_below_what_was_used(
    make_task, agent_lease, clock
) -> None:
    task = make_task(chain_plan("a", "b"), attempt_budget=4)
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.INVALID_PARAMS, "the remote said 400"), lease)  # pauses it
    assert (fresh(task).attempts_used, fresh(task).status) == (1, TaskStatus.PAUSED)
    grown = accept(task, lease, chain_plan("a", "b", *keys(5, "x")))  # five more nodes: 2 attempts each
    assert grown.attempt_budget == 4 + 10
    shrunk = accept(task, lease, chain_plan("a", "b"))  # fewer nodes, none stated: the budget stays
    assert shrunk.attempt_budget == 14
    stated = accept(task, lease, stating(chain_plan("a", "b", "c"), 7))
    assert stated.attempt_budget == 7
    below = accept(task, lease, stating(chain_plan("a", "b"), 1))  # one attempt was spent: never below it
    assert (below.attempt_budget, below.attempts_used) == (1, 1)
    assert find_log_problem(below) is None


def test_the_budget_a_re_plan_sets_is_in_the_log(make_task, agent_lease, clock) -> None:
    """The projection is rebuilt from the events: a budget set on the row and not in the log would be found."""
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    task = accept(task, lease, stating(chain_plan("a", "b"), 9))
    assert task.attempt_budget == 9 and find_log_problem(task) is None
    Task.objects.filter(pk=task.pk).update(attempt_budget=10)
    assert find_log_problem(fresh(task)) is not None


# --- the caps a plan's size still meets (until plans are stored once, by digest: issue 26) ----------------------------


def test_a_plan_past_the_node_cap_is_refused_naming_the_way_around(make_task) -> None:
    before = snapshot()
    with pytest.raises(PlanInvalid, match=rf"at most {MAX_NODES} nodes, this one has {MAX_NODES + 1}: give each node"):
        make_task(chain_plan(*keys(MAX_NODES + 1)))
    with pytest.raises(PlanInvalid, match=rf"at most {MAX_NODES} nodes, this one has {MAX_NODES + 2}: give each node"):
        make_task({"nodes": [effect_node("a"), effect_node("b", fan_out={"total": MAX_NODES + 1, "batch": 1})]})
    assert snapshot() == before


def test_a_plan_whose_nodes_all_read_a_versioned_ref_is_accepted_and_its_event_lists_neither(make_task) -> None:
    """95 nodes each reading a versioned ref were refused (the plan_accepted event named every node and ref, over
    the event cap). The event now names the plan's digest; the ref, read by every node, is one input ref."""
    locator = "projects/" + "p" * 60
    ref = {"source": "store", "locator": locator, "version": "1", "digest": "sha256:" + "5e" * 32}
    plan = {
        "nodes": [
            {"key": f"n{i}", "action": "test.write", "input": {"source": {"ref": ref}}, "evidence": {"remote_id": True}}
            for i in range(95)
        ]
    }
    task = make_task(plan)
    accepted = Event.objects.get(task=task, type="plan_accepted")
    assert "nodes" not in accepted.payload and "input_refs" not in accepted.payload["task"]
    assert task.input_refs == {"n0.source": ref}
    assert task.nodes.count() == 95
    assert find_log_problem(task) is None
