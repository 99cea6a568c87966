"""The step protocol driven end to end for one lease holder: the loop every agent and worker runs.

It holds no rule of its own — every decision is a service call (next_directive, operation_start, record_outcome,
…) — and it stops at the first refusal: a stale version or a lost lease means someone else moved the task, and the
op keys already registered are for the reconciler, never for a blind retry.
"""

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import InterfaceError, OperationalError, connection

from audit.errors import Refused
from leases import clock
from leases.errors import LeaseError
from leases.models import HolderKind, Lease
from leases.services import lease_acquire, lease_release
from tasks.core.errors import TaskError, VersionConflict
from tasks.core.lifecycle import FailureClass, OperationStatus
from tasks.core.outcomes import Accepted, Failed
from tasks.decide.change import Snapshot
from tasks.engine.cleanup import cleanup_temp_resources, temp_resources_due
from tasks.engine.connectors import Connector, reconcile, send_view
from tasks.engine.facts import latest_receipts, receipts_confirm
from tasks.engine.failpoints import failpoint
from tasks.engine.protocol import (
    Directive,
    inputs_confirm,
    next_directive,
    operation_start,
    record_outcome,
)
from tasks.engine.recovery import remote_down_record
from tasks.engine.snapshot import task_snapshot
from tasks.engine.verification import input_refs_verified
from tasks.models import OperationPurpose
from tasks.rows import get_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunReport:
    steps: int
    directive: Directive | None  # the last directive read: done, stop (with its reason), wait (until)
    lease: Lease
    stopped_by: str = ""  # the named refusal that ended the run, if one did
    wake_at: datetime | None = None  # when the task wants a worker again (backoff ends, an accepted op to observe)


def run_steps(
    *, task_id: int, lease: Lease, connector: Connector, max_steps: int = 500, snapshot: Snapshot | None = None
) -> RunReport:
    """Run the task's ready work with ``lease`` until it is done, must stop or wait, or ``max_steps`` directives.

    One snapshot is read at the start; each write returns the next one, so a node costs its two commits and no
    read — fewer in a chain: a receipt's commit starts the next node when that is the next directive
    (``record_outcome(…, start_next=True)``), so n nodes run one after another cost n + 1 commits. Every write
    extends the lease (a heartbeat); it is renewed explicitly only when a step wrote nothing (a wait). A lookup that
    itself fails leaves the operation unknown and ends the run (``stopped_by="remote_unreachable"``); an operation the
    remote still runs ends it too, with ``wake_at`` set for the next observation: the next run asks again, by op
    key. ``snapshot``: the task's snapshot, if the caller has read it (a stale one is refused by version, then read).
    """
    directive: Directive | None = None
    snap: Snapshot | None = snapshot
    step = conflicts = 0
    while step < max_steps:
        in_hand = ""  # the op key this step sends or settles, for the line logged if the step is refused
        try:
            if snap is None:
                snap = task_snapshot(task_id=task_id, lease=lease)
            directive = d = next_directive(task_id=task_id, lease=lease, snapshot=snap)
            if d.kind == "reconcile" and d.op_key:
                in_hand = d.op_key
                outcome = reconcile(connector, d.op_key, fence=d.fence)
                answer = type(outcome).__name__.lower()
                extra = {"task_id": task_id, "task_version": snap.version, "op_key": d.op_key, "outcome": answer}
                log.info("reconcile: asked the remote by op key: %s", answer, extra=extra)
                if isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED:
                    return RunReport(step, d, lease, "remote_unreachable", wake_at=_later(OBSERVE_EVERY))
                before = snap
                settled = record_outcome(snap, d.op_key, outcome, lease=lease)
                op, snap = settled.operation, settled.snapshot
                if snap is before:  # nothing new to record (still unprovable): ask again later, not in a loop
                    return RunReport(step + 1, d, lease, "inconclusive", wake_at=_later(OBSERVE_EVERY))
                if isinstance(outcome, Accepted) and op.status == OperationStatus.ACCEPTED:
                    return RunReport(step + 1, d, lease, "observing", wake_at=_later(OBSERVE_EVERY))
            elif d.kind == "reconcile":  # handed back by a person: re-read the inputs' versions first
                input_refs_verified(snap.task)
                refs = snap.task.input_refs
                versions = {name: connector.current_version(ref["locator"]) for name, ref in refs.items()}
                snap = inputs_confirm(snap, versions, lease=lease)
            elif d.kind == "execute":
                failpoint("before_intent", task_id=task_id)
                begun = operation_start(snap, d.node_key, lease=lease)
                op, snap = begun.operation, begun.snapshot
                while True:  # a chain: each receipt's commit may start the next node (record_outcome's start_next)
                    in_hand = op.op_key
                    failpoint("before_call", task_id=task_id)
                    request = send_view(op.request, op.not_after)
                    if op.purpose == OperationPurpose.COMPENSATION:
                        outcome = connector.compensate(op.op_key, request)
                    else:
                        outcome = connector.submit(op.op_key, request)
                    failpoint("after_call", task_id=task_id)
                    settled = record_outcome(snap, op.op_key, outcome, lease=lease, start_next=step + 1 < max_steps)
                    snap = settled.snapshot
                    failpoint("after_advance", task_id=task_id)
                    if settled.started is None:
                        break
                    # The next node's directive, decided and written with the receipt.
                    op, step = settled.started, step + 1
            elif d.kind == "wait":
                return RunReport(step, d, lease, wake_at=d.until)
            else:
                return RunReport(step, d, lease)
            step += 1
            conflicts = 0
        except VersionConflict as conflict:
            # Someone else moved the task (a cancel, a takeover request) while this step decided or called: nothing
            # was written. Read it again and follow the new directive — an answer in hand is asked again by op key
            # (fenced, if a cancel came), never written on the old version.
            conflicts += 1
            _log_refusal("write refused: %s; reading the task again", conflict.code, task_id, snap, in_hand)
            if conflicts > MAX_CONFLICTS:
                return RunReport(step, directive, lease, stopped_by=conflict.code)
            snap = None
            continue
        except (Refused, LeaseError) as refusal:
            # One line per refusal that ends a run (lease lost or expired, a version moved by someone else): the
            # domain's other state changes are logged from the event log (observability/logs.py, an event listener).
            _log_refusal("run stopped: %s", refusal.code, task_id, snap, in_hand)
            return RunReport(step, directive, lease, stopped_by=refusal.code)
        except ConnectionError as exc:  # current_version could not reach the source: nothing was written
            return RunReport(step, directive, lease, f"remote_unreachable: {exc}"[:200], wake_at=_later(OBSERVE_EVERY))
    return RunReport(max_steps, directive, lease, stopped_by="max_steps", wake_at=_later(timedelta(0)))


def _log_refusal(message: str, code: str, task_id: int, snap: Snapshot | None, op_key: str) -> None:
    """The line of a refused write (harness/partitions.py counts them): the task, the version read, the op key."""
    version = snap.version if snap is not None else None
    extra = {"task_id": task_id, "task_version": version, "op_key": op_key or None, "refusal": code}
    log.info(message, code, extra=extra)


OBSERVE_EVERY = timedelta(seconds=2)
MAX_CONFLICTS = 3  # version conflicts in a row before a run leaves the task to its next wake-up


def _later(delay: timedelta) -> datetime:
    return clock.now() + delay


def recheck_receipts(*, task_id: int, lease: Lease, connector: Connector) -> None:
    """Resume from facts: ask the remote again for the newest receipts (tasks/engine/facts.py); a contradiction
    pauses."""
    version = get_task(task_id).version
    ops = latest_receipts(task_id)
    if ops:
        findings = {op.op_key: connector.lookup(op.op_key) for op in ops}
        receipts_confirm(task_id=task_id, findings=findings, expected_version=version, lease=lease)


@dataclass(frozen=True)
class WakeUp:
    summary: str
    wake_at: datetime | None = None  # ask for another wake-up then (a lost request is made good by the scan)
    version: int | None = None  # the task's version when the wake-up ended (the next wake-up names it)


def run_task_once(
    *, task_id: int, holder_id: str, connector: Connector, max_steps: int = 500, seen_version: int | None = None
) -> WakeUp:
    """One wake-up of a worker for one task: take the agent lease, run its ready work in one loop (one message
    per wake-up, not per step) after re-checking its newest receipts with the remote, delete the temp
    resources of a task that has ended, give the lease back.
    Another holder, a reservation for a person, or a task with nothing to do make it a no-op — so a
    duplicated or late message is harmless. ``seen_version``: the version the sender saw (the recovery scan); if
    the task has moved on since, another wake-up already did this one's work and it does nothing."""
    if seen_version is not None and get_task(task_id).version != seen_version:
        return WakeUp(f"skipped: stale wake-up (version {seen_version} seen, task moved on)")
    try:
        lease = lease_acquire(task_id=task_id, holder_kind=HolderKind.AGENT, holder_id=holder_id)
    except LeaseError as refusal:
        return WakeUp(f"skipped: {refusal.code}")
    try:
        return _run_holding(task_id=task_id, lease=lease, connector=connector, max_steps=max_steps)
    except (OperationalError, InterfaceError):
        _let_go(lease)
        raise


def _let_go(lease: Lease) -> None:
    """The database connection broke mid-wake-up (terminated, failed over): give the lease back on a new connection
    at once rather than leave it held until TTL + grace. If the database cannot be reached either, the lease
    lapses on its own; the next holder reconciles whatever was in flight, by op key."""
    if connection.in_atomic_block:  # a caller's transaction owns the connection: it cannot be replaced here
        return
    connection.close()
    with contextlib.suppress(LeaseError, OperationalError, InterfaceError):
        lease_release(lease=lease)


def _run_holding(*, task_id: int, lease: Lease, connector: Connector, max_steps: int) -> WakeUp:
    with contextlib.suppress(TaskError, LeaseError):  # moved meanwhile: run_steps reads it afresh, names refusals
        recheck_receipts(task_id=task_id, lease=lease, connector=connector)
    report = run_steps(task_id=task_id, lease=lease, connector=connector, max_steps=max_steps)
    cleaned, backing_off = "", None
    task = get_task(task_id)
    if temp_resources_due(task).exists():  # none unless the task has ended
        try:
            cleanup = cleanup_temp_resources(task_id=task_id, lease=report.lease, connector=connector)
            cleaned = f"; cleanup: {cleanup.deleted} deleted, {cleanup.remaining} left {cleanup.stopped_by}".rstrip()
            backing_off = cleanup.wake_at  # a delete refused for now: come back when its backoff ends
        except (Refused, LeaseError) as refusal:
            cleaned = f"; cleanup stopped: {refusal.code}"
    wake_at = report.wake_at or backing_off
    # A remote that stays down is asked again later and later (tasks.engine.recovery.remote_down_record), not every 2 s.
    unreachable = report.stopped_by.startswith("remote_unreachable")
    wake_at = remote_down_record(task=task, unreachable=unreachable) or wake_at
    with contextlib.suppress(LeaseError):  # lost meanwhile (expired past grace, forced): nothing to give back
        lease_release(lease=report.lease)
    last = report.directive
    outcome = f"{last.kind} {last.reason}".strip() if last else "no directive"
    stopped = f" ({report.stopped_by})" if report.stopped_by else ""
    return WakeUp(f"{outcome}{stopped} after {report.steps} steps{cleaned}", wake_at=wake_at, version=task.version)
