"""Who may make which change to a task in which status: the one permit table, asked of every principal — agents,
operators, admins, the system — by the services before they write, by bulk's preview and by the console's offered
actions.

The table is tasks.core.lifecycle: ``PERMITS`` (per change kind and actor, the task statuses it is allowed in) and
``NEEDS`` (per change kind and actor, what the principal must be). This module reads a principal, its lease and a task
against it: the principal half from the roles and grants of tasks.access.permissions, the status half from PERMITS,
which the compare-and-set (tasks/engine/cas.py) also enforces in its UPDATE — whatever a page or a preview predicts
here, the write itself is judged by the same table.

The answer is the refusal a service raises (PermissionDenied, TaskNotRunnable), or None: never a bare bool, so a
page can say why an action is not offered and a service raises it as it is.
"""

from audit.errors import Refused
from audit.principals import Principal
from leases.services import LeaseRef
from tasks.access.permissions import ADMIN, PermissionDenied, can_operate, has_role, operate_denied
from tasks.core.lifecycle import NEEDS, Actor, ChangeKind, Need, status_refusal
from tasks.models import Task


def actor_of(principal: Principal, lease: LeaseRef | None = None) -> Actor:
    """Who the compare-and-set sees making the change: the lease's holder kind with a lease; without one a person,
    or the system (an agent without the task's lease acts as the system: it cancels only a task it created)."""
    if lease is not None:
        return Actor(lease.holder_kind)
    return Actor.PERSON if principal.kind == "user" else Actor.SYSTEM


def permits(
    actor: Principal,
    change: ChangeKind,
    task: Task,
    *,
    lease: LeaseRef | None = None,
    operable: bool | None = None,
) -> Refused | None:
    """Why ``actor`` may not make a change of kind ``change`` to ``task`` now (with ``lease``, its own lease on the
    task, or none), or None when the table allows it. The principal half is judged first, then the status.

    ``operable``: whether a person may operate the task, when the caller has read it already (a page that opened
    only for people who may, a list that read it for many tasks in one query: operable_condition); otherwise it is
    read here, and only when the change needs it."""
    return permits_principal(actor, change, task, lease=lease, operable=operable) or status_refusal(
        task.pk, task.status, change, actor_of(actor, lease)
    )


def permits_principal(
    actor: Principal,
    change: ChangeKind,
    task: Task,
    *,
    lease: LeaseRef | None = None,
    operable: bool | None = None,
) -> PermissionDenied | None:
    """The principal half of ``permits`` alone. A service whose status half has an answer of its own before the
    write (a cancel of an ended task changes nothing) asks this, and leaves the status to the compare-and-set."""
    if operable is None:
        operable = NEEDS.get((change, actor_of(actor, lease))) is Need.OPERATE and can_operate(actor, task)
    return _principal_refusal(
        actor, change, task_id=task.pk, operable=operable, created_by=task.created_by, lease=lease
    )


def permits_known(
    actor: Principal,
    change: ChangeKind,
    *,
    task_id: int,
    status: str,
    operable: bool,
    created_by: str = "",
    lease: LeaseRef | None = None,
) -> Refused | None:
    """``permits`` on facts already read (pure but for the roles cached on a person's user object): what bulk's
    rules ask of each task of a preview."""
    return _principal_refusal(
        actor, change, task_id=task_id, operable=operable, created_by=created_by, lease=lease
    ) or status_refusal(task_id, status, change, actor_of(actor, lease))


def _principal_refusal(
    actor: Principal,
    change: ChangeKind,
    *,
    task_id: int,
    operable: bool,
    created_by: str,
    lease: LeaseRef | None,
) -> PermissionDenied | None:
    """``actor`` is not who NEEDS asks for: a lease that is not its own on this task, no grant, not an admin, not
    the task's creator, not the system."""
    as_actor = actor_of(actor, lease)
    if lease is not None:
        own_kind = "operator" if actor.kind == "user" else actor.kind
        if (lease.holder_kind, lease.holder_id) != (own_kind, actor.id) or lease.task_id != task_id:
            return PermissionDenied(
                f"{actor} does not hold this lease of task {task_id} ({lease.holder_kind}:{lease.holder_id})",
                task_id=task_id,
            )
    need = NEEDS.get((change, as_actor))
    if need is None:
        return PermissionDenied(f"{actor} may not {change} task {task_id} as {as_actor}", task_id=task_id)
    if need is Need.OPERATE and not (actor.kind == "user" and operable):
        return operate_denied(actor, task_id)
    if need is Need.ADMIN and not has_role(actor, ADMIN):
        return PermissionDenied(f"{actor} is not an admin: only admins may {change} task {task_id}", task_id=task_id)
    if need is Need.CREATOR and created_by not in (actor.id, str(actor)):
        return PermissionDenied(
            f"{actor} may {change} only a task it created or holds the lease of, not task {task_id}", task_id=task_id
        )
    if need is Need.SYSTEM and actor.kind != "system":
        return PermissionDenied(f"only the system may {change} task {task_id}", task_id=task_id)
    return None
