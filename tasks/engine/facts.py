"""Recovery from facts: on resume, the receipts of the latest completed nodes are checked against the real system.

Open operations are always settled first, by op key (``next_directive`` says ``reconcile``). This adds the other
half of DESIGN §4's resume rule: the newest receipts — the succeeded nodes nothing after them has built on yet —
are asked for again, by op key. The remote still holds them as recorded → consistent, go on (nothing is written).
The remote has no trace of one, or holds something else → conflict: the task pauses ``needs_replan`` with what
disagrees, for a re-plan or a person; nothing new starts on a fact that no longer holds. An answer that proves
nothing either way (the remote unreachable, or unable to be queried) is not a conflict: the check is made again at
the next wake-up.

    ops = latest_receipts(task_id)                       # what to ask about
    findings = {op.op_key: connector.lookup(op.op_key) for op in ops}
    receipts_confirm(task_id=…, findings=findings, expected_version=…, lease=…)
"""

from datetime import datetime
from typing import Any

from leases.models import Lease
from tasks.core.lifecycle import (
    RUNNABLE_TASK_STATUSES,
    ChangeKind,
    NodeStatus,
    OperationStatus,
    PauseReason,
    TaskStatus,
)
from tasks.core.outcomes import RECEIPT_FIELDS, Committed, NotFound, Outcome
from tasks.decide.change import Change
from tasks.engine.cas import compare_and_set
from tasks.models import Node, Operation, OperationPurpose, Receipt, Task
from tasks.rows import get_task

# At most this many receipts are asked for again at a wake-up: the newest of the frontier. A fan-out's frontier is
# every batch done so far (thousands), and asking the remote for each before the first write would outlast the lease
# (a wake-up that never writes is a task that never moves); what a crash can have left untrue is its newest writes.
RECHECK_MAX = 20


def latest_receipts(task_id: int) -> list[Operation]:
    """The committed effect operations of the current plan's frontier — succeeded nodes that no succeeded node
    depends on — the newest ``RECHECK_MAX`` of them, oldest first. Operations a person settled are not asked for:
    the remote never saw their op key."""
    task = get_task(task_id)
    if task.status not in RUNNABLE_TASK_STATUSES:
        return []
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version, status=NodeStatus.SUCCEEDED))
    built_on = {dep for node in nodes for dep in node.depends_on}
    frontier = [node.pk for node in nodes if node.key not in built_on]
    ops = Operation.objects.filter(
        node_id__in=frontier,
        status=OperationStatus.COMMITTED,
        purpose=OperationPurpose.EFFECT,
        settled_by="",
        receipt__isnull=False,
    )
    newest = list(ops.select_related("receipt", "node").order_by("-pk")[:RECHECK_MAX])
    return newest[::-1]


# What the remote must still say of a recorded receipt to confirm it: which write it was — its id, version and
# digest (the receipt's fields but the count).
_CONFIRMED = tuple(name for name in RECEIPT_FIELDS if name != "count")


def _contradiction(receipt: Receipt, outcome: Outcome) -> str:
    if isinstance(outcome, NotFound):
        return "the remote has no trace of it"
    if not isinstance(outcome, Committed):
        return ""  # unreachable, unprovable, still running: proves nothing either way
    recorded = {name: getattr(receipt, name) for name in _CONFIRMED}
    now = {name: getattr(outcome, name) for name in _CONFIRMED}
    differs = [name for name, value in recorded.items() if value and now[name] and value != now[name]]
    if outcome.remote_id != receipt.remote_id and "remote_id" not in differs:
        differs.insert(0, "remote_id")
    return ", ".join(f"{name} {recorded[name]!r} now {now[name]!r}" for name in differs)


def receipts_confirm(*, task_id: int, findings: dict[str, Outcome], expected_version: int, lease: Lease) -> Task:
    """Compare what the remote says now (``findings``, by op key, for the operations ``latest_receipts`` named)
    with the receipts recorded; pause on a contradiction (see module doc). Consistent or inconclusive findings
    write nothing."""
    asked = Operation.objects.filter(
        task_id=task_id, op_key__in=findings, status=OperationStatus.COMMITTED, receipt__isnull=False
    ).select_related("receipt", "node")
    conflicts: dict[str, str] = {}
    for op in asked.order_by("pk"):
        if problem := _contradiction(op.receipt, findings[op.op_key]):
            conflicts[op.op_key] = f"node {op.node.key}: {problem}"
    if not conflicts:
        return get_task(task_id)

    def build(current: Task, _now: datetime) -> Change:
        detail = "recorded receipts no longer hold: " + "; ".join(conflicts.values())
        fields: dict[str, Any] = {}
        if current.cancel_requested_at is None and current.status != TaskStatus.PAUSED:
            fields = {
                "status": TaskStatus.PAUSED.value,
                "status_reason": PauseReason.NEEDS_REPLAN.value,
                "status_detail": detail[:500],
            }
        return Change(
            event="receipts_contradicted", kind=ChangeKind.CONFIRM, task=fields, data={"conflicts": conflicts}
        )

    compare_and_set(task_id, expected_version, build, lease=lease)
    return get_task(task_id)
