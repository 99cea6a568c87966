"""One named error per rule of the domain (audit.errors.Refused: how codes reach the API and the console).

Every service raises before it writes, or inside the transaction it rolls back: a refusal leaves the
database exactly as it was.
"""

from audit.errors import Refused


class TaskError(Refused):
    code = "task_error"


class TaskNotFound(TaskError):
    code = "task_not_found"


class VersionConflict(TaskError):
    """The task moved on since the caller read it. Stop, re-read, never retry blindly."""

    code = "version_conflict"


class TaskNotRunnable(TaskError):
    code = "task_not_runnable"


class CancelRequested(TaskError):
    code = "cancel_requested"


class TakeoverRequested(TaskError):
    code = "takeover_requested"


class InputsRecheckRequired(TaskError):
    code = "inputs_recheck_required"


class TakeoverHeld(TaskError):
    """Another person holds, or waits for, this task's takeover lease."""

    code = "takeover_held"


class BudgetExhausted(TaskError):
    code = "budget_exhausted"


class BackoffActive(TaskError):
    code = "backoff_active"


class NotFoundNotFinal(TaskError):
    """The remote has no trace of the op key yet, but a request under it may still land until its deadline (plus the
    clock skew): the operation cannot be closed as never done until then, or until the remote fences the op key."""

    code = "not_found_not_final"


class NodeNotReady(TaskError):
    code = "node_not_ready"


class OperationsOpen(TaskError):
    """An operation is dispatched, accepted or unknown: it must be reconciled before anything new starts."""

    code = "operations_open"


class InvalidTransition(TaskError):
    code = "invalid_transition"


class EvidenceInsufficient(TaskError):
    code = "evidence_insufficient"


class PlanInvalid(TaskError):
    """``problems``: every problem found, each a sentence naming its node; ``fields``: those that concern one field,
    as ``(where, what)`` — ``where`` a path like ``nodes[copy-1].input.limit``."""

    code = "plan_invalid"
    # A plan of 10,000 nodes may have 10,000 problems: the answer names the first ones and how many more there are.
    SHOWN = 50

    def __init__(self, problems: list[str], fields: list[tuple[str, str]] | None = None) -> None:
        if len(problems) > self.SHOWN:
            problems = [*problems[: self.SHOWN], f"and {len(problems) - self.SHOWN} more problems like these"]
        super().__init__("plan is invalid: " + "; ".join(problems), problems=problems)
        self.problems = problems
        self.fields = (fields or [])[: self.SHOWN]


class UnknownTaskKind(TaskError):
    """No app registered this task kind (tasks/engine/registry.py): no worker knows which connector drives it."""

    code = "unknown_task_kind"


class StoredFactAltered(TaskError):
    """A stored fact a call would be made from (a request, a locator) is not what the log recorded: nothing is sent."""

    code = "stored_fact_altered"


class ApprovalRefused(TaskError):
    """An approval does not bind the call (tasks/decide/approval_binding.py): the gated operation does not start, or
    the approval is not given as asked. Nothing is written; the task waits for a new approval."""

    code = "approval_refused"


class ApprovalMissing(ApprovalRefused):
    """No approval binds the gated node's request: it has not been given (or not with node_approve)."""

    code = "approval_missing"


class ApprovalRequestChanged(ApprovalRefused):
    """The request is not the one approved (or not the one the approver was shown)."""

    code = "approval_request_changed"


class ApprovalPlanMoved(ApprovalRefused):
    """The approval was given under an earlier plan revision."""

    code = "approval_plan_moved"


class ApprovalExpired(ApprovalRefused):
    """The approval's expiry has passed on the database clock."""

    code = "approval_expired"


class ApprovalTtlInvalid(ApprovalRefused):
    """The validity asked for an approval is not within the deployment's bounds (RECKON_APPROVAL_TTL_MAX)."""

    code = "approval_ttl_invalid"


class ProposalSuperseded(InvalidTransition):
    """A proposed plan that a later proposal (or the plan accepted since) replaced: only the newest proposal may be
    accepted (tasks.engine.plans.superseded_by, the one rule)."""

    code = "proposal_superseded"


class ApprovalNotGiven(ApprovalRefused):
    """A person's result for a step that an approval gates, while the approval does not bind that step's request
    (not given, expired, given under another plan or for another request): typing the result would do the gated
    work without the approval. Nothing is written; the approval is given first."""

    code = "approval_not_given"
