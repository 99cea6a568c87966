"""The step protocol driven end to end for one lease holder: the loop every agent and worker runs.

It holds no rule of its own — every decision is a service call (next_directive, register_intent, …) — and
it stops at the first refusal: a stale version or a lost lease means someone else moved the task, and the
op keys already registered are for the reconciler, never for a blind retry.
"""

import contextlib
from dataclasses import dataclass

from leases.errors import LeaseError
from leases.models import HolderKind, Lease
from leases.services import lease_acquire, lease_release, lease_renew
from tasks.connectors.base import Connector
from tasks.errors import TaskError
from tasks.lifecycle import FailureClass
from tasks.outcomes import Failed
from tasks.protocol import (
    Directive,
    inputs_confirm,
    next_directive,
    operation_dispatch,
    record_outcome,
    register_intent,
)
from tasks.queries import get_task


@dataclass(frozen=True)
class RunReport:
    steps: int
    directive: Directive | None  # the last directive read: done, stop (with its reason), wait (until)
    lease: Lease
    stopped_by: str = ""  # the named refusal that ended the run, if one did


def run_steps(*, task_id: int, lease: Lease, connector: Connector, max_steps: int = 500) -> RunReport:
    """Run the task's ready work with ``lease`` until it is done, must stop or wait, or ``max_steps`` directives.

    The lease is renewed before each directive. A lookup that itself fails leaves the operation unknown and ends
    the run (``stopped_by="remote_unreachable"``): the next run asks again.
    """
    directive: Directive | None = None
    for step in range(max_steps):
        try:
            lease = lease_renew(lease=lease, expected_renewal_seq=lease.renewal_seq)
            directive = d = next_directive(task_id=task_id, lease=lease)
            if d.kind == "reconcile" and d.op_key:
                outcome = connector.lookup(d.op_key)
                if isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED:
                    return RunReport(step, d, lease, stopped_by="remote_unreachable")
                record_outcome(op_key=d.op_key, outcome=outcome, expected_version=d.task_version, lease=lease)
            elif d.kind == "reconcile":  # handed back by a person: re-read the inputs' versions first
                refs = get_task(task_id).input_refs
                versions = {name: connector.current_version(ref["locator"]) for name, ref in refs.items()}
                inputs_confirm(task_id=task_id, current_versions=versions, expected_version=d.task_version, lease=lease)
            elif d.kind == "execute" and not d.op_key:
                register_intent(task_id=task_id, node_key=d.node_key, expected_version=d.task_version, lease=lease)
            elif d.kind == "execute":
                op = operation_dispatch(op_key=d.op_key, expected_version=d.task_version, lease=lease)
                outcome = connector.submit(op.op_key, op.request)
                record_outcome(op_key=op.op_key, outcome=outcome, expected_version=d.task_version + 1, lease=lease)
            else:
                return RunReport(step, d, lease)
        except (TaskError, LeaseError) as refusal:
            return RunReport(step, directive, lease, stopped_by=refusal.code)
    return RunReport(max_steps, directive, lease, stopped_by="max_steps")


def run_task_once(*, task_id: int, holder_id: str, connector: Connector, max_steps: int = 500) -> str:
    """One wake-up of a worker for one task: take the agent lease, run its ready work in one loop (one message
    per wake-up, not per step), give the lease back. Another holder, a reservation for a person, or a task
    with nothing to do make it a no-op — so a duplicated or late message is harmless."""
    try:
        lease = lease_acquire(task_id=task_id, holder_kind=HolderKind.AGENT, holder_id=holder_id)
    except LeaseError as refusal:
        return f"skipped: {refusal.code}"
    report = run_steps(task_id=task_id, lease=lease, connector=connector, max_steps=max_steps)
    with contextlib.suppress(LeaseError):  # lost meanwhile (expired past grace, forced): nothing to give back
        lease_release(lease=report.lease)
    last = report.directive
    outcome = f"{last.kind} {last.reason}".strip() if last else "no directive"
    return f"{outcome}{' (' + report.stopped_by + ')' if report.stopped_by else ''} after {report.steps} steps"
