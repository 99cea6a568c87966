"""How the console names a state: for every task status, pause reason and attention reason, a label, an icon (a
text glyph, shown beside the label: state is never told by colour alone) and one sentence saying what it means —
for a state that waits, what it waits for. The queue's badges and the detail page read them here."""

from dataclasses import dataclass
from typing import Any

from tasks.core.lifecycle import PauseReason, TaskStatus
from tasks.querysets import Attention


@dataclass(frozen=True)
class Presentation:
    label: str
    icon: str
    meaning: str
    # A CSS hook naming the family — moving, waiting, held (a person has it: a normal state), attention (waits for a
    # person), done, ended, failed — each its own colour (reckon.css); the label says it too.
    tone: str


_S = TaskStatus
STATUSES: dict[TaskStatus, Presentation] = {
    _S.PENDING: Presentation(
        "pending", "○", "Not running now: a worker takes its next step once that step may start.", "moving"
    ),
    _S.RUNNING: Presentation("running", "▶", "Handed to agents: they take its steps as each may start.", "moving"),
    _S.OBSERVING: Presentation(
        "observing", "◎", "A remote operation was accepted and is still running; waiting for its result.", "moving"
    ),
    _S.BACKING_OFF: Presentation(
        "backing off", "↻", "A step failed and will be retried after a pause; waiting for its retry time.", "moving"
    ),
    _S.PAUSED: Presentation(
        "paused", "‖", "Stopped before its next step; waiting for a person's decision.", "attention"
    ),
    _S.HUMAN: Presentation(
        "taken over", "☺", "A person holds or last held it; waiting for their result and decision.", "held"
    ),
    _S.STOPPING: Presentation(
        "stopping",
        "◐",
        "Cancel recorded, nothing new starts; waiting for operations already sent to finish.",
        "waiting",
    ),
    _S.STOPPED_PENDING: Presentation(
        "stopped, to reconcile",
        "◑",
        "Cancelled and stopped; waiting for operations of unknown outcome to be reconciled.",
        "attention",
    ),
    _S.STOPPED: Presentation(
        "stopped", "■", "Cancelled; every operation is settled. Nothing more will happen.", "ended"
    ),
    _S.COMPLETED: Presentation(
        "completed", "✔", "Every step succeeded with a receipt. Nothing more will happen.", "done"
    ),
    _S.FAILED: Presentation("failed", "✖", "Ended without completing. Nothing more will happen.", "failed"),
    _S.QUARANTINED: Presentation(
        "quarantined",
        "⚠",
        "Its event log and its stored state disagree: nothing runs until the record is examined.",
        "failed",
    ),
}

_P = PauseReason
PAUSE_REASONS: dict[PauseReason, Presentation] = {
    _P.NEEDS_REPLAN: Presentation(
        "needs a new plan", "✎", "The plan no longer says what is true; waiting for a re-plan.", "attention"
    ),
    _P.PERMISSION_REVOKED: Presentation(
        "permission revoked",
        "⊘",
        "The remote refused for lack of permission; waiting for access and a decision.",
        "attention",
    ),
    _P.INPUT_CHANGED: Presentation(
        "input changed", "≠", "An input's version changed; waiting for a re-plan or an approval.", "attention"
    ),
    _P.BUDGET_EXHAUSTED: Presentation(
        "budget exhausted", "◔", "Its attempts are spent; waiting for a person to take it over.", "attention"
    ),
    _P.VERSION_CONFLICT: Presentation(
        "version conflict", "⇄", "The remote's version moved under it; waiting for a person's decision.", "attention"
    ),
    _P.UNPROVABLE: Presentation(
        "outcome unprovable",
        "?",
        "The remote can neither dedupe nor answer for an operation; waiting for a person to settle it.",
        "attention",
    ),
}

_A = Attention
ATTENTION: dict[Attention, Presentation] = {
    _A.HUMAN: Presentation(
        "taken over", "☺", "A person holds or last held it: their result and decision are due.", "attention"
    ),
    _A.PAUSED: Presentation(
        "paused", "‖", "It stopped before its next step and waits for a person's decision.", "attention"
    ),
    _A.AWAITING_APPROVAL: Presentation(
        "awaiting approval", "☐", "Its next step is an approval: nothing runs until a person approves.", "attention"
    ),
    _A.STOPPED_PENDING: Presentation(
        "stopped, to reconcile", "◑", "Cancelled, with operations of unknown outcome left to reconcile.", "attention"
    ),
    _A.QUARANTINED: Presentation(
        "quarantined", "⚠", "Its record cannot be trusted: the event log and the stored state disagree.", "failed"
    ),
    _A.UNKNOWN_OPERATION: Presentation(
        "operation outcome unknown",
        "?",
        "An operation's outcome is unknown until it is queried by op key or settled.",
        "attention",
    ),
    _A.UNPROVABLE_OPERATION: Presentation(
        "operation unprovable",
        "⁇",
        "The remote cannot tell whether an operation happened: a person must settle it.",
        "attention",
    ),
    _A.BUDGET_EXHAUSTED: Presentation(
        "attempt budget exhausted",
        "◔",
        "No attempts are left for a step or the task: a person must take over.",
        "attention",
    ),
    _A.TEMP_RESOURCE_STUCK: Presentation(
        "temp resource stuck",
        "▣",
        "A temporary resource could not be deleted: a person must reset or remove it.",
        "attention",
    ),
    _A.TEMP_RESOURCE_LEFT: Presentation(
        "temp resources left",
        "▢",
        "The task has ended with temp resources still to delete, and nobody will: no connector for its kind on this "
        "server, and no agent holds it. Its agent must come back for them, or a person removes them.",
        "attention",
    ),
    _A.TAKEOVER_REQUESTED: Presentation(
        "takeover requested", "⚑", "A person asked to take over: the agent hands over at its next step.", "attention"
    ),
}


def status(value: str) -> Presentation:
    return STATUSES[TaskStatus(value)]


def pause_reason(value: str) -> Presentation:
    return PAUSE_REASONS[PauseReason(value)]


def attention(reason: Attention | str) -> Presentation:
    return ATTENTION[Attention(reason)]


@dataclass(frozen=True)
class Badge:
    """A task's state as one badge: the status (and the pause reason of a paused task), with what it waits for."""

    status: str
    label: str
    icon: str
    meaning: str
    tone: str


def task_badge(task: Any) -> Badge:
    """The badge of a task row (anything with ``status`` and ``status_reason``)."""
    shown = status(task.status)
    label, icon, meaning, tone = shown.label, shown.icon, shown.meaning, shown.tone
    if task.status == TaskStatus.PAUSED.value and task.status_reason:
        reason = pause_reason(task.status_reason)
        label, icon, meaning = f"paused: {reason.label}", reason.icon, reason.meaning
    return Badge(status=task.status, label=label, icon=icon, meaning=meaning, tone=tone)
