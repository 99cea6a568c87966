"""A task's attempt budget: how many attempts (op keys sent) the whole task may spend, across every node and every
plan revision — the one rule (pure: no database).

Each node has its own budget (``max_attempts``, 3 by default); the task's bounds their sum, so that a remote that
fails everything stops the task (paused ``budget_exhausted``, for a person) instead of spending every node's
attempts. A fixed number could not be right for plans of every size: a plan of 63 nodes cannot finish on 20
attempts. So the budget scales with the plan:

- **unstated**, it is ``RECKON_TASK_ATTEMPTS_PER_NODE`` per node of the plan (2: each node once and as many retries
  again), at least ``RECKON_DEFAULT_TASK_ATTEMPTS`` (20);
- **stated** by the plan (``"attempt_budget": n`` beside ``"nodes"``, or the task's creation request), it is that, up
  to the deployment's policy: at most ``RECKON_MAX_TASK_ATTEMPTS_PER_NODE`` per node (10), at least
  ``RECKON_DEFAULT_TASK_ATTEMPTS``. More is refused (``plan_invalid``, naming the limit).

Attempts spent stay spent: a plan revision accepted later sets the budget its plan states or, unstated, keeps the
current one, grown by ``RECKON_TASK_ATTEMPTS_PER_NODE`` for each node it has beyond the plan before it — never below
what the task has already used. Re-planning the same work never refreshes its budget; a person who wants more for a
spent task states it in the new plan (within the policy)."""

from math import ceil
from typing import Any

from django.conf import settings

from tasks.core.errors import PlanInvalid

PLAN_KEY = "attempt_budget"


def budget_ceiling(nodes: int) -> int:
    """The most a plan of ``nodes`` nodes may state (the deployment's policy)."""
    return max(settings.RECKON_DEFAULT_TASK_ATTEMPTS, settings.RECKON_MAX_TASK_ATTEMPTS_PER_NODE * nodes)


def default_budget(nodes: int) -> int:
    """The budget of a plan of ``nodes`` nodes that states none."""
    return max(settings.RECKON_DEFAULT_TASK_ATTEMPTS, ceil(settings.RECKON_TASK_ATTEMPTS_PER_NODE * nodes))


def stated_budget(document: Any, nodes: int, *, requested: int | None = None) -> int | None:
    """The budget ``document`` (a plan of ``nodes`` nodes) states, or None; ``requested``: the one a task's creation
    request states beside it (the same, said in another place). PlanInvalid if it is not a whole number from 1 to
    the policy's ceiling, or if the two differ."""
    stated = document.get(PLAN_KEY) if isinstance(document, dict) else None
    if stated is not None and requested is not None and stated != requested:
        raise PlanInvalid([f"the plan states attempt_budget {stated!r} and the request {requested}: state it once"])
    value = stated if stated is not None else requested
    if value is None:
        return None
    ceiling = budget_ceiling(nodes)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInvalid([f"attempt_budget must be at least 1 (a whole number of attempts), not {value!r}"])
    if value > ceiling:
        raise PlanInvalid(
            [
                f"attempt_budget {value} is over this deployment's policy for a plan of {nodes} nodes: at most "
                f"{ceiling} (RECKON_MAX_TASK_ATTEMPTS_PER_NODE = {settings.RECKON_MAX_TASK_ATTEMPTS_PER_NODE} per "
                "node); state less, or leave it out for the default"
            ]
        )
    return value


def budget_after_accept(
    *, stated: int | None, nodes: int, current: int | None = None, previous_nodes: int = 0, used: int = 0
) -> int:
    """The task's budget once a plan of ``nodes`` nodes stating ``stated`` is accepted: ``current`` is the budget
    before (None for a new task) under a plan of ``previous_nodes`` nodes, ``used`` the attempts the task has spent
    (the module's docstring)."""
    if stated is not None:
        budget = stated
    elif current is None:
        budget = default_budget(nodes)
    else:
        budget = current + ceil(settings.RECKON_TASK_ATTEMPTS_PER_NODE * max(0, nodes - previous_nodes))
    return max(budget, used)
