"""What a person taking a task over reads: the takeover package (the task's facts as data) and the takeover page's
state, each read at one moment of the database clock — both bounded, whatever the plan's length: they name at most
NAMED_MAX rows of a kind and count the rest in the database, and the result form shows the fields of at most
RESULT_STEPS_SHOWN steps, with any other step that can take a result opened by its key."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from django.db.models import Case, Count, Exists, IntegerField, Min, Q, QuerySet, Value, When

from audit.principals import Principal
from leases import clock
from leases.models import HolderKind, Lease
from leases.services import lease_open, lease_reservation, operator_ttl
from leases.state import LeaseState, lease_state
from tasks.core.actions import approval_actions, is_approval
from tasks.core.lifecycle import NOT_ENDED, OPEN_OPERATION_STATUSES, NodeStatus, OperationStatus, TaskStatus
from tasks.core.plan import KEY_PATTERN
from tasks.decide.approval_binding import Awaited, awaited, person_may_submit
from tasks.decide.receipts import receipt_summary
from tasks.engine.plans import superseding
from tasks.models import LoggedEvent, Node, Operation, PlanRevision, ProposalStatus, Receipt, Task
from tasks.reads.state import Progress, approval_waits_at, progress_state_sentence
from tasks.rows import get_task as _task
from tasks.rows import node_ref

# The package and the takeover page name at most this many rows of a kind (nodes not done, succeeded nodes, open
# operations, receipts, input refs), each with its whole count from the database beside them.
NAMED_MAX = 20
# The result form shows the fields of this many steps that can take a result (failed first, then in plan order);
# a person opens any other by its key (``?step=<key>``), up to STEPS_BY_KEY_MAX at once.
RESULT_STEPS_SHOWN = 10
STEPS_BY_KEY_MAX = 20
# A posted result form is read for at most this many steps (those it showed, and those opened by key).
STEPS_POSTED_MAX = RESULT_STEPS_SHOWN + STEPS_BY_KEY_MAX

_OPEN = sorted(s.value for s in OPEN_OPERATION_STATUSES)
# Unknown operations first, then what is in flight, then intents; by registration within each.
_OPEN_RANK = Case(
    When(status=OperationStatus.UNKNOWN.value, then=Value(0)),
    When(status__in=(OperationStatus.DISPATCHED.value, OperationStatus.ACCEPTED.value), then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)
# Failed nodes first, then the others in plan order.
_FAILED_FIRST = Case(When(status=NodeStatus.FAILED.value, then=Value(0)), default=Value(1), output_field=IntegerField())


def _plan(task: Task) -> "QuerySet[Node]":
    return Node.objects.filter(task=task, plan_version=task.plan_version)


def _not_done(task: Task) -> "QuerySet[Node]":
    """The current plan's nodes that have not succeeded, failed first, then in plan order."""
    return (_plan(task).exclude(status=NodeStatus.SUCCEEDED.value).alias(failed_first=_FAILED_FIRST)).order_by(
        "failed_first", "position"
    )


def _resultable(task: Task) -> "QuerySet[Node]":
    """The nodes a person's result could name: not succeeded and not approvals (those are approved), failed first."""
    return _not_done(task).exclude(action__in=approval_actions())


@dataclass(frozen=True)
class PlanCounts:
    """The current plan's nodes as the database counts them."""

    total: int
    done: int
    failed: int
    resultable: int  # not succeeded, not approvals: a person's result could name them
    retry_at: datetime | None  # the earliest not_before of a pending node


def takeover_package(task_id: int) -> dict[str, Any]:
    """What a person needs to take over, as data: the task, its input refs, its nodes not done (failed first) and
    those done with their outputs, the operations to settle by op key (unknown first), the newest receipts, and the
    checks to make before deciding. Each list names at most NAMED_MAX rows; ``counts`` says how many the database
    holds of each (7 queries, whatever the number of nodes, operations and receipts)."""
    return package_of(_task(task_id))


def plan_counts(task: Task) -> PlanCounts:
    """The current plan's nodes as the database counts them (one query)."""
    found = _plan(task).aggregate(
        total=Count("pk"),
        done=Count("pk", filter=Q(status=NodeStatus.SUCCEEDED.value)),
        failed=Count("pk", filter=Q(status=NodeStatus.FAILED.value)),
        resultable=Count("pk", filter=~Q(status=NodeStatus.SUCCEEDED.value) & ~Q(action__in=approval_actions())),
        retry_at=Min("not_before", filter=Q(status=NodeStatus.PENDING.value)),
    )
    return PlanCounts(**found)


def package_of(task: Task, *, counts: PlanCounts | None = None) -> dict[str, Any]:
    """``takeover_package`` of a task row already read: 6 queries, 5 given the plan's ``counts``."""
    plan = _plan(task)
    nodes = counts or plan_counts(task)
    completed = list(
        plan.filter(status=NodeStatus.SUCCEEDED.value).order_by("position").values_list("key", "output")[:NAMED_MAX]
    )
    pending = list(_not_done(task).values_list("key", "status", "last_error_class")[:NAMED_MAX])
    operations = Operation.objects.filter(task=task)
    ops = operations.aggregate(open=Count("pk", filter=Q(status__in=_OPEN)), receipts=Count("receipt"))
    open_ops = list(
        operations.filter(status__in=_OPEN)
        .alias(rank=_OPEN_RANK)
        .select_related("node")
        .order_by("rank", "registered_at", "pk")[:NAMED_MAX]
    )
    receipts = list(
        Receipt.objects.filter(operation__task=task)
        .select_related("operation")
        .order_by("-received_at", "-pk")[:NAMED_MAX]
    )
    refs = task.input_refs if isinstance(task.input_refs, dict) else {}
    named_refs = {name: refs[name] for name in sorted(refs)[:NAMED_MAX]}
    counted = {
        "nodes": nodes.total,
        "succeeded": nodes.done,
        "not_succeeded": nodes.total - nodes.done,
        "failed": nodes.failed,
        "operations_to_settle": ops["open"],
        "receipts": ops["receipts"],
        "input_refs": len(refs),
    }
    checks = [f"query the remote for op key {op.op_key}" for op in open_ops]
    if counted["operations_to_settle"] > len(open_ops):
        checks.append(
            f"and {counted['operations_to_settle'] - len(open_ops)} more open operations to query by op key "
            "(the task's Actions page lists them all)"
        )
    checks += [f"confirm {name} is still at version {_version(ref)}" for name, ref in named_refs.items()]
    if len(refs) > len(named_refs):
        checks.append(f"and {len(refs) - len(named_refs)} more input refs to confirm")
    return {
        "task": {"id": task.pk, "version": task.version, "status": task.status, "reason": task.status_reason},
        "counts": counted,
        "named_at_most": NAMED_MAX,
        # How many of each kind the lists below do not name (the database's count less the rows named).
        "not_named": {
            "input_refs": len(refs) - len(named_refs),
            "completed": nodes.done - len(completed),
            "pending": nodes.total - nodes.done - len(pending),
            "operations_to_settle": counted["operations_to_settle"] - len(open_ops),
            "receipts": counted["receipts"] - len(receipts),
        },
        "input_refs": named_refs,
        "completed": [{"node": key, "output": output} for key, output in completed],
        "pending": [{"node": key, "status": status, "last_error": error} for key, status, error in pending],
        "operations_to_settle": [
            {"op_key": op.op_key, "node": node_ref(op.node), "status": op.status, "remote_id": op.remote_id}
            for op in open_ops
        ],
        "receipts": [{"op_key": r.operation.op_key, **receipt_summary(r)} for r in receipts],
        "suggested_checks": checks,
    }


def _version(ref: Any) -> Any:
    return ref.get("version") if isinstance(ref, dict) else None


@dataclass(frozen=True)
class Pause:
    """Why a task paused, as the event that paused it recorded it: its pause reason and detail."""

    reason: str  # a PauseReason value
    detail: str
    seq: int  # the event that paused it
    at: datetime


def pause_before_takeover(task: Task) -> Pause | None:
    """Why a task a person took over had paused: taking it over clears the task's pause reason and detail, the
    event log keeps them. The last event that set a status other than taken over is the one the takeover found;
    None if that was not a pause (the person took it from a running agent, say), or if the task is not taken over.
    One query, on the task's events newest first."""
    if task.status != TaskStatus.HUMAN:
        return None
    before = (
        LoggedEvent.objects.filter(task=task, payload__task__has_key="status")
        .exclude(payload__task__status=TaskStatus.HUMAN.value)
        .order_by("-seq")
        .values_list("seq", "created_at", "payload")
        .first()
    )
    if before is None:
        return None
    seq, at, payload = before
    fields = payload["task"]
    if fields.get("status") != TaskStatus.PAUSED.value:
        return None
    return Pause(reason=fields.get("status_reason", ""), detail=fields.get("status_detail", ""), seq=seq, at=at)


def asked_steps(keys: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """The step keys a link or a posted form asks for, as keys to look up (in order, once each, at most
    STEPS_POSTED_MAX), and a sentence for each one that is not a step's key or is past that cap (at most NAMED_MAX
    sentences: the rest are counted in one)."""
    found: list[str] = []
    problems: dict[str, str] = {}
    unread = 0
    for key in dict.fromkeys(keys):
        if len(problems) >= NAMED_MAX:
            unread += 1
        elif not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            shown = key[:40] if isinstance(key, str) else ""
            problems[shown] = f"{shown!r} is not a step's key (1 to 100 of a-z, 0-9, _ . -)"
        elif len(found) >= STEPS_POSTED_MAX:
            problems[key] = f"step {key} was not opened: at most {STEPS_POSTED_MAX} steps are read at once"
        else:
            found.append(key)
    if unread:
        problems["…"] = f"and {unread} more keys, not read"
    return found, problems


@dataclass(frozen=True)
class TakeoverState:
    """What the takeover page shows, read at one moment of the database clock (a fixed number of queries whatever
    the plan's length: the plan's nodes are counted in the database, and read whole only when the plan holds an
    approval node — the approval rule reads the dependency graph; the result form's steps are a bounded page)."""

    task: Task
    now: datetime
    lease: Lease | None
    lease_state: LeaseState | None  # the open lease's state at ``now`` (leases.state)
    mine: bool  # the open lease is this person's takeover lease (live, in its grace or lapsed)
    reserved_for: str  # the operator waiting for the agent's lease to end, or ""
    proposals: list[PlanRevision]  # proposed plans newer than the task's plan, waiting for acceptance
    ended: bool
    # The steps asked for by key (a link's ``?step=``, a posted form's fields), checked (asked_steps), and a
    # sentence for each asked for that is not a step's key.
    steps: tuple[str, ...] = ()
    steps_refused: tuple[tuple[str, str], ...] = ()

    # --- the plan, counted and read in bounded parts (each read once, when the page first asks for it) ---------

    @cached_property
    def counts(self) -> PlanCounts:
        return plan_counts(self.task)

    @cached_property
    def graph(self) -> list[Node]:
        """The plan's nodes the approval rule reads: all of them, in plan order, when the plan holds an approval
        node; none when it holds none (nothing then waits for an approval). One query."""
        plan = _plan(self.task)
        return list(plan.filter(Exists(plan.filter(action__in=approval_actions()))).order_by("position"))

    @cached_property
    def awaited(self) -> list[Awaited]:
        """The approvals the holder may give now, each with the requests it would permit and why it is asked for."""
        return awaited(plan_version=self.task.plan_version, nodes=self.graph, now=self.now)

    @property
    def approvable(self) -> list[Node]:
        return [a.approval for a in self.awaited]

    @cached_property
    def listed(self) -> list[Node]:
        """The first RESULT_STEPS_SHOWN steps a result could name: failed first, then in plan order."""
        return list(_resultable(self.task)[:RESULT_STEPS_SHOWN])

    @property
    def unlisted(self) -> int:
        """How many more steps could take a result than the form shows first (the database's count)."""
        return max(0, self.counts.resultable - len(self.listed))

    @cached_property
    def _asked(self) -> tuple[list[Node], dict[str, str]]:
        """The steps asked for by key that could take a result, and a sentence for each that cannot."""
        problems = dict(self.steps_refused)
        if not self.steps:
            return [], problems
        by_key = {n.key: n for n in _plan(self.task).filter(key__in=self.steps)}
        found: list[Node] = []
        for key in self.steps:
            node = by_key.get(key)
            if node is None:
                problems[key] = f"plan {self.task.plan_version} has no step {key}"
            elif node.status == NodeStatus.SUCCEEDED:
                problems[key] = f"step {key} succeeded already, on a receipt: there is nothing to submit for it"
            elif is_approval(node.action):
                problems[key] = f"step {key} is an approval: it is approved, not given a result"
            else:
                found.append(node)
        return found, problems

    @property
    def chosen(self) -> list[Node]:
        """The steps asked for by key that could take a result and are not among the listed ones."""
        listed = {n.key for n in self.listed}
        return [n for n in self._asked[0] if n.key not in listed]

    @property
    def step_problems(self) -> dict[str, str]:
        """Step key → why no result can be given for it (not a key, not in the plan, succeeded, an approval)."""
        return self._asked[1]

    @property
    def resultable(self) -> list[Node]:
        """The steps the result form reads: the listed ones, then those asked for by key."""
        return self.listed + self.chosen

    @cached_property
    def input_nodes(self) -> list[Node]:
        """The nodes the form resolves its steps' inputs from (what an evidence spec pins): the whole graph when
        the plan holds an approval node, else the form's steps and the nodes whose outputs they read (one query,
        none when they read none)."""
        if self.graph:
            return self.graph
        steps = self.resultable
        have = {n.key for n in steps}
        sources = sorted(
            {
                value["from"]
                for node in steps
                for value in node.input.values()
                if isinstance(value, dict) and isinstance(value.get("from"), str) and value["from"] not in have
            }
        )
        return steps + (list(_plan(self.task).filter(key__in=sources)) if sources else [])

    @cached_property
    def to_submit(self) -> list[Node]:
        """The form's steps it offers: none an approval not given holds back."""
        plan_version = self.task.plan_version
        return [
            n
            for n in self.resultable
            if person_may_submit(plan_version=plan_version, nodes=self.graph, now=self.now, node=n)
        ]

    @property
    def withheld(self) -> list[Node]:
        """The form's steps an approval not given holds back (a result for one is refused by the service)."""
        offered = {n.key for n in self.to_submit}
        return [n for n in self.resultable if n.key not in offered]

    @cached_property
    def package(self) -> dict[str, Any]:
        """The takeover package (package_of), for the page of the person who holds the task."""
        return package_of(self.task, counts=self.counts)

    # --- the rest of the page -----------------------------------------------------------------------------------

    @cached_property
    def superseded(self) -> dict[int, int]:
        """Proposal (by primary key) → the revision that supersedes it (tasks.engine.plans.superseding: the one rule
        the accept obeys); a proposal not in it may be accepted."""
        newest = max((r.number for r in self.proposals), default=self.task.plan_version)
        found = {
            r.pk: superseding(r.number, newest=newest, plan_version=self.task.plan_version) for r in self.proposals
        }
        return {pk: number for pk, number in found.items() if number is not None}

    @property
    def acceptable_proposals(self) -> list[PlanRevision]:
        return [r for r in self.proposals if r.pk not in self.superseded]

    @cached_property
    def sentence(self) -> str:
        """The task's state in the one sentence every page shows (tasks.reads.state), read only by the page's head
        (not the polled lease panel): the plan's progress as counted, its open operations, and the newest lease
        when none is open."""
        operations = Operation.objects.filter(task=self.task, status__in=_OPEN).select_related("node")
        newest = self.lease or Lease.objects.filter(task=self.task).order_by("-epoch").first()
        counts = self.counts
        progress = Progress(
            done=counts.done,
            total=counts.total,
            approval_waits=approval_waits_at(self.task, self.graph, self.now),
            retry_at=counts.retry_at,
        )
        return progress_state_sentence(self.task, progress=progress, operations=operations, lease=newest, now=self.now)

    @cached_property
    def paused_before(self) -> Pause | None:
        """Why the task had paused before a person took it over (read only by the page that shows it)."""
        return pause_before_takeover(self.task)

    @property
    def seconds_left(self) -> int | None:
        return None if self.lease_state is None else self.lease_state.seconds_left

    @property
    def holding(self) -> bool:
        """This person's takeover lease still keeps the task (live, or in its grace: a renewal brings it back)."""
        return self.mine and self.lease_state is not None and self.lease_state.held

    @property
    def ttl_seconds(self) -> int:
        ttl = self.lease.ttl if self.lease is not None and self.lease.ttl else operator_ttl()
        return int(ttl.total_seconds())

    @property
    def renew_every(self) -> int:
        """The page renews its lease every third of its ttl: two renewals may be lost before it expires."""
        return max(1, self.ttl_seconds // 3)

    @property
    def renew_in(self) -> int:
        """Seconds until the page's next renewal: every third of the ttl, sooner when the lease has less left (a
        page opened late in a lease renews before it lapses)."""
        left = self.seconds_left
        if left is None:
            return self.renew_every
        return max(1, min(self.renew_every, left // 2))

    @property
    def lapsed(self) -> bool:
        """Past expiry and grace: it cannot be renewed; the next claim closes it and grants a new epoch."""
        return self.lease_state is not None and self.lease_state.lapsed

    @property
    def expiring(self) -> bool:
        left = self.seconds_left
        return left is not None and left <= self.renew_every

    @property
    def in_grace(self) -> bool:
        return self.lease_state is not None and self.lease_state.in_grace


def takeover_state(*, actor: Principal, task: Task, steps: Sequence[str] = ()) -> TakeoverState:
    """The takeover page's state: the lease, the reservation and the proposals now (3 queries); the plan's counts,
    its approval graph, the form's first steps, the steps asked for by key (``steps``: a link's ``?step=`` or a
    posted form's; any text is checked here, none reaches the database unless it is a step's key) and the package
    are read when the page first asks for them."""
    now = clock.now()
    lease = lease_open(task.pk)
    reservation = lease_reservation(task.pk)
    proposals = list(
        PlanRevision.objects.filter(task=task, status=ProposalStatus.PROPOSED, number__gt=task.plan_version)
        .defer("document")
        .order_by("-number")
    )
    mine = lease is not None and lease.holder_kind == HolderKind.OPERATOR and lease.holder_id == actor.id
    keys, refused = asked_steps(steps)
    return TakeoverState(
        task=task,
        now=now,
        lease=lease,
        lease_state=None if lease is None else lease_state(expires_at=lease.expires_at, now=now),
        mine=mine,
        reserved_for=reservation.holder_id if reservation else "",
        proposals=proposals,
        ended=task.status not in NOT_ENDED,
        steps=tuple(keys),
        steps_refused=tuple(refused.items()),
    )
