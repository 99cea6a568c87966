"""The API's response bodies (pydantic, through ninja): the OpenAPI document is generated from these."""

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from ninja import Schema
from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from leases.models import Lease
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import RECEIPT_FIELDS, Accepted, Committed, Failed, Fenced, NotFound, Outcome, Unprovable
from tasks.core.plan import plan_json_schema
from tasks.decide.approval_binding import AWAITING, approval_views
from tasks.decide.change import Snapshot
from tasks.decide.decisions import Directive
from tasks.decide.receipts import receipt_summary
from tasks.engine.cleanup import MAX_CLEANUP_ATTEMPTS, CleanupWork, cleanup_attempts_spent, resets_of
from tasks.models import Node, Operation, Task, TempResource
from tasks.reads.detail import RemoteDown

Name = Annotated[str, Field(min_length=1, max_length=100)]


def _integral(value: object) -> object:
    """JSON has one kind of number: ``5.0`` is the integer 5 (JSON Schema's ``integer`` takes it), ``5.5`` is not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Request integers are strict (JSON true is not 1, "5" is not 5: pydantic's lax mode would take both) and integral
# (5.0 is 5): ``Annotated[int, Field(strict=True, …), Integral]``.
Integral = BeforeValidator(_integral)


class NodeOut(Schema):
    key: str
    action: str
    position: int
    status: str
    attempts: int
    max_attempts: int


class OperationOut(Schema):
    op_key: str
    node: str
    action: str
    status: str


class NodeReceiptOut(Schema):
    """The last receipt recorded for a node's effect — once the node succeeded, the one that advanced it: what the
    external system said it committed under ``op_key``."""

    node: str
    node_status: str
    op_key: str
    action: str
    remote_id: str
    remote_version: str
    count: int | None
    digest: str
    # The receipt's other data as reported (e.g. a tool call's retained output: {"output": {"retained", "version"}}).
    data: dict[str, Any]
    received_at: datetime
    committed_after_cancel_request: bool


class TaskSummary(Schema):
    id: int
    kind: str
    project: str
    title: str
    status: str
    status_reason: str
    version: int
    plan_version: int
    cancel_requested: bool
    updated_at: datetime


class RemoteDownOut(Schema):
    """The task's remote could not be reached ``tries`` wake-ups in a row since ``unreachable_since``; Reckon's
    workers ask it again no earlier than ``next_ask_at`` (a growing, jittered, capped backoff; database clock)."""

    unreachable_since: datetime
    tries: int
    next_ask_at: datetime


class ApprovalAskedOut(Schema):
    """What an approval is asked to permit: the digest of the request each pending gated node will send
    (``{"action", "input"}``, the input resolved as its start sends it), their digest together, the plan revision.
    ``recorded``: the log holds this proposal (event approval_proposed)."""

    digest: str
    requests: dict[str, str]
    plan_revision: int
    recorded: bool


class ApprovalGivenOut(Schema):
    """The approval given: the digest of the requests it permits, the plan revision it was given under, its expiry
    (database clock), who gave it and the event that records it. ``expired``: at the answer's reading of the clock."""

    digest: str
    requests: dict[str, str]
    plan_revision: int
    expires_at: datetime
    by: str
    event_seq: int
    expired: bool


class ApprovalOut(Schema):
    """One approval node. ``state``: ``not_ready`` (its dependencies have not succeeded), ``awaited`` (a person's
    approval is asked for: ``code`` and ``why`` say why — ``approval_missing`` not given yet, ``approval_expired``,
    ``approval_plan_moved``, ``approval_request_changed``), ``approved`` (every ready gated start is bound)."""

    node: str
    state: Literal["not_ready", "awaited", "approved"]
    code: str
    why: str
    awaited: ApprovalAskedOut | None
    approved: ApprovalGivenOut | None


class TaskOut(TaskSummary):
    # How many attempts (op keys sent) all the task's nodes may spend together, and how many they have
    # (tasks/core/budget.py): a plan states its own budget, within the deployment's policy, or gets 2 per node.
    attempt_budget: int
    attempts_used: int
    nodes: list[NodeOut]
    # Unsettled operations (intent, dispatched, accepted, unknown), oldest first.
    open_operations: list[OperationOut]
    # Set while the task's remote stays unreachable; null once it answers (and for a task that has ended).
    remote_down: RemoteDownOut | None
    # The plan's approval nodes: what each is asked to permit and what was approved (digest, revision, expires_at).
    approvals: list[ApprovalOut]


class TaskPage(Schema):
    items: list[TaskSummary]
    # Pass as ``after`` for the next page; null on the last page.
    next_cursor: str | None


class Problem(Schema):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, str]] | None = None
    # 412 version_conflict: the version the task is at now.
    current_version: int | None = None
    # 409 renewal_out_of_order: the renewal_seq the lease is at now.
    renewal_seq: int | None = None


def task_summary(task: Task) -> TaskSummary:
    return TaskSummary(
        id=task.pk,
        kind=task.kind,
        project=task.project,
        title=task.title,
        status=task.status,
        status_reason=task.status_reason,
        version=task.version,
        plan_version=task.plan_version,
        cancel_requested=task.cancel_requested_at is not None,
        updated_at=task.updated_at,
    )


def task_out(snap: Snapshot, remote: RemoteDown | None = None) -> TaskOut:
    """``remote``: tasks.reads.detail.remote_down(task), read by the caller (a new task has none)."""
    keys = {n.pk: n.key for n in snap.nodes}
    return TaskOut(
        **task_summary(snap.task).model_dump(),
        attempt_budget=snap.task.attempt_budget,
        attempts_used=snap.task.attempts_used,
        nodes=[_node(n) for n in snap.nodes],
        open_operations=[_operation(op, keys) for op in snap.unsettled],
        remote_down=_remote_down(remote) if remote is not None else None,
        approvals=approvals_out(snap),
    )


def node_receipt_out(node: Node, op: Operation) -> NodeReceiptOut:
    """``op``: the node's effect with its receipt, select_related (tasks.reads.detail.node_receipt)."""
    receipt = op.receipt
    return NodeReceiptOut(
        node=node.key,
        node_status=node.status,
        op_key=op.op_key,
        action=op.action,
        **receipt_summary(receipt),
        data=receipt.data,
        received_at=receipt.received_at,
        committed_after_cancel_request=receipt.committed_after_cancel_request,
    )


def approvals_out(snap: Snapshot) -> list[ApprovalOut]:
    """The plan's approval nodes as the snapshot holds them, judged at its reading of the database clock."""
    views = approval_views(plan_version=snap.task.plan_version, nodes=snap.nodes, now=snap.now)
    return [ApprovalOut.model_validate(view.as_dict()) for view in views]


def _remote_down(remote: RemoteDown) -> RemoteDownOut:
    return RemoteDownOut(unreachable_since=remote.since, tries=remote.tries, next_ask_at=remote.next_ask_at)


def _node(node: Node) -> NodeOut:
    return NodeOut(
        key=node.key,
        action=node.action,
        position=node.position,
        status=node.status,
        attempts=node.attempts,
        max_attempts=node.max_attempts,
    )


def _operation(op: Operation, keys: dict[int, str]) -> OperationOut:
    return OperationOut(op_key=op.op_key, node=keys.get(op.node_id, ""), action=op.action, status=op.status)


# --- requests -----------------------------------------------------------------------------------------------------


# The plan document as JSON Schema, from tasks/core/plan.py's own definitions (validate_plan checks the rest).
PlanDocument = Annotated[dict[str, Any], WithJsonSchema(plan_json_schema())]


class ActionOut(Schema):
    """An action a plan may name. ``input_schema``: the JSON Schema of a node's ``input`` for it."""

    name: str
    kind: Literal["effect", "approval"]
    description: str
    input_schema: dict[str, Any]


class KindActionsOut(Schema):
    kind: str
    actions: list[ActionOut]


class TaskCreateIn(Schema):
    kind: Name
    title: Annotated[str, Field(min_length=1, max_length=200)]
    project: Annotated[str, Field(max_length=100)] = ""
    plan: PlanDocument
    attempt_budget: (
        Annotated[
            int,
            Field(
                strict=True,
                ge=1,
                le=10_000,
                description="The plan's attempt budget, said here instead of in the plan (both: the same). At most "
                "the deployment's RECKON_MAX_TASK_ATTEMPTS_PER_NODE per node of the plan: more is 422 plan_invalid.",
            ),
            Integral,
        ]
        | None
    ) = None


class LeaseIn(Schema):
    # How long the lease (and each renewal, and each write) lasts; default RECKON_LEASE_TTL_SECONDS.
    ttl_seconds: Annotated[int, Field(strict=True, ge=5, le=3600), Integral] | None = None
    # Acquire only: the first directive in the answer (LeaseOut.next) and, when it is to execute a node, that node's
    # operation registered and marked sent in the same request — what GET …/directive and POST …/operations do.
    start_next: Annotated[bool, Field(strict=True)] = False


class LeaseRenewIn(Schema):
    # The renewal_seq of the last lease answer: renewals are applied in order, once each.
    renewal_seq: Annotated[int, Field(strict=True, ge=0), Integral]
    ttl_seconds: Annotated[int, Field(strict=True, ge=5, le=3600), Integral] | None = None


class OperationStartIn(Schema):
    node_key: Annotated[str, Field(min_length=1, max_length=100)]


def _one_branch_per_result(schema: dict[str, Any]) -> None:
    """OutcomeIn's JSON Schema states _fields_of_result's rules: one branch per ``result``, each with the fields that
    result takes (committed and accepted name a ``remote_id``; failed, and only failed, a ``failure_class``; only
    committed carries the rest of a receipt and ``data``), so a body the document calls valid is one the server
    takes. The fields stay listed at the top, each with its bounds; the branches narrow them."""
    properties, required = schema["properties"], schema.get("required", [])
    failure_class = next(s for s in properties["failure_class"]["anyOf"] if s != {"type": "null"})
    branches = []
    for result in properties["result"]["enum"]:
        own = {**properties, "result": {"const": result}}
        needs = [name for name in required if name != "result"]
        if result in ("committed", "accepted"):
            own["remote_id"] = {**properties["remote_id"], "minLength": 1}
            needs.append("remote_id")
        own["failure_class"] = failure_class if result == "failed" else {"type": "null"}
        if result == "failed":
            needs.append("failure_class")
        if result != "committed":
            for name in RECEIPT_FIELDS:
                if name != "remote_id":
                    own[name] = {"const": properties[name].get("default")}
            own["data"] = {"type": "object", "maxProperties": 0}
        branches.append({"type": "object", "properties": own, "required": ["result", *needs]})
    schema["oneOf"] = branches


class OutcomeIn(Schema):
    """What the external system said of an op key: ``result`` says which, and which fields apply. The receipt's
    fields are tasks.core.outcomes.RECEIPT_FIELDS, each declared here with its bounds (tests/test_receipt_fields.py
    holds the two equal)."""

    model_config = ConfigDict(json_schema_extra=_one_branch_per_result)

    # not_found: no trace yet (final only past the request's deadline); fenced: the remote refuses the op key from
    # now on and it never took effect (the answer to a fence).
    result: Literal["committed", "accepted", "failed", "not_found", "fenced", "unprovable"]
    remote_id: Annotated[str, Field(max_length=200)] = ""
    remote_version: Annotated[str, Field(max_length=100)] = ""
    count: Annotated[int, Field(strict=True, ge=0, le=2**62), Integral] | None = None
    digest: Annotated[str, Field(max_length=200)] = ""
    data: dict[str, Any] = Field(default_factory=dict)
    failure_class: FailureClass | None = None
    detail: Annotated[str, Field(max_length=500)] = ""
    # not_found: the directive's asked_at this lookup followed (echoed). A not found after a cancel is final only if
    # the remote was asked after the request's deadline; without it, only the version's own time proves when.
    asked_at: datetime | None = None

    @model_validator(mode="after")
    def _fields_of_result(self) -> Self:
        if self.result in ("committed", "accepted") and not self.remote_id:
            raise ValueError(f"a {self.result} outcome names the remote's id of the write (remote_id)")
        if self.result == "failed" and self.failure_class is None:
            raise ValueError("a failed outcome says its failure_class")
        if self.result != "failed" and self.failure_class is not None:
            raise ValueError("failure_class belongs to a failed outcome only")
        receipt_only = [name for name in RECEIPT_FIELDS if name != "remote_id"]
        if self.result != "committed" and (any(getattr(self, n) not in (None, "") for n in receipt_only) or self.data):
            raise ValueError(f"{', '.join(receipt_only)} and data are a committed outcome's receipt")
        return self

    def outcome(self) -> Outcome:
        if self.result == "committed":
            return Committed(**{name: getattr(self, name) for name in RECEIPT_FIELDS}, data=self.data)
        if self.result == "accepted":
            return Accepted(remote_id=self.remote_id)
        if self.result == "failed":
            assert self.failure_class is not None  # the validator checked  # noqa: S101
            return Failed(failure_class=self.failure_class, detail=self.detail)
        if self.result == "not_found":
            return NotFound()
        if self.result == "fenced":
            return Fenced()
        return Unprovable(detail=self.detail)


class StepOutcomeIn(OutcomeIn):
    """An operation's outcome; ``start_next`` asks for the next directive in the answer (OutcomeOut.next) and, when
    it is to start a fresh node, for that node's operation registered and marked sent in the outcome's own commit."""

    start_next: Annotated[bool, Field(strict=True)] = False


class CleanupOutcomeIn(OutcomeIn):
    """What the external system said of a temp resource's delete (the directive ``cleanup``), under its op key."""

    op_key: Annotated[str, Field(min_length=1, max_length=200)]


class InputsIn(Schema):
    # Each input ref's current version as read from its source, by name (Directive.input_refs).
    current_versions: dict[Annotated[str, Field(max_length=100)], Annotated[str, Field(max_length=200)]]


class PlanIn(Schema):
    plan: PlanDocument


class CancelIn(Schema):
    reason: Annotated[str, Field(min_length=1, max_length=500)]


# --- answers ------------------------------------------------------------------------------------------------------


class LeaseOut(Schema):
    lease_id: int
    task_id: int
    epoch: int
    holder: str
    expires_at: datetime
    ttl_seconds: float
    # What the next renewal sends.
    renewal_seq: int
    task_version: int
    # Stop starting side effects: settle what is in flight, then release.
    cancel_requested: bool
    takeover_requested: bool
    # Asked for with start_next when acquiring: what to do first, at the answer's ETag; null when not asked (or when
    # the task moved before it could be answered: read GET …/directive).
    next: "DirectiveOut | None" = None


class OperationDetail(Schema):
    op_key: str
    node: str
    action: str
    purpose: str
    # What to send to the external system, with op_key as its idempotency key.
    request: dict[str, Any]
    status: str
    dispatch_count: int
    # The deadline to send with the request (database clock): the remote must refuse the request after it, unless
    # it can fence the op key. Null before the operation is sent.
    not_after: datetime | None


class CleanupWorkOut(Schema):
    """Cleanup work: ``ask`` ``delete`` — delete exactly ``locator`` at the remote under ``op_key`` (its
    idempotency key; registered and marked sent before this answer); ``lookup`` — a delete under ``op_key`` may have
    been sent: ask the remote what became of it, never send it again blindly. Report the answer with
    ``POST …/temp-resources/{temp_id}/cleanup``."""

    temp_id: int
    locator: str
    node: str
    op_key: str
    ask: Literal["delete", "lookup"]
    # Definite refusals so far, and how many make the temp resource wait for a person.
    attempts_spent: int
    max_attempts: int


class TempResourceOut(Schema):
    """A temp resource: ``status`` active, cleaning (its delete in flight), deleted (with the cleanup receipt) or
    stuck (definite refusals used up its attempts: a person decides). ``not_before``: a temporary refusal's backoff —
    no delete before it (database clock)."""

    id: int
    locator: str
    node: str
    status: str
    op_key: str
    not_before: datetime | None
    attempts_spent: int


class CleanupOut(Schema):
    temp_resource: TempResourceOut
    task: TaskSummary


class DirectiveOut(Schema):
    kind: Literal["execute", "reconcile", "wait", "stop", "done", "cleanup"]
    task_version: int
    node_key: str
    op_key: str
    until: datetime | None
    reason: str
    # reconcile: a cancel is recorded, so ask the remote to fence the op key (a final answer), not just look it up;
    # a connector that cannot fence looks it up, and a not found then waits for the deadline (kind "wait").
    fence: bool
    # The server's database clock when this directive was read: send it back with a not_found outcome (asked_at).
    asked_at: datetime
    # The operation the directive is about (execute of a registered intent, reconcile).
    operation: OperationDetail | None
    # reconcile / recheck_inputs: the refs whose current version to read and report ({name: {source, locator, …}}).
    input_refs: dict[str, dict[str, Any]] | None
    # stop awaiting_approval: the approval awaited (node_key), what it is asked to permit and why.
    approval: ApprovalOut | None = None
    # cleanup: the temp resource to delete (or whose delete to look up) — the task has ended.
    cleanup: CleanupWorkOut | None = None
    # execute in an outcome's answer (start_next): the operation was registered and marked sent in that answer's
    # commit — send it now under op_key; do not POST …/operations for it.
    started: bool = False


class OutcomeOut(Schema):
    operation: OperationDetail
    task: TaskSummary
    # Asked for with start_next: what to do next, at the answer's version (its ETag); null when not asked.
    next: DirectiveOut | None = None


LeaseOut.model_rebuild()  # its ``next`` names DirectiveOut, defined after it


class PlanRevisionOut(Schema):
    revision: int
    status: str
    task_version: int


def lease_out(lease: Lease, *, task_version: int, cancel_requested: bool, takeover_requested: bool) -> LeaseOut:
    return LeaseOut(
        lease_id=lease.pk,
        task_id=lease.task_id,
        epoch=lease.epoch,
        holder=f"{lease.holder_kind}:{lease.holder_id}",
        expires_at=lease.expires_at,
        ttl_seconds=lease.ttl.total_seconds() if lease.ttl else 0.0,
        renewal_seq=lease.renewal_seq,
        task_version=task_version,
        cancel_requested=cancel_requested,
        takeover_requested=takeover_requested,
    )


def operation_detail(op: Operation, node_key: str) -> OperationDetail:
    return OperationDetail(
        op_key=op.op_key,
        node=node_key,
        action=op.action,
        purpose=op.purpose,
        request=op.request,
        status=op.status,
        dispatch_count=op.dispatch_count,
        not_after=op.not_after,
    )


def temp_resource_out(temp: TempResource) -> TempResourceOut:
    return TempResourceOut(
        id=temp.pk,
        locator=temp.locator,
        node=temp.node.key if temp.node is not None else "",
        status=temp.status,
        op_key=temp.cleanup_operation.op_key if temp.cleanup_operation is not None else "",
        not_before=temp.not_before,
        attempts_spent=cleanup_attempts_spent(temp),
    )


def cleanup_directive_out(work: CleanupWork, snap: Snapshot) -> DirectiveOut:
    """The directive of an ended task with cleanup work: ``cleanup`` (delete or look up; ``reason``: the task's end
    status), or ``wait`` until a temporary refusal's backoff ends (reason ``cleanup_backoff``)."""
    temp = work.temp
    node = temp.node.key if temp.node is not None else ""
    waits = work.ask == "wait"
    return DirectiveOut(
        kind="wait" if waits else "cleanup",
        task_version=snap.version,
        node_key=node,
        op_key=work.op_key,
        until=work.until,
        reason="cleanup_backoff" if waits else snap.task.status,  # cleanup: how the task ended
        fence=False,
        asked_at=snap.now,
        operation=None,
        input_refs=None,
        cleanup=None
        if work.ask == "wait"
        else CleanupWorkOut(
            temp_id=temp.pk,
            locator=temp.locator,
            node=node,
            op_key=work.op_key,
            ask=work.ask,
            attempts_spent=cleanup_attempts_spent(temp),
            max_attempts=MAX_CLEANUP_ATTEMPTS * (1 + resets_of(temp)),
        ),
    )


def directive_out(d: Directive, snap: Snapshot, *, started: bool = False) -> DirectiveOut:
    op = snap.operation(d.op_key) if d.op_key else None
    its_node = snap.node_by_id(op.node_id) if op is not None else None
    op_node = its_node.key if its_node is not None else d.node_key
    rechecks = d.kind == "reconcile" and not d.op_key
    return DirectiveOut(
        kind=d.kind,
        task_version=d.task_version,
        node_key=d.node_key,
        op_key=d.op_key,
        until=d.until,
        reason=d.reason,
        fence=d.fence,
        asked_at=snap.now,
        operation=operation_detail(op, op_node) if op is not None else None,
        input_refs=dict(snap.task.input_refs) if rechecks else None,
        approval=next((a for a in approvals_out(snap) if a.node == d.node_key), None) if d.reason == AWAITING else None,
        started=started,
    )
