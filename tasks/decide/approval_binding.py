"""An approval bound to the exact call: what an approval permits, and the one rule a gated start obeys. Pure.

An approval node gates the effect nodes that name it in ``depends_on`` — its *gated* nodes. The request a gated
node's operation will send is ``{"action", "input"}`` with the input resolved as the start resolves it
(tasks.decide.decisions.start); its digest is what an approval permits.

- **Proposed.** When an approval is awaited — its node is ready and not approved, or a ready gated node's request
  is not bound by the approval given — the agent's directive stops ``awaiting_approval`` (naming the approval node)
  and records what is asked (event ``approval_proposed``): the digest of each pending gated node's request, their
  digest together, the plan revision (``proposal_change``).
- **Approved.** A person's approval (tasks/people/approvals.py, event ``node_approved``) records the *binding* on
  the approval node's row: the digest of the requests it permits, ``{gated node: request digest}``, the plan
  revision it was given under, an expiry on the database clock, the event that records it and who gave it.
- **Executed.** A gated operation starts only if, for every approval it depends on, the binding exists, was given
  under the task's current plan revision, names this very request's digest, and has not expired at the database
  clock's reading (``refusal``: the rule, in this one place). A start under it records ``approval_executed``
  (``executed_change``, applied with the start in one write).

Every refusal is named (ApprovalMissing, ApprovalPlanMoved, ApprovalRequestChanged, ApprovalExpired) and writes
nothing; the task then waits for a new approval. The writes are the agent's (tasks.engine.protocol) and the
person's (tasks.people.approvals); the database refuses a binding that is not whole, given by a person, on a
succeeded node, and one rewritten other than by a later approval (tasks/migrations/0018).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from audit.hygiene import digest_of
from tasks.core.actions import is_approval
from tasks.core.errors import (
    ApprovalExpired,
    ApprovalMissing,
    ApprovalNotGiven,
    ApprovalPlanMoved,
    ApprovalRefused,
    ApprovalRequestChanged,
    NodeNotReady,
)
from tasks.core.lifecycle import ChangeKind, NodeStatus
from tasks.decide.change import Change, Snapshot
from tasks.decide.decisions import Directive, resolved_input
from tasks.models import Node, Operation
from tasks.rows import node_ref

AWAITING = "awaiting_approval"  # the directive's reason (tasks.decide.decisions.directive names it too)
# An approval node's binding: its columns, in the log with the node's other fields (tasks.engine.events.NODE_FIELDS).
BINDING_FIELDS = (
    "approval_digest",
    "approval_requests",
    "approval_plan_version",
    "approval_expires_at",
    "approval_seq",
    "approved_by",
)


# ------------------------------------------------------------------------------------------------ what is gated


def request_digest(nodes: Sequence[Node] | Mapping[str, Node], node: Node) -> str:
    """The digest of the request ``node``'s operation will send: ``{"action", "input"}``, the input resolved as the
    start resolves it (raises NodeNotReady while an input it reads has not succeeded)."""
    return call_digest({"action": node.action, "input": resolved_input(nodes, node)})


def call_digest(request: dict[str, Any]) -> str:
    """The digest an approval permits of an operation's request: of its action and its input — the call's
    arguments — whatever else the request carries for its transport."""
    return digest_of({"action": request.get("action"), "input": request.get("input")})


def gates_of(nodes: Sequence[Node] | Mapping[str, Node], node: Node) -> list[Node]:
    """The approval nodes ``node`` depends on directly: each must bind its request before it starts. ``nodes``: the
    plan's nodes, or them by key (``Snapshot.by_key``)."""
    by_key = nodes if isinstance(nodes, Mapping) else {n.key: n for n in nodes}
    return [by_key[k] for k in node.depends_on if k in by_key and is_approval(by_key[k].action)]


def gated_by(nodes: Sequence[Node], approval: Node) -> list[Node]:
    """The effect nodes that depend directly on ``approval``, in plan order."""
    return [n for n in nodes if approval.key in n.depends_on and not is_approval(n.action)]


@dataclass(frozen=True)
class Binding:
    """What an approval node's row says was approved."""

    digest: str  # digest_of(requests)
    requests: dict[str, str]  # gated node key → the digest of the request it permits
    plan_version: int  # the plan revision it was given under
    expires_at: datetime  # on the database clock
    seq: int  # the event that records it (node_approved), with its audit row
    by: str  # "user:<name>"

    def expired(self, now: datetime) -> bool:
        """Expired at ``now`` (a reading of the database clock): from ``expires_at`` on, exactly as a lease."""
        return not now < self.expires_at


def binding_of(node: Node) -> Binding | None:
    if node.approval_seq is None or node.approval_expires_at is None or node.approval_plan_version is None:
        return None
    return Binding(
        digest=node.approval_digest,
        requests=dict(node.approval_requests or {}),
        plan_version=node.approval_plan_version,
        expires_at=node.approval_expires_at,
        seq=node.approval_seq,
        by=node.approved_by,
    )


# ------------------------------------------------------------------------------------------------ the rule


def refusal(snap: Snapshot, node: Node, digest: str) -> ApprovalRefused | None:
    """THE rule: may ``node``'s operation, whose request has ``digest``, start now? None when every approval it
    depends on binds it — given under the task's current plan revision, naming this request's digest, not expired
    at the snapshot's reading of the database clock — else the named refusal (nothing is written)."""
    return judged(plan_version=snap.task.plan_version, nodes=snap.by_key, now=snap.now, node=node, digest=digest)


def judged(
    *, plan_version: int, nodes: Sequence[Node] | Mapping[str, Node], now: datetime, node: Node, digest: str
) -> ApprovalRefused | None:
    """``refusal`` on its parts (a page or a person's service reads them without a step's snapshot)."""
    for gate in gates_of(nodes, node):
        binding = binding_of(gate) if gate.status == NodeStatus.SUCCEEDED else None
        where = {"node": node.key, "approval": gate.key, "request_digest": digest}
        if binding is None:
            return ApprovalMissing(
                f"node {node.key} waits for approval {gate.key}: no approval binds its request", **where
            )
        if binding.plan_version != plan_version:
            return ApprovalPlanMoved(
                f"approval {gate.key} was given under plan revision {binding.plan_version}; the plan is at revision "
                f"{plan_version} now: it must be approved again",
                **where,
                approved_plan_revision=binding.plan_version,
            )
        approved = binding.requests.get(node.key)
        if digest_of(binding.requests) != binding.digest or approved != digest:
            permitted = f"permits {approved}" if approved else "does not cover it"
            return ApprovalRequestChanged(
                f"node {node.key}'s request is {digest}; approval {gate.key} {permitted}: it must be approved again",
                **where,
                approved_digest=approved or "",
            )
        if binding.expired(now):
            return ApprovalExpired(
                f"approval {gate.key} expired at {binding.expires_at:%Y-%m-%d %H:%M:%S} UTC: it must be approved again",
                **where,
                expires_at=binding.expires_at.isoformat(),
            )
    return None


def person_refusal(
    *, plan_version: int, nodes: Sequence[Node], now: datetime, node: Node, request: dict[str, Any]
) -> ApprovalNotGiven | None:
    """May a person type a result for ``node``, recorded as an operation sending ``request``? The same rule as a
    start (``judged``, on the request's call digest): a result for a gated step does the gated work, so without an
    approval that binds it the answer is ApprovalNotGiven, naming the approval and why (the rule's own code)."""
    if not gates_of(nodes, node):
        return None
    refused = judged(plan_version=plan_version, nodes=nodes, now=now, node=node, digest=call_digest(request))
    if refused is None:
        return None
    return ApprovalNotGiven(
        f"step {node.key} waits for approval {refused.details.get('approval')}: a result for it cannot be recorded "
        f"before that approval is given ({refused})",
        **refused.details,
        why=refused.code,
    )


def person_may_submit(*, plan_version: int, nodes: Sequence[Node], now: datetime, node: Node) -> bool:
    """Whether the result form offers ``node``: not while an approval it depends on does not bind its request (the
    request it would record is the one its start would send; one whose input is not produced yet is not bound)."""
    if not gates_of(nodes, node):
        return True
    try:
        request = {"action": node.action, "input": resolved_input(nodes, node)}
    except NodeNotReady:
        return False
    return person_refusal(plan_version=plan_version, nodes=nodes, now=now, node=node, request=request) is None


# ------------------------------------------------------------------------------------------------ awaited


@dataclass(frozen=True)
class Proposal:
    """What an approval is asked for: the requests of its pending gated nodes, under the plan revision."""

    approval: str
    plan_version: int
    requests: dict[str, str]

    @property
    def digest(self) -> str:
        return digest_of(self.requests)


def proposal(nodes: Sequence[Node], approval: Node, plan_version: int) -> Proposal:
    """The requests ``approval`` is asked to permit: those of its gated nodes still pending whose request is known
    now (a gated node that reads an output not produced yet is asked for once it is: the approval given before does
    not cover it)."""
    requests: dict[str, str] = {}
    for node in gated_by(nodes, approval):
        if node.status != NodeStatus.PENDING:
            continue
        try:
            requests[node.key] = request_digest(nodes, node)
        except NodeNotReady:
            continue
    return Proposal(approval=approval.key, plan_version=plan_version, requests=requests)


@dataclass(frozen=True)
class Awaited:
    """An approval a person is asked for now, and why."""

    approval: Node
    proposal: Proposal
    code: str  # "approval_missing" for a first approval, else the refusal's code
    why: str

    @property
    def recorded(self) -> bool:
        """The log holds this proposal already (event approval_proposed, not answered since)."""
        return self.approval.approval_proposed_digest == self.proposal.digest


def awaited(*, plan_version: int, nodes: Sequence[Node], now: datetime) -> list[Awaited]:
    """The approvals a person may give now, in plan order: an approval node that is pending with every dependency
    succeeded, or a succeeded one whose binding the rule refuses for a ready gated node (expired, given under
    another plan revision, not naming that node's request)."""
    succeeded = {n.key for n in nodes if n.status == NodeStatus.SUCCEEDED}
    found: list[Awaited] = []
    for approval in nodes:
        if not is_approval(approval.action) or not set(approval.depends_on) <= succeeded:
            continue
        if approval.status == NodeStatus.PENDING:
            asked = proposal(nodes, approval, plan_version)
            found.append(Awaited(approval, asked, ApprovalMissing.code, f"approval {approval.key} is not given yet"))
            continue
        if approval.status != NodeStatus.SUCCEEDED:
            continue
        refused = _first_refused(plan_version, nodes, now, approval, succeeded)
        if refused is not None:
            found.append(Awaited(approval, proposal(nodes, approval, plan_version), refused.code, str(refused)))
    return found


def _first_refused(
    plan_version: int, nodes: Sequence[Node], now: datetime, approval: Node, succeeded: set[str]
) -> ApprovalRefused | None:
    for node in gated_by(nodes, approval):
        if node.status != NodeStatus.PENDING or not set(node.depends_on) <= succeeded:
            continue
        try:
            digest = request_digest(nodes, node)
        except NodeNotReady:
            continue
        refused = judged(plan_version=plan_version, nodes=nodes, now=now, node=node, digest=digest)
        if refused is not None and refused.details.get("approval") == approval.key:
            return refused
    return None


# ------------------------------------------------------------------------------------------------ the agent's side


def gated_directive(snap: Snapshot, d: Directive) -> Directive:
    """``d`` (tasks.decide.decisions.directive), unless it is to start a fresh node that an approval gates and the
    rule refuses: then ``stop awaiting_approval``, naming that approval node (the start would be refused)."""
    if d.kind != "execute" or d.op_key:
        return d
    node = snap.node(d.node_key)
    if node is None or not gates_of(snap.by_key, node):
        return d
    try:
        refused = refusal(snap, node, request_digest(snap.by_key, node))
    except NodeNotReady:
        return d  # the start refuses it by name
    if refused is None:
        return d
    return Directive("stop", d.task_version, node_key=str(refused.details["approval"]), reason=AWAITING)


def proposal_change(snap: Snapshot, d: Directive) -> Change | None:
    """When ``d`` stops awaiting an approval: the change that records what is asked (event ``approval_proposed``),
    unless the log holds that proposal already. Made by the lease holder (kind ``propose``)."""
    if d.kind != "stop" or d.reason != AWAITING:
        return None
    approval = snap.node(d.node_key)
    if approval is None:
        return None
    found = next((a for a in awaited_at(snap) if a.approval.key == approval.key), None)
    if found is None or found.recorded:
        return None
    return proposed(found, kind=ChangeKind.PROPOSE)


def awaited_at(snap: Snapshot) -> list[Awaited]:
    return awaited(plan_version=snap.task.plan_version, nodes=snap.nodes, now=snap.now)


def proposed(found: Awaited, *, kind: ChangeKind) -> Change:
    """The change recording ``found``'s proposal on its approval node (event ``approval_proposed``)."""
    asked = found.proposal
    return Change(
        event="approval_proposed",
        kind=kind,
        nodes=[(found.approval, {"approval_proposed_digest": asked.digest})],
        data={
            "node": node_ref(found.approval),
            "digest": asked.digest,
            "requests": dict(asked.requests),
            "plan_revision": asked.plan_version,
            "why": found.code,
        },
    )


def executed_change(snap: Snapshot, op: Operation) -> Change | None:
    """A fresh start of a gated node (``op``, not yet written): the rule judged on the request it registers —
    raised by name when it refuses — and the change recording the execution under each approval (event
    ``approval_executed``), applied in the start's own write. None when no approval gates the node."""
    node = snap.node(op.node.key)
    if node is None:
        return None
    gates = gates_of(snap.by_key, node)
    if not gates:
        return None
    digest = call_digest(op.request)
    refused = refusal(snap, node, digest)
    if refused is not None:
        raise refused
    under = []
    for gate in gates:
        binding = binding_of(gate)
        assert binding is not None  # the rule found it  # noqa: S101
        under.append(
            {
                "node": node_ref(gate),
                "seq": binding.seq,
                "digest": binding.digest,
                "plan_revision": binding.plan_version,
                "expires_at": binding.expires_at,
                "by": binding.by,
            }
        )
    return Change(
        event="approval_executed",
        kind=ChangeKind.START,
        data={
            "node": node_ref(node),
            "op_key": op.op_key,
            "request_digest": digest,
            "approvals": under,
        },
    )


def starts_under_approval(snap: Snapshot, node: Node) -> bool:
    """Whether ``node``'s start is judged by the rule (an approval gates it): such a start is written on its own,
    never shared with the previous node's receipt, so its execution is recorded with it."""
    return bool(gates_of(snap.by_key, node))


# ------------------------------------------------------------------------------------------------ what a page shows


@dataclass(frozen=True)
class ApprovalView:
    """One approval node, as the task page and the API state it: what is awaited (and why), what was approved."""

    node: str
    state: Literal["not_ready", "awaited", "approved"]
    code: str  # why it is awaited: approval_missing, approval_expired, approval_plan_moved, approval_request_changed
    why: str
    proposal: Proposal | None  # what is asked, while awaited
    proposal_recorded: bool  # the log holds that proposal (approval_proposed)
    binding: Binding | None  # the approval given, if any (valid or not)
    expired: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state,
            "code": self.code,
            "why": self.why,
            "awaited": None
            if self.proposal is None
            else {
                "digest": self.proposal.digest,
                "requests": dict(self.proposal.requests),
                "plan_revision": self.proposal.plan_version,
                "recorded": self.proposal_recorded,
            },
            "approved": None
            if self.binding is None
            else {
                "digest": self.binding.digest,
                "requests": dict(self.binding.requests),
                "plan_revision": self.binding.plan_version,
                "expires_at": self.binding.expires_at,
                "by": self.binding.by,
                "event_seq": self.binding.seq,
                "expired": self.expired,
            },
        }


def approval_views(*, plan_version: int, nodes: Sequence[Node], now: datetime) -> list[ApprovalView]:
    """Every approval node of the plan, in plan order, at ``now`` (a reading of the database clock)."""
    waiting = {a.approval.key: a for a in awaited(plan_version=plan_version, nodes=nodes, now=now)}
    views = []
    for node in nodes:
        if not is_approval(node.action):
            continue
        binding = binding_of(node)
        found = waiting.get(node.key)
        if found is not None:
            state: Literal["not_ready", "awaited", "approved"] = "awaited"
        else:
            state = "approved" if node.status == NodeStatus.SUCCEEDED else "not_ready"
        views.append(
            ApprovalView(
                node=node.key,
                state=state,
                code=found.code if found else "",
                why=found.why if found else "",
                proposal=found.proposal if found else None,
                proposal_recorded=found.recorded if found else False,
                binding=binding,
                expired=binding is not None and binding.expired(now),
            )
        )
    return views
