"""The status sentence every page shows (tasks/reads/state.py: state_sentence) as a table of cases: each status by
pause reason by steps done by approval waits by holder (and open operations where the status waits for them), with
what the sentence must say and what it must never say — "first step" once a step is done, "an agent is working"
while a step waits for an approval, "nobody" for a task a person has, a stopped task's wait without its op key and
deadline. Then the same function read from real rows (task_state_sentence)."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leases.state import Phase
from tasks.core.lifecycle import PauseReason, TaskStatus
from tasks.reads.state import ApprovalWait, Holder, OpenOperation, state_sentence

AT = datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
AGENT = Holder("agent", "worker-1", Phase.LIVE, seconds_since_expiry=-20)
AGENT_LAPSED = Holder("agent", "worker-1", Phase.LAPSED, seconds_since_expiry=44)
ANN = Holder("operator", "ann", Phase.LIVE, seconds_since_expiry=-90)
ANN_GRACE = Holder("operator", "ann", Phase.GRACE, seconds_since_expiry=3, grace_left_seconds=12)
ANN_LAPSED = Holder("operator", "ann", Phase.LAPSED, seconds_since_expiry=44)
ANN_RELEASED = Holder("operator", "ann", Phase.CLOSED, release_reason="released")
ANN_FORCED = Holder("operator", "ann", Phase.CLOSED, release_reason="forced")
APPROVAL = ApprovalWait("approve-cleanup", ("delete-temp-copies",))
APPROVAL_EXPIRED = ApprovalWait("approve-cleanup", ("delete-temp-copies",), code="approval_expired")
UNKNOWN = OpenOperation("op-copy-2", "unknown", "copy-2", failure_class="connection_interrupted")
AWAITING = OpenOperation("op-copy-3", "unknown", "copy-3", failure_class="awaiting_final", final_at=AT)
NOT_FINAL = OpenOperation("op-copy-4", "unknown", "copy-4", failure_class="not_found_not_final", final_at=AT)
SENT = OpenOperation("op-copy-5", "dispatched", "copy-5")
ACCEPTED = OpenOperation("op-copy-6", "accepted", "copy-6")

# (case, arguments, what the sentence says, what it must not say)
CASES: list[tuple[str, dict[str, Any], tuple[str, ...], tuple[str, ...]]] = [
    # pending
    ("pending, nothing done", {"status": "pending", "nodes_total": 8}, ("first step",), ("done;",)),
    (
        "pending, 7 of 8 done",
        {"status": "pending", "nodes_done": 7, "nodes_total": 8},
        ("7 of 8 steps done", "start the next"),
        ("first step",),
    ),
    (
        "pending, all done",
        {"status": "pending", "nodes_done": 8, "nodes_total": 8},
        ("every step is done", "record the completion"),
        ("first step",),
    ),
    (
        "pending, awaiting approval",
        {"status": "pending", "nodes_done": 7, "nodes_total": 8, "approval_waits": [APPROVAL]},
        ("delete-temp-copies waits for a person's approval of approve-cleanup", "Nothing runs until", "7 of 8"),
        ("first step", "working"),
    ),
    (
        "pending, approval expired",
        {"status": "pending", "nodes_done": 7, "nodes_total": 8, "approval_waits": [APPROVAL_EXPIRED]},
        ("delete-temp-copies waits for a person's new approval of approve-cleanup (the last one expired)",),
        ("first step",),
    ),
    (
        "pending, unknown operation",
        {"status": "pending", "nodes_done": 1, "nodes_total": 8, "operations": [UNKNOWN]},
        ("op-copy-2 of unknown outcome must be reconciled",),
        ("first step",),
    ),
    # running
    (
        "running, agent live",
        {"status": "running", "nodes_done": 3, "nodes_total": 8, "holder": AGENT},
        ("agent worker-1 is working through its steps", "3 of 8"),
        (),
    ),
    (
        "running, agent's lease lapsed",
        {"status": "running", "nodes_done": 3, "nodes_total": 8, "holder": AGENT_LAPSED},
        ("3 of 8 steps done", "lapsed 44 s ago"),
        ("is working",),
    ),
    (
        "running, nobody holds, nothing done",
        {"status": "running", "nodes_total": 8},
        ("first step", "no one holds its lease"),
        ("is working",),
    ),
    (
        "running, awaiting approval (the issue's case)",
        {"status": "running", "nodes_done": 7, "nodes_total": 8, "approval_waits": [APPROVAL]},
        ("Nothing runs until a person approves", "delete-temp-copies", "approve-cleanup"),
        ("is working", "working through"),
    ),
    (
        "running, awaiting approval, agent still holds",
        {"status": "running", "nodes_done": 7, "nodes_total": 8, "approval_waits": [APPROVAL], "holder": AGENT},
        ("Nothing runs until a person approves", "agent worker-1 holds its lease"),
        ("is working",),
    ),
    (
        "running, op sent",
        {"status": "running", "nodes_done": 2, "nodes_total": 8, "holder": AGENT, "operations": [SENT]},
        ("op op-copy-5 is sent", "2 of 8"),
        ("first step",),
    ),
    # observing, backing off
    (
        "observing",
        {"status": "observing", "nodes_done": 5, "nodes_total": 8, "operations": [ACCEPTED]},
        ("op op-copy-6 was accepted", "5 of 8"),
        (),
    ),
    (
        "backing off",
        {"status": "backing_off", "nodes_done": 2, "nodes_total": 8, "retry_at": AT},
        ("tried again from 2030-01-01 12:00:05 UTC", "2 of 8"),
        (),
    ),
    # paused, every reason
    *[
        (
            f"paused, {reason.value}",
            {"status": "paused", "reason": reason.value, "nodes_done": 4, "nodes_total": 8, "detail": "why"},
            ("Paused:", "4 of 8", "Detail: why"),
            ("first step", "working"),
        )
        for reason in PauseReason
    ],
    (
        "paused, unprovable, names the op",
        {"status": "paused", "reason": "unprovable", "nodes_done": 1, "nodes_total": 2, "operations": [UNKNOWN]},
        ("op op-copy-2", "settle it"),
        (),
    ),
    # taken over, every holder state: never "nobody"
    (
        "taken over, live",
        {"status": "human", "nodes_done": 7, "nodes_total": 8, "holder": ANN},
        ("Taken over by operator ann, who holds it now", "7 of 8"),
        ("nobody",),
    ),
    (
        "taken over, in its grace",
        {"status": "human", "nodes_done": 7, "nodes_total": 8, "holder": ANN_GRACE},
        ("operator ann", "in its grace for 12 s more"),
        ("nobody",),
    ),
    (
        "taken over, lapsed",
        {"status": "human", "nodes_done": 7, "nodes_total": 8, "holder": ANN_LAPSED},
        ("operator ann", "lapsed 44 s ago", "can write nothing"),
        ("nobody", "holds it now"),
    ),
    (
        "taken over, released",
        {"status": "human", "nodes_done": 7, "nodes_total": 8, "holder": ANN_RELEASED},
        ("Taken over by operator ann, who no longer holds it (lease released)",),
        ("nobody",),
    ),
    (
        "taken over, force-released",
        {"status": "human", "holder": ANN_FORCED, "nodes_total": 8},
        ("operator ann", "force-released"),
        ("nobody",),
    ),
    (
        "taken over, no lease recorded",
        {"status": "human", "nodes_total": 8},
        ("Taken over by a person",),
        ("nobody",),
    ),
    (
        "taken over, awaiting approval",
        {"status": "human", "nodes_done": 7, "nodes_total": 8, "holder": ANN, "approval_waits": [APPROVAL]},
        ("operator ann", "delete-temp-copies waits for a person's approval of approve-cleanup"),
        ("nobody",),
    ),
    (
        "taken over, cancel recorded",
        {"status": "human", "holder": ANN, "nodes_total": 8, "cancel_requested": True},
        ("operator ann", "A cancel is recorded"),
        ("nobody",),
    ),
    # stopping, stopped with operations to reconcile, stopped
    (
        "stopping",
        {"status": "stopping", "nodes_done": 2, "nodes_total": 8, "operations": [SENT]},
        ("1 operation in flight: op-copy-5", "nothing new starts"),
        (),
    ),
    (
        "stopping, nothing in flight",
        {"status": "stopping", "nodes_total": 8},
        ("the next worker run",),
        (),
    ),
    (
        "stopped_pending, awaiting a final not found",
        {"status": "stopped_pending", "nodes_done": 2, "nodes_total": 8, "operations": [AWAITING]},
        ("waits for op op-copy-3 until 2030-01-01 12:00:05 UTC or a fence",),
        (),
    ),
    (
        "stopped_pending, a not found not final yet, and another unknown",
        {"status": "stopped_pending", "nodes_total": 8, "operations": [NOT_FINAL, UNKNOWN]},
        (
            "waits for op op-copy-4 until 2030-01-01 12:00:05 UTC or a fence",
            "1 operation of unknown outcome to reconcile by op key: op-copy-2",
        ),
        (),
    ),
    (
        "stopped",
        {"status": "stopped", "nodes_done": 2, "nodes_total": 8},
        ("Stopped after a cancel", "2 of 8 steps done"),
        (),
    ),
    # ended
    ("completed", {"status": "completed", "nodes_done": 8, "nodes_total": 8}, ("every step (8)",), ()),
    (
        "failed",
        {"status": "failed", "nodes_done": 3, "nodes_total": 8, "detail": "ended by user:ann"},
        ("Failed", "3 of 8", "ended by user:ann"),
        (),
    ),
    ("quarantined", {"status": "quarantined", "detail": "seq 4 digest"}, ("Quarantined", "seq 4 digest"), ()),
]


@pytest.mark.parametrize(("case", "arguments", "says", "never"), CASES, ids=[c[0] for c in CASES])
def test_the_sentence_says_what_the_database_holds(
    case: str, arguments: dict[str, Any], says: tuple[str, ...], never: tuple[str, ...]
) -> None:
    sentence = state_sentence(**arguments)
    for part in says:
        assert part in sentence, (case, sentence)
    for part in never:
        assert part not in sentence, (case, sentence)


def test_every_status_has_a_case() -> None:
    covered = {str(arguments["status"]) for _case, arguments, _says, _never in CASES}
    assert covered == {s.value for s in TaskStatus}


@pytest.mark.parametrize("status", list(TaskStatus))
@pytest.mark.parametrize("done", [0, 1, 8])
@pytest.mark.parametrize(
    "holder", [None, AGENT, AGENT_LAPSED, ANN, ANN_GRACE, ANN_LAPSED, ANN_RELEASED], ids=lambda h: str(h and h.phase)
)
@pytest.mark.parametrize("waits", [(), (APPROVAL,)], ids=["no approval", "approval"])
def test_no_combination_says_what_is_false(status, done, holder, waits) -> None:
    """Every status by steps done by holder by approval wait: the sentence never claims a first step once one is done,
    an agent at work while an approval is awaited or no agent holds a live lease, or nobody for a person's task."""
    sentence = state_sentence(status=status.value, nodes_done=done, nodes_total=8, holder=holder, approval_waits=waits)
    assert sentence and sentence.endswith(".")
    if done:
        assert "first step" not in sentence
    if waits or holder is None or holder.kind != "agent" or holder.phase is not Phase.LIVE:
        assert "is working" not in sentence
    if status is TaskStatus.HUMAN:
        assert "nobody" not in sentence.lower()
        if holder is not None and holder.kind == "operator":
            assert "operator ann" in sentence
    if waits and status in (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.HUMAN):
        assert "approve-cleanup" in sentence


def test_a_stopped_task_waits_until_the_deadline_plus_skew(make_task, settings) -> None:
    """From rows: the moment a stopped task's "not found" becomes final is the operation's not_after plus the
    remote's clock skew (RECKON_REMOTE_CLOCK_SKEW_SECONDS)."""
    from tasks.models import Node, Operation
    from tasks.reads.state import open_operations_of

    task = make_task()
    node = Node.objects.filter(task=task).first()
    op = Operation(node=node, task=task, op_key="k-1", status="unknown", failure_class="awaiting_final")
    op.not_after = AT
    [shown] = open_operations_of([op])
    assert shown.final_at == AT + settings.RECKON_REMOTE_CLOCK_SKEW
    assert shown.final_at - AT == timedelta(seconds=settings.RECKON_REMOTE_CLOCK_SKEW.total_seconds())
