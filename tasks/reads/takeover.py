"""What a person taking a task over reads: the takeover package (the task's facts as data) and the takeover page's
state, each read at one moment of the database clock."""

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from audit.principals import Principal
from leases import clock
from leases.models import HolderKind, Lease
from leases.services import lease_open, lease_reservation, operator_ttl
from leases.state import LeaseState, lease_state
from tasks.core.actions import is_approval
from tasks.core.lifecycle import NOT_ENDED, OPEN_OPERATION_STATUSES, NodeStatus, TaskStatus
from tasks.decide.approval_binding import Awaited, awaited, person_may_submit
from tasks.decide.receipts import receipt_summary
from tasks.engine.plans import superseding
from tasks.models import Event, Node, Operation, PlanRevision, ProposalStatus, Receipt, Task
from tasks.reads.state import task_state_sentence
from tasks.rows import get_task as _task
from tasks.rows import node_ref


def takeover_package(task_id: int) -> dict[str, Any]:
    """What a person needs to take over, as data: input versions, completed nodes with their outputs,
    operations to settle by op key, receipts, and the checks to make before deciding."""
    task = _task(task_id)
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))
    open_ops = list(
        Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES]).select_related(
            "node"
        )
    )
    receipts = Receipt.objects.filter(operation__task=task).select_related("operation")
    return {
        "task": {"id": task.pk, "version": task.version, "status": task.status, "reason": task.status_reason},
        "input_refs": task.input_refs,
        "completed": [{"node": n.key, "output": n.output} for n in nodes if n.status == NodeStatus.SUCCEEDED],
        "pending": [
            {"node": n.key, "status": n.status, "last_error": n.last_error_class}
            for n in nodes
            if n.status != NodeStatus.SUCCEEDED
        ],
        "operations_to_settle": [
            {"op_key": op.op_key, "node": node_ref(op.node), "status": op.status, "remote_id": op.remote_id}
            for op in open_ops
        ],
        "receipts": [{"op_key": r.operation.op_key, **receipt_summary(r)} for r in receipts],
        "suggested_checks": [f"query the remote for op key {op.op_key}" for op in open_ops]
        + [f"confirm {name} is still at version {ref.get('version')}" for name, ref in task.input_refs.items()],
    }


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
        Event.objects.filter(task=task, payload__task__has_key="status")
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


@dataclass(frozen=True)
class TakeoverState:
    """What the takeover page shows, read at one moment of the database clock (a fixed number of queries)."""

    task: Task
    now: datetime
    lease: Lease | None
    lease_state: LeaseState | None  # the open lease's state at ``now`` (leases.state)
    mine: bool  # the open lease is this person's takeover lease (live, in its grace or lapsed)
    reserved_for: str  # the operator waiting for the agent's lease to end, or ""
    nodes: list[Node]
    approvable: list[Node]  # approval nodes the holder may approve now
    awaited: list[Awaited]  # the same, each with the requests it would permit and why it is asked for
    resultable: list[Node]  # nodes a result could name (not succeeded, not approvals): the form reads them all
    to_submit: list[Node]  # those the form offers: none an approval not given holds back
    proposals: list[PlanRevision]  # proposed plans newer than the task's plan, waiting for acceptance
    ended: bool

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
        (not the polled lease panel): its open operations, and the newest lease when none is open."""
        operations = Operation.objects.filter(
            task=self.task, status__in=[s.value for s in OPEN_OPERATION_STATUSES]
        ).select_related("node")
        newest = self.lease or Lease.objects.filter(task=self.task).order_by("-epoch").first()
        return task_state_sentence(self.task, nodes=self.nodes, operations=operations, lease=newest, now=self.now)

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


def takeover_state(*, actor: Principal, task: Task) -> TakeoverState:
    now = clock.now()
    lease = lease_open(task.pk)
    reservation = lease_reservation(task.pk)
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version).order_by("position"))
    proposals = list(
        PlanRevision.objects.filter(task=task, status=ProposalStatus.PROPOSED, number__gt=task.plan_version)
        .defer("document")
        .order_by("-number")
    )
    mine = lease is not None and lease.holder_kind == HolderKind.OPERATOR and lease.holder_id == actor.id
    asked = awaited(plan_version=task.plan_version, nodes=nodes, now=now)
    resultable = [n for n in nodes if n.status != NodeStatus.SUCCEEDED and not is_approval(n.action)]
    return TakeoverState(
        task=task,
        now=now,
        lease=lease,
        lease_state=None if lease is None else lease_state(expires_at=lease.expires_at, now=now),
        mine=mine,
        reserved_for=reservation.holder_id if reservation else "",
        nodes=nodes,
        approvable=[a.approval for a in asked],
        awaited=asked,
        resultable=resultable,
        to_submit=[
            n for n in resultable if person_may_submit(plan_version=task.plan_version, nodes=nodes, now=now, node=n)
        ],
        proposals=proposals,
        ended=task.status not in NOT_ENDED,
    )
