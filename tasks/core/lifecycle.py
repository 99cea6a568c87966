"""The state machines of tasks, nodes and operations as pure tables. No ORM here.

Every status change the compare-and-set (tasks/engine/cas.py) applies is checked against these tables, and every change
against the permit table at the bottom; tests pin them as literal sets.
"""

from enum import StrEnum

from django.db.models import TextChoices

from tasks.core.errors import TaskNotRunnable


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    OBSERVING = "observing"  # a remote operation is accepted and still running
    BACKING_OFF = "backing_off"  # until a node's not_before
    PAUSED = "paused"  # with a PauseReason
    HUMAN = "human"  # a person holds (or last held) the takeover lease
    STOPPING = "stopping"  # cancel requested, in-flight work settling
    STOPPED_PENDING = "stopped_pending"  # stopped, operations still to reconcile
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"
    QUARANTINED = "quarantined"  # the event log and the projection disagree


class PauseReason(StrEnum):
    NEEDS_REPLAN = "needs_replan"
    PERMISSION_REVOKED = "permission_revoked"
    INPUT_CHANGED = "input_changed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    VERSION_CONFLICT = "version_conflict"
    UNPROVABLE = "unprovable"


class NodeStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"  # an operation is registered for it
    OBSERVING = "observing"
    SUCCEEDED = "succeeded"  # only with a receipt that satisfies the evidence spec
    FAILED = "failed"


class OperationStatus(StrEnum):
    INTENT = "intent"
    DISPATCHED = "dispatched"
    COMMITTED = "committed"
    ACCEPTED = "accepted"  # remote accepted, still running
    REJECTED = "rejected"
    UNKNOWN = "unknown"  # leaves only by a query by op key


class FailureClass(StrEnum):
    """DESIGN §6. The class decides the branch; see tasks.core.failures."""

    INVALID_PARAMS = "invalid_params"
    PERMISSION_REVOKED = "permission_revoked"
    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"
    CONNECTION_INTERRUPTED = "connection_interrupted"
    CONFLICT = "conflict"


# Ended: nothing runs on the task any more and nothing moves it back to work. It completed, failed or stopped (the
# terminal statuses: ended by its own work or a cancel, with a log that can be trusted), or it was quarantined
# (nothing moves a task out of quarantined; its log cannot be trusted). The one definition of "ended": services,
# reads, scans and pages ask task_ended or these sets, never a list of their own.
TERMINAL_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.STOPPED})
ENDED_TASK_STATUSES = TERMINAL_TASK_STATUSES | {TaskStatus.QUARANTINED}
NOT_ENDED = frozenset(set(TaskStatus) - ENDED_TASK_STATUSES)
# An agent may register an intent only in these.
RUNNABLE_TASK_STATUSES = frozenset({TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.BACKING_OFF})
# Statuses in which an agent has something to do: run nodes, observe or reconcile operations, settle a cancel.
WORKABLE_TASK_STATUSES = frozenset(
    {
        TaskStatus.PENDING,
        TaskStatus.RUNNING,
        TaskStatus.OBSERVING,
        TaskStatus.BACKING_OFF,
        TaskStatus.STOPPING,
        TaskStatus.STOPPED_PENDING,
    }
)
# Operations that block anything new until a query by op key settles them (safe handover).
OPEN_OPERATION_STATUSES = frozenset({OperationStatus.DISPATCHED, OperationStatus.ACCEPTED, OperationStatus.UNKNOWN})
# Registered and not settled: an intent waiting to be sent (again, with the same op key), or an open operation.
UNSETTLED_OPERATION_STATUSES = OPEN_OPERATION_STATUSES | {OperationStatus.INTENT}

_T = TaskStatus
TASK_TRANSITIONS: frozenset[tuple[TaskStatus, TaskStatus]] = frozenset(
    {
        (_T.PENDING, _T.RUNNING),
        (_T.PENDING, _T.PAUSED),  # inputs changed while a person had the task
        (_T.RUNNING, _T.RUNNING),
        (_T.RUNNING, _T.OBSERVING),
        (_T.RUNNING, _T.BACKING_OFF),
        (_T.RUNNING, _T.PAUSED),
        (_T.RUNNING, _T.COMPLETED),
        (_T.RUNNING, _T.FAILED),
        (_T.OBSERVING, _T.RUNNING),
        (_T.OBSERVING, _T.OBSERVING),
        (_T.OBSERVING, _T.PAUSED),
        (_T.OBSERVING, _T.COMPLETED),
        (_T.OBSERVING, _T.BACKING_OFF),
        (_T.BACKING_OFF, _T.RUNNING),
        (_T.BACKING_OFF, _T.PAUSED),
        (_T.PAUSED, _T.RUNNING),  # an explicit choice (re-plan accepted, approval), or an unprovable op proven
        (_T.PAUSED, _T.OBSERVING),  # an unprovable op turned out to be running remotely
        (_T.PAUSED, _T.COMPLETED),  # the last node's operation was settled by a fact
        (_T.PAUSED, _T.PENDING),
        (_T.PAUSED, _T.FAILED),
        (_T.PAUSED, _T.HUMAN),
        (_T.PENDING, _T.HUMAN),
        (_T.RUNNING, _T.HUMAN),
        (_T.OBSERVING, _T.HUMAN),
        (_T.BACKING_OFF, _T.HUMAN),
        (_T.HUMAN, _T.RUNNING),
        (_T.HUMAN, _T.PENDING),
        (_T.HUMAN, _T.COMPLETED),
        (_T.HUMAN, _T.FAILED),
        (_T.HUMAN, _T.PAUSED),
        (_T.STOPPING, _T.STOPPING),
        (_T.STOPPING, _T.STOPPED_PENDING),
        (_T.STOPPING, _T.STOPPED),
        (_T.STOPPED_PENDING, _T.STOPPED_PENDING),
        (_T.STOPPED_PENDING, _T.STOPPED),
        (_T.STOPPED_PENDING, _T.STOPPING),  # an unknown turned out to be still running remotely
        (_T.STOPPING, _T.STOPPED_PENDING),
    }
    # Cancel may be requested from any non-terminal state; quarantine may hit any state.
    | {
        (s, stop)
        for s in _T
        if s not in ENDED_TASK_STATUSES | {_T.STOPPING, _T.STOPPED_PENDING}
        for stop in (_T.STOPPING, _T.STOPPED_PENDING, _T.STOPPED)
    }
    | {(s, _T.QUARANTINED) for s in _T if s is not _T.QUARANTINED}
)

_N = NodeStatus
NODE_TRANSITIONS: frozenset[tuple[NodeStatus, NodeStatus]] = frozenset(
    {
        (_N.PENDING, _N.RUNNING),
        (_N.RUNNING, _N.RUNNING),
        (_N.RUNNING, _N.OBSERVING),
        (_N.RUNNING, _N.SUCCEEDED),
        (_N.RUNNING, _N.FAILED),
        (_N.RUNNING, _N.PENDING),  # a definite rejection that may be retried after backoff
        (_N.OBSERVING, _N.OBSERVING),
        (_N.OBSERVING, _N.SUCCEEDED),
        (_N.OBSERVING, _N.FAILED),
        (_N.OBSERVING, _N.PENDING),
        # A person's receipt, submitted with a takeover result (tasks.people.takeover).
        (_N.PENDING, _N.SUCCEEDED),
        (_N.FAILED, _N.SUCCEEDED),
    }
)

_O = OperationStatus
OPERATION_TRANSITIONS: frozenset[tuple[OperationStatus, OperationStatus]] = frozenset(
    {
        (_O.INTENT, _O.DISPATCHED),
        (_O.INTENT, _O.REJECTED),  # never sent: cancelled before dispatch
        (_O.DISPATCHED, _O.COMMITTED),
        (_O.DISPATCHED, _O.ACCEPTED),
        (_O.DISPATCHED, _O.REJECTED),
        (_O.DISPATCHED, _O.UNKNOWN),
        (_O.ACCEPTED, _O.ACCEPTED),
        (_O.ACCEPTED, _O.COMMITTED),
        (_O.ACCEPTED, _O.REJECTED),
        (_O.ACCEPTED, _O.UNKNOWN),
        (_O.UNKNOWN, _O.COMMITTED),
        (_O.UNKNOWN, _O.ACCEPTED),
        (_O.UNKNOWN, _O.REJECTED),
        # The remote, asked by op key, has no trace of it: the same intent may be sent again with the same op key.
        (_O.UNKNOWN, _O.INTENT),
        (_O.DISPATCHED, _O.INTENT),
        # Sent before and to be sent again when a cancel came: a copy may still land, so it is not withdrawn.
        (_O.INTENT, _O.UNKNOWN),
    }
)


def task_ended(status: TaskStatus | str) -> bool:
    """Nothing runs on a task in ``status`` any more (ENDED_TASK_STATUSES)."""
    return TaskStatus(status) in ENDED_TASK_STATUSES


def task_can_move(source: TaskStatus | str, target: TaskStatus | str) -> bool:
    return (TaskStatus(source), TaskStatus(target)) in TASK_TRANSITIONS


def node_can_move(source: NodeStatus | str, target: NodeStatus | str) -> bool:
    return (NodeStatus(source), NodeStatus(target)) in NODE_TRANSITIONS


def operation_can_move(source: OperationStatus | str, target: OperationStatus | str) -> bool:
    return (OperationStatus(source), OperationStatus(target)) in OPERATION_TRANSITIONS


# ---------------------------------------------------------------------------------------------------------------
# Who may make which change in which task status: one table, enforced inside the compare-and-set (tasks/engine/cas.py)
# as a condition of its UPDATE, so no caller's ordering of directives can get around it.


class Actor(StrEnum):
    """Who makes a change, as the compare-and-set sees it."""

    AGENT = "agent"  # holds an agent lease on the task
    OPERATOR = "operator"  # holds the takeover lease on the task
    PERSON = "person"  # a person (operator, admin) without the task's lease: cancel, takeover request, force release
    SYSTEM = "system"  # the scheduler or the verifier, without a lease


class ChangeKind(StrEnum):
    CREATE = "create"  # task_create: the first event
    START = "start"  # an operation registered and marked sent, or an intent re-sent: a side effect follows
    SETTLE = "settle"  # what the remote (or a person holding the takeover) said about an open operation
    CONFIRM = "confirm"  # inputs' or receipts' versions read again from the real sources
    CLEANUP = "cleanup"  # temp resources deleted once the task has ended
    CANCEL = "cancel"
    TAKEOVER = "takeover"  # a person asks for, or is granted, the takeover
    DECIDE = "decide"  # a person's result and decision, a settlement by hand, a compensation registered
    PROPOSE = "propose"  # a new plan proposed (changes nothing that runs)
    ACCEPT = "accept"  # a proposed plan becomes the task's plan
    FORCE_RELEASE = "force_release"
    QUARANTINE = "quarantine"


_ACTIVE = frozenset({_T.PENDING, _T.RUNNING, _T.OBSERVING, _T.BACKING_OFF})
_SETTLING = frozenset({_T.STOPPING, _T.STOPPED_PENDING})

PERMITS: dict[tuple[ChangeKind, Actor], frozenset[TaskStatus]] = {
    # Nothing new starts unless the task is runnable: never paused, with people, stopping or quarantined.
    (ChangeKind.START, Actor.AGENT): RUNNABLE_TASK_STATUSES,
    # Open operations settle whatever else happened (pause, cancel); never on a quarantined or ended task.
    (ChangeKind.SETTLE, Actor.AGENT): _ACTIVE | _SETTLING | {_T.PAUSED},
    (ChangeKind.SETTLE, Actor.OPERATOR): _SETTLING | {_T.HUMAN},
    (ChangeKind.CONFIRM, Actor.AGENT): _ACTIVE,
    # Temp resources are deleted once the task has ended with a log that can be trusted: never while quarantined,
    # whose temp resources stay as recorded for a person (tasks.engine.cleanup).
    (ChangeKind.CLEANUP, Actor.AGENT): TERMINAL_TASK_STATUSES,
    # A person makes a stuck temp resource eligible for deletion again (tasks.engine.cleanup.temp_resource_reset).
    (ChangeKind.CLEANUP, Actor.PERSON): TERMINAL_TASK_STATUSES,
    # A cancel by the lease holder, or by a person allowed to operate the task (tasks.access.permissions).
    (ChangeKind.CANCEL, Actor.AGENT): _ACTIVE | {_T.PAUSED},
    (ChangeKind.CANCEL, Actor.OPERATOR): frozenset({_T.HUMAN}),
    (ChangeKind.CANCEL, Actor.PERSON): _ACTIVE | {_T.PAUSED, _T.HUMAN},
    (ChangeKind.CANCEL, Actor.SYSTEM): _ACTIVE | {_T.PAUSED, _T.HUMAN},  # the agent or system that created it
    (ChangeKind.TAKEOVER, Actor.PERSON): NOT_ENDED,
    (ChangeKind.TAKEOVER, Actor.OPERATOR): NOT_ENDED,
    # A cancel may stop the task while a person holds it: what they did by hand is still recorded as it happened.
    (ChangeKind.DECIDE, Actor.OPERATOR): _SETTLING | {_T.HUMAN, _T.STOPPED},
    (ChangeKind.PROPOSE, Actor.AGENT): _ACTIVE | {_T.PAUSED},
    (ChangeKind.PROPOSE, Actor.OPERATOR): frozenset({_T.HUMAN}),
    # Accepted only while nobody advances the old plan; without a lease only when nobody holds the task.
    (ChangeKind.ACCEPT, Actor.AGENT): frozenset({_T.PENDING, _T.PAUSED}),
    (ChangeKind.ACCEPT, Actor.OPERATOR): frozenset({_T.HUMAN}),
    (ChangeKind.ACCEPT, Actor.SYSTEM): frozenset({_T.PENDING, _T.PAUSED, _T.HUMAN}),
    (ChangeKind.FORCE_RELEASE, Actor.PERSON): frozenset(_T),
    (ChangeKind.QUARANTINE, Actor.SYSTEM): frozenset(set(_T) - {_T.QUARANTINED}),
}
# Changes made without a lease that must find nobody holding the task (the holder would be overruled silently).
NEEDS_FREE_TASK = frozenset({(ChangeKind.ACCEPT, Actor.SYSTEM)})
# A lease for an agent is granted only in these: never while people hold the task, never once it is quarantined.
AGENT_LEASABLE = frozenset(set(_T) - {_T.HUMAN, _T.QUARANTINED})


class Need(StrEnum):
    """What a principal must be to make a change as an actor, besides a status PERMITS allows (tasks.access.permits
    asks it of the principal's roles, grants and lease)."""

    LEASE = "its lease"  # the task's agent lease, its own: nothing more (the compare-and-set checks it live)
    OPERATE = "operate"  # a person who may operate the task: an admin, or an operator granted it, its project or kind
    ADMIN = "admin"  # a person with the admin role
    CREATOR = "creator"  # the agent or system process that created the task, without its lease
    SYSTEM = "system"  # a system process itself (the scheduler, the verifier): never an agent or a person


# The other half of the permit table, with the same keys: who the principal must be. An operator (the takeover
# lease's holder) also holds that lease, their own, as an agent holds its own.
NEEDS: dict[tuple[ChangeKind, Actor], Need] = {
    (ChangeKind.START, Actor.AGENT): Need.LEASE,
    (ChangeKind.SETTLE, Actor.AGENT): Need.LEASE,
    (ChangeKind.SETTLE, Actor.OPERATOR): Need.OPERATE,
    (ChangeKind.CONFIRM, Actor.AGENT): Need.LEASE,
    (ChangeKind.CLEANUP, Actor.AGENT): Need.LEASE,
    (ChangeKind.CLEANUP, Actor.PERSON): Need.OPERATE,
    (ChangeKind.CANCEL, Actor.AGENT): Need.LEASE,
    (ChangeKind.CANCEL, Actor.OPERATOR): Need.OPERATE,
    (ChangeKind.CANCEL, Actor.PERSON): Need.OPERATE,
    (ChangeKind.CANCEL, Actor.SYSTEM): Need.CREATOR,
    (ChangeKind.TAKEOVER, Actor.PERSON): Need.OPERATE,
    (ChangeKind.TAKEOVER, Actor.OPERATOR): Need.OPERATE,
    (ChangeKind.DECIDE, Actor.OPERATOR): Need.OPERATE,
    (ChangeKind.PROPOSE, Actor.AGENT): Need.LEASE,
    (ChangeKind.PROPOSE, Actor.OPERATOR): Need.OPERATE,
    (ChangeKind.ACCEPT, Actor.AGENT): Need.LEASE,
    (ChangeKind.ACCEPT, Actor.OPERATOR): Need.OPERATE,
    (ChangeKind.ACCEPT, Actor.SYSTEM): Need.SYSTEM,
    (ChangeKind.FORCE_RELEASE, Actor.PERSON): Need.ADMIN,
    (ChangeKind.QUARANTINE, Actor.SYSTEM): Need.SYSTEM,
}


def permitted(kind: ChangeKind, actor: Actor) -> frozenset[TaskStatus]:
    """The task statuses in which ``actor`` may make a change of ``kind`` (empty: never)."""
    return PERMITS.get((kind, actor), frozenset())


def status_refusal(task_id: int, status: str, kind: ChangeKind, actor: Actor) -> TaskNotRunnable | None:
    """The refusal the compare-and-set names when ``actor`` may not make a change of ``kind`` in ``status`` (None:
    the table allows it)."""
    if TaskStatus(status) in permitted(kind, actor):
        return None
    article = "an" if actor.value[0] in "aeiou" else "a"
    return TaskNotRunnable(
        f"task {task_id} is {status}: {article} {actor} may not {kind} in that status",
        status=str(status),
        change=kind.value,
        actor=actor.value,
    )


class TempResourceStatus(TextChoices):
    ACTIVE = "active"
    CLEANING = "cleaning"
    DELETED = "deleted"
    STUCK = "stuck"  # the remote refused every delete (tasks/engine/cleanup.py): a person must look; no more wake-ups
