"""/api/v1/tasks/{id}/lease, …/directive, …/operations, …/inputs: the step protocol of tasks/engine/protocol.py over
HTTP.

The token's scope is checked before any handler runs (api/auth.py). Each handler reads the token, the headers
(api/http.py), calls one service and answers; the rules — who may hold the lease, what the next step is, what a
receipt proves — are the services'. Every write is the services' compare-and-set on ``If-Match`` and the lease's
epoch, so a stale agent changes nothing."""

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.backends.signals import connection_created
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from ninja import Router

from api.auth import token_of
from api.http import (
    IDEMPOTENCY,
    IF_MATCH,
    LEASE,
    OperationNotFound,
    TempResourceNotFound,
    answer,
    documented,
    expected_version,
    held_lease,
)
from api.idempotency import Keep, idempotent
from api.schemas import (
    CleanupOut,
    CleanupOutcomeIn,
    DirectiveOut,
    InputsIn,
    LeaseIn,
    LeaseOut,
    LeaseRenewIn,
    OperationDetail,
    OperationStartIn,
    OutcomeOut,
    StepOutcomeIn,
    TaskSummary,
    cleanup_directive_out,
    directive_out,
    lease_out,
    operation_detail,
    task_summary,
    temp_resource_out,
)
from audit.errors import Refused
from leases.errors import LeaseError
from leases.models import HolderKind, Lease
from leases.services import lease_acquire, lease_release, lease_renew
from tasks.decide.change import Snapshot
from tasks.engine.cleanup import cleanup_record
from tasks.engine.protocol import (
    Directive,
    Step,
    agent_directive,
    inputs_confirm,
    operation_start,
    record_outcome,
    snapshot_at,
)
from tasks.engine.snapshot import RecentSnapshots, task_snapshot
from tasks.models import Operation, TempResource

router = Router(tags=["steps"])

# What the step's compare-and-set refuses a write under a lease with (tasks.engine.cas): the lease is no longer
# the task's, or a rule of the task's state; a start also its budget, its backoff, an approval, a person or a stored
# request that is not the one the log registered; a settlement a receipt that is none or holds a credential.
# Each route declares exactly what it can answer (tests/test_api_refusals_declared.py provokes every pair).
LEASE_REFUSALS = ("lease_lost", "lease_expired")
START_REFUSALS = (
    "task_not_runnable",
    "evidence_insufficient",
    "stored_fact_altered",
    "node_not_ready",
    "operations_open",
    "cancel_requested",
    "takeover_requested",
    "inputs_recheck_required",
    "budget_exhausted",
    "backoff_active",
    "approval_missing",
    "approval_request_changed",
    "approval_plan_moved",
    "approval_expired",
)
SETTLE_REFUSALS = ("invalid_transition", "task_not_runnable", "evidence_insufficient", "secret_in_payload")
CLEANUP_REFUSALS = ("invalid_transition", "task_not_runnable", "secret_in_payload")
INPUTS_REFUSALS = ("task_not_runnable", "inputs_recheck_required", "secret_in_payload")


# The snapshot this process last answered of each task: the holder's next request names its version in If-Match,
# and the task's row alone then says whether its nodes and operations are still these (tasks.engine.snapshot).
RECENT = RecentSnapshots(max_rows=settings.RECKON_API_SNAPSHOT_ROWS)
connection_created.connect(RECENT.connected, weak=False)


def _snapshot(task_id: int, lease: Lease, expected: int | None = None) -> Snapshot:
    """The task's snapshot (at ``expected`` when given). The task is in the token's scope: api/auth.py checked it
    before the handler ran. A kept snapshot is taken, not shared: the request keeps the one it answers at when it
    succeeds, so after any refusal — rows changed behind the version among the possible causes — the next request
    reads the task whole."""
    known = RECENT.take(task_id)
    if expected is None:
        return task_snapshot(task_id=task_id, lease=lease, known=known)
    return snapshot_at(task_id=task_id, lease=lease, expected_version=expected, known=known)


def _kept(snap: Snapshot) -> Snapshot:
    """``snap``, held for the task's next request once what it shows is committed (at once outside a transaction).
    Called with what a request answers at, after its write returned: never with a write's projection."""
    transaction.on_commit(partial(RECENT.keep, snap))
    return snap


def _lease_answer(lease: Lease, status: int, *, start_next: bool = False) -> HttpResponse:
    """The lease as granted or renewed, at the task's version. ``start_next``: with the first directive, and the
    node it says to execute started (``_first_work``)."""
    held = lease if start_next else None  # the directive judges the lease: read it with the task
    snap = task_snapshot(task_id=lease.task_id, lease=held, known=RECENT.take(lease.task_id))
    following, refused = None, False
    if start_next:
        try:
            with transaction.atomic():  # a refusal here leaves the grant: its own savepoint
                following, snap = _first_work(lease, snap)
        except (Refused, LeaseError):  # the task moved meanwhile: next is null, the agent reads the directive
            refused = True
    body = lease_out(
        lease,
        task_version=snap.version,
        cancel_requested=snap.task.cancel_requested_at is not None,
        takeover_requested=bool(snap.reserved_for) or snap.task.status == "human",
    )
    body.next = following
    if not refused:  # after a refusal the next request reads the task whole (``_snapshot``)
        _kept(snap)
    return answer(body, status, version=snap.version)


def _first_work(lease: Lease, snap: Snapshot) -> tuple[DirectiveOut, Snapshot]:
    """What GET …/directive answers on ``snap`` and, when that is to execute a node and no stop is asked (a cancel,
    a person), what POST …/operations then does: the node's operation registered (or an intent sent again) and
    marked sent — the same services, in the same order, one request instead of three."""
    first, snap = _directive_answer(lease.task_id, lease, snap)
    stop_asked = snap.task.cancel_requested_at is not None or bool(snap.reserved_for) or snap.task.status == "human"
    if first.kind != "execute" or stop_asked:
        return first, snap
    begun = operation_start(snap, first.node_key, lease=lease)
    new = begun.snapshot
    d = Directive("execute", new.version, node_key=first.node_key, op_key=begun.operation.op_key)
    return directive_out(d, new, started=True), new


@router.post(
    "/tasks/{task_id}/lease",
    response={201: LeaseOut},
    summary="Acquire the task's lease",
    openapi_extra=documented(IDEMPOTENCY, refuses=("lease_held", "lease_refused", "lease_reserved", "takeover_held")),
)
def lease_take(request: HttpRequest, task_id: int, payload: LeaseIn) -> HttpResponse:
    """Grant this agent the task's lease (the next epoch) if no one holds it: 409 if another holder does, 423 if a
    person is taking the task over or holds it. With ``start_next`` the answer carries the first directive
    (``next``); when that is to execute a node, its operation is registered and marked sent in the same request, as
    ``POST …/operations`` would (``next.started``): an agent's first node costs no request of its own."""
    token = token_of(request)

    def run() -> HttpResponse:
        lease = lease_acquire(
            task_id=task_id, holder_kind=HolderKind.AGENT, holder_id=token.agent_id, ttl=_ttl(payload.ttl_seconds)
        )
        return _lease_answer(lease, 201, start_next=payload.start_next)

    return idempotent(request, token.agent_id, run)


@router.post(
    "/tasks/{task_id}/lease/renew",
    response={200: LeaseOut},
    summary="Renew the lease",
    openapi_extra=documented(LEASE, IDEMPOTENCY, refuses=("lease_lost", "lease_expired", "renewal_out_of_order")),
)
def lease_extend(request: HttpRequest, task_id: int, payload: LeaseRenewIn) -> HttpResponse:
    """Extend the lease by its ttl. The answer says whether a cancel or a takeover was asked for: then start no new
    side effect. Renewals carry the renewal_seq of the last answer (409 renewal_out_of_order otherwise)."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)

    def run() -> HttpResponse:
        renewed = lease_renew(lease=lease, expected_renewal_seq=payload.renewal_seq, ttl=_ttl(payload.ttl_seconds))
        return _lease_answer(renewed, 200)

    return idempotent(request, token.agent_id, run)


@router.delete(
    "/tasks/{task_id}/lease",
    response={204: None},
    summary="Release the lease",
    openapi_extra=documented(LEASE, refuses=("lease_lost",)),
)
def lease_give_back(request: HttpRequest, task_id: int) -> HttpResponse:
    lease_release(lease=held_lease(request, token_of(request), task_id))
    return HttpResponse(status=204)


@router.get(
    "/tasks/{task_id}/directive",
    response={200: DirectiveOut},
    summary="What to do next",
    openapi_extra=documented(LEASE, refuses=(*LEASE_REFUSALS, "invalid_transition", "stored_fact_altered")),
)
def directive_read(request: HttpRequest, task_id: int) -> HttpResponse:
    """The next step for the lease holder: execute a node, reconcile an op key, wait, stop (with the reason) or
    done. Open operations always come first: an agent that restarts reconciles before it sends anything new."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    body, snap = _directive_answer(task_id, lease, _snapshot(task_id, lease))
    return answer(body, version=_kept(snap).version)


def _directive_answer(task_id: int, lease: Lease, snap: Snapshot) -> tuple[DirectiveOut, Snapshot]:
    """The next directive decided on ``snap``, and the snapshot it was answered at (a later one when deciding it
    wrote: a cleanup's delete registered, an approval's proposal recorded)."""
    d, cleanup = agent_directive(task_id=task_id, lease=lease, snapshot=snap)
    # A write made deciding (a cleanup's delete registered, what an approval is asked for): answer what it left, read
    # on the snapshot decided on (the log between says whether its nodes still hold).
    if cleanup is not None:  # the task has ended: its temp resources are this agent's to delete
        snap = task_snapshot(task_id=task_id, lease=lease, known=snap)
        return cleanup_directive_out(cleanup, snap), snap
    if d.task_version != snap.version:
        snap = task_snapshot(task_id=task_id, lease=lease, known=snap)
    return directive_out(d, snap), snap


@router.post(
    "/tasks/{task_id}/operations",
    response={201: OperationDetail},
    summary="Register a node's operation (the intent) and mark it sent",
    openapi_extra=documented(LEASE, IF_MATCH, IDEMPOTENCY, refuses=(*LEASE_REFUSALS, *START_REFUSALS)),
)
def operation_register(request: HttpRequest, task_id: int, payload: OperationStartIn) -> HttpResponse:
    """Commit 1 of a node: the operation and its op key are recorded, "may have been sent", before the agent calls
    the external system. For a node whose intent is already registered, the same op key is marked sent again."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    version = expected_version(request)

    def run() -> HttpResponse:
        snap = _snapshot(task_id, lease, version)
        begun = operation_start(snap, payload.node_key, lease=lease)
        op, new = begun.operation, _kept(begun.snapshot)
        return answer(operation_detail(op, payload.node_key), 201, version=new.version)

    return idempotent(request, token.agent_id, run, guarded=True)


@router.post(
    "/tasks/{task_id}/operations/{op_key}/outcome",
    response={200: OutcomeOut},
    summary="Report what the external system said of an op key",
    openapi_extra=documented(
        LEASE,
        IF_MATCH,
        IDEMPOTENCY,
        refuses=("operation_not_found", *LEASE_REFUSALS, *SETTLE_REFUSALS),
    ),
)
def outcome_report(request: HttpRequest, task_id: int, op_key: str, payload: StepOutcomeIn) -> HttpResponse:
    """Commit 2 of a node: the receipt (or the classified failure) is recorded and, if it satisfies the node's
    evidence, the node advances — in one transaction. A receipt short of the node's evidence spec is recorded too
    and answered 200: the node failed and the task paused (``task.status_reason`` says why). 422
    evidence_insufficient only for a receipt that is none: no remote id. With ``start_next`` the answer carries the
    next directive (``next``); when that is to start a fresh node, its operation is registered and marked sent in
    the same commit as the receipt, or neither is written."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    version = expected_version(request)

    def settle(keep: Keep | None) -> HttpResponse | None:
        """The outcome recorded and answered. With ``keep``, the answer's Idempotency-Key record is written in the
        outcome's own statement when the answer is known before the write (no directive to read after it); else in
        a transaction around the write and the answer, decided on the same snapshot."""
        snap = _snapshot(task_id, lease, version)
        if snap.operation(op_key) is None and not Operation.objects.filter(task_id=task_id, op_key=op_key).exists():
            raise OperationNotFound(f"task {task_id} has no operation {op_key!r}")
        # When the remote was asked, at the latest: after the directive the agent echoes (never later than now), or,
        # unsaid, after the version it read was written.
        asked_at = min(payload.asked_at, snap.now) if payload.asked_at is not None else snap.task.updated_at
        kept: list[tuple[HttpResponse, Snapshot]] = []

        def record(step: Step) -> tuple[type[Model], dict[str, Any]]:
            if keep is None or (payload.start_next and step.started is None):
                raise _AnsweredAfter
            kept.append(_outcome_answer(task_id, lease, step, payload.start_next))
            return keep(kept[0][0])

        def recorded(also: Callable[[Step], tuple[type[Model], dict[str, Any]]] | None) -> Step:
            outcome = payload.outcome()
            start_next = payload.start_next
            return record_outcome(
                snap, op_key, outcome, lease=lease, asked_at=asked_at, start_next=start_next, also=also
            )

        try:
            settled = recorded(record if keep is not None else None)
        except _AnsweredAfter:  # the answer is read after the write: the write, the answer and its record as one
            assert keep is not None  # noqa: S101 - raised only by ``record``
            with transaction.atomic():
                settled = recorded(None)
                kept.append(_outcome_answer(task_id, lease, settled, payload.start_next))
                model, row = keep(kept[0][0])
                model._default_manager.create(**row)
        if keep is not None and not kept:
            return None  # nothing written (nothing new to record): the common way answers it
        response, answered_at = kept[0] if kept else _outcome_answer(task_id, lease, settled, payload.start_next)
        _kept(answered_at)  # once the write has committed (the answer was made before it, in the joined case)
        return response

    def run() -> HttpResponse:
        answered = settle(None)
        if answered is None:  # pragma: no cover - without keep, settle always answers
            raise AssertionError("an outcome without an answer")
        return answered

    return idempotent(request, token.agent_id, run, guarded=True, joined=settle)


class _AnsweredAfter(Exception):
    """The outcome's answer needs what is read after its write (the next directive): its record cannot be part of
    the write's own statement."""


def _outcome_answer(task_id: int, lease: Lease, settled: Step, start_next: bool) -> tuple[HttpResponse, Snapshot]:
    """The answer to an outcome, and the snapshot it was answered at."""
    op, new = settled.operation, settled.snapshot
    node = _node_key(new, op)
    following = None
    if settled.started is not None:  # the next node's start, written with the receipt: send it next
        started = settled.started
        d = Directive("execute", new.version, node_key=_node_key(new, started), op_key=started.op_key)
        following = directive_out(d, new, started=True)
    elif start_next:
        try:
            with transaction.atomic():  # a refusal here leaves the outcome recorded: its own savepoint
                following, new = _directive_answer(task_id, lease, new)
        except (Refused, LeaseError):  # the task moved meanwhile: next is null, the agent reads the directive
            following = None
    body = OutcomeOut(operation=operation_detail(op, node), task=task_summary(new.task), next=following)
    return answer(body, version=new.version), new


def _node_key(snap: Snapshot, op: Operation) -> str:
    node = snap.node_by_id(op.node_id)
    return node.key if node is not None else ""


@router.post(
    "/tasks/{task_id}/temp-resources/{temp_id}/cleanup",
    response={200: CleanupOut},
    summary="Report what the external system said of a temp resource's delete",
    openapi_extra=documented(
        LEASE, IF_MATCH, IDEMPOTENCY, refuses=("temp_resource_not_found", *LEASE_REFUSALS, *CLEANUP_REFUSALS)
    ),
)
def cleanup_report(request: HttpRequest, task_id: int, temp_id: int, payload: CleanupOutcomeIn) -> HttpResponse:
    """The answer to a ``cleanup`` directive: what the remote said of the delete (or of the lookup) under its op
    key. A receipt marks the temp resource deleted in the same commit; a temporary refusal (dependency_unavailable)
    backs it off without spending an attempt; a definite refusal spends one. 404 temp_resource_not_found, 409
    invalid_transition when ``op_key`` is not the delete in flight for it."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    version = expected_version(request)

    def run() -> HttpResponse:
        snap = _snapshot(task_id, lease, version)
        if not TempResource.objects.filter(pk=temp_id, task_id=task_id).exists():
            raise TempResourceNotFound(f"task {task_id} has no temp resource {temp_id}")
        temp = cleanup_record(
            task_id=task_id,
            temp_id=temp_id,
            op_key=payload.op_key,
            outcome=payload.outcome(),
            lease=lease,
            expected_version=snap.version,
        )
        new = _kept(task_snapshot(task_id=task_id, lease=lease, known=snap))  # read on the one decided on
        body = CleanupOut(temp_resource=temp_resource_out(temp), task=task_summary(new.task))
        return answer(body, version=new.version)

    return idempotent(request, token.agent_id, run, guarded=True)


@router.post(
    "/tasks/{task_id}/inputs",
    response={200: TaskSummary},
    summary="Report the inputs' current versions (after a hand-back)",
    openapi_extra=documented(LEASE, IF_MATCH, IDEMPOTENCY, refuses=(*LEASE_REFUSALS, *INPUTS_REFUSALS)),
)
def inputs_report(request: HttpRequest, task_id: int, payload: InputsIn) -> HttpResponse:
    """After a person handed the task back, the agent reads each input ref's version from its source: all
    unchanged, it goes on; any changed, the task pauses input_changed for an explicit choice."""
    token = token_of(request)
    lease = held_lease(request, token, task_id)
    version = expected_version(request)

    def run() -> HttpResponse:
        snap = _snapshot(task_id, lease, version)
        new = _kept(inputs_confirm(snap, dict(payload.current_versions), lease=lease))
        return answer(task_summary(new.task), version=new.version)

    return idempotent(request, token.agent_id, run, guarded=True)


def _ttl(seconds: int | None) -> timedelta | None:
    return timedelta(seconds=seconds) if seconds is not None else None
