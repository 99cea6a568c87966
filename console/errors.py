"""A service's named refusal, as the console tells it to a person: mapped here once, for every view.

Each refusal's stable ``code`` (tasks.core.errors, leases.errors, tasks.access.permissions and the other named errors)
has one
sentence that says what happened and what the person can do about it; the service's own text follows as the
detail (which node, which operation, which holder). A refusal always means nothing was written.
"""

from typing import Any

from audit.errors import Refused
from leases.errors import LeaseError

# code → what happened, and what to do. Every named refusal has one (tests/test_console_takeover.py checks).
SENTENCES: dict[str, str] = {
    # tasks.core.errors
    "task_error": "The action was refused.",
    "task_not_found": "This task does not exist (any more). Go back to the task list.",
    "version_conflict": "The task changed since you opened this page: nothing was saved. Read the page again and "
    "decide on what it shows now.",
    "task_not_runnable": "The task is not in a state that allows this. Read its current state and choose another "
    "action.",
    "cancel_requested": "A cancel is recorded on this task: nothing new may start. Reconcile what is in flight.",
    "takeover_requested": "A person asked to take this task over: nothing new starts until they have it or withdraw.",
    "inputs_recheck_required": "The task's inputs must be read again from their sources before anything new starts.",
    "takeover_held": "Another person holds, or is waiting for, this task. Ask them, or an admin, to release it.",
    "budget_exhausted": "The attempt budget is used up. Submit a result by hand, re-plan (a re-plan does not refresh "
    "a spent budget: state a larger attempt_budget in the new plan), or end the task.",
    "backoff_active": "The task is backing off after a failure; it tries again later by itself.",
    "node_not_ready": "That step is not ready: the steps it depends on have not succeeded yet.",
    "operations_open": "An operation is in flight or its outcome is unknown. Settle it by op key on the task's "
    "actions page first.",
    "not_found_not_final": "The remote has no trace of this operation yet, but a request under its op key may still "
    "land until its deadline: it cannot be settled as not done before then. Wait for the time shown, or settle it "
    "once the remote has fenced the op key.",
    "invalid_transition": "That change is not allowed from the task's or step's current state.",
    "evidence_insufficient": "The evidence does not satisfy the step's evidence spec. Correct the receipt fields and "
    "try again.",
    "plan_invalid": "The plan is not valid. Fix every problem listed and propose it again.",
    "payload_rejected": "The text was refused: it cannot be stored in the task's record.",
    "payload_too_large": "The text or file is too large to store. Shorten it, or attach a reference instead.",
    "secret_in_payload": "The text looks like it holds a credential: never paste secrets. Remove it and try again.",
    "unknown_task_kind": "No agent is registered for this kind of task: no worker can drive it.",
    "stored_fact_altered": "A stored fact differs from what the log recorded: nothing was sent. Report it to an "
    "admin; the task may be quarantined.",
    "approval_refused": "The approval does not permit this.",
    "approval_missing": "No approval permits this step's request yet: a person approves it first.",
    "approval_request_changed": "The request is not the one approved (or not the one this page showed): nothing was "
    "approved or started. Read the page again and approve what it shows now.",
    "approval_plan_moved": "The approval was given under an earlier plan: the new plan's requests must be approved "
    "again.",
    "approval_expired": "The approval has expired: the step waits for a new approval.",
    "approval_not_given": "That step waits for an approval that is not given (or no longer holds): a result for it "
    "cannot be recorded before a person approves it. Approve it first, then submit.",
    "proposal_superseded": "That plan was superseded by a newer proposal (or the plan accepted since): only the newest "
    "proposal can be accepted. Read the re-plan page again.",
    "approval_ttl_invalid": "That validity is not allowed: leave it empty for the default, or choose a shorter one.",
    "invalid_cursor": "This link to a page is not valid any more: start again from the first page.",
    "takeover_required": "Take the task over before settling its operations by hand.",
    "takeover_refused": "The takeover was refused.",
    "note_refused": "The note is empty or too long: write what you saw, briefly.",
    "bulk_refused": "The bulk action cannot run as asked: check the selection, the action and the reason.",
    # tasks.access.permissions
    "permission_denied": "You may not do this on this task. Ask an admin to grant you the task, or its project.",
    "grant_refused": "That grant already exists, or there is nothing to revoke.",
    "role_refused": "That role change would change nothing, or leave Reckon without an admin.",
    # leases.errors
    "lease_error": "Your hold on the task was refused.",
    "lease_held": "Someone holds this task's lease right now. Request the takeover and wait for it.",
    "lease_reserved": "Another person is already waiting to take this task over.",
    "lease_lost": "You no longer hold this task (released, expired and taken, or force-released). Nothing was "
    "saved: claim it again to continue.",
    "lease_expired": "Your hold on this task expired. Nothing was saved: claim it again to continue.",
    "renewal_out_of_order": "This page's lease renewal is out of date (another tab renewed it?). Reload the page.",
    "lease_refused": "No agent may hold the task in its current state.",
    # retention.errors
    "retention_error": "The retained object was refused.",
    "retention_refused": "The retained object cannot be changed that way.",
    "retention_not_found": "The retained object does not exist.",
    "retention_expired": "The retained object has expired: re-create it from its versioned source.",
    "retention_corrupt": "The retained object fails its integrity check. Report it to an admin.",
    "retention_key_mismatch": "The retained object was sealed with another key. Report it to an admin.",
    "retention_key_invalid": "The retention key is not valid. Report it to an admin.",
    "retention_key_missing": "No retention key is configured: nothing can be sealed or opened. Report it to an admin.",
    "retention_extension_refused": "Retention cannot be extended.",
    "retention_extension_reason_missing": "Give a reason to extend retention.",
    "retention_extension_beyond_bound": "Retention cannot be extended that far (30 days from creation at most).",
    "retention_extension_limit_reached": "Retention was already extended the most times allowed.",
}


# code → the HTTP status a refused action answers with, once for every view (and console.middleware for a refusal
# no view caught). Who may not: 403; what does not exist: 404; what was sent cannot be stored: 400; every other named
# refusal — the task's state, its version, its lease, a rule — is a conflict: 409 (read the page again, decide).
STATUS_OF: dict[str, int] = {
    "permission_denied": 403,
    "task_not_found": 404,
    "retention_not_found": 404,
    "payload_rejected": 400,
    "payload_too_large": 400,
    "secret_in_payload": 400,
    "invalid_cursor": 400,
    "note_refused": 400,
    "bulk_refused": 400,
    "retention_extension_reason_missing": 400,
    "approval_ttl_invalid": 400,  # what was typed: a validity the policy does not allow
}
CONFLICT = 409

# A refusal as the console catches it: a service's named error (audit.errors.Refused: TaskError, PermissionDenied,
# the retention and hygiene errors) or a lease's (leases.errors.LeaseError).
REFUSALS: tuple[type[Exception], ...] = (Refused, LeaseError)


def status_for(error: Exception) -> int:
    """The HTTP status of a refused action: by its code (STATUS_OF), a conflict otherwise. Never a 5xx."""
    return STATUS_OF.get(str(getattr(error, "code", "")), CONFLICT)


def message_for(error: Exception) -> str:
    """The sentence a person reads when a service refused their action, then the service's specifics."""
    code = str(getattr(error, "code", "task_error"))
    sentence = SENTENCES.get(code, SENTENCES["lease_error" if isinstance(error, LeaseError) else "task_error"])
    details: dict[str, Any] = getattr(error, "details", {}) or {}
    if code == "version_conflict" and "changes" in details:
        return f"{sentence} {changes_since(details)}"
    return f"{sentence} ({error})"


def changes_since(details: dict[str, Any]) -> str:
    """What happened to the task since the version the form was based on: the events after it, summarised."""
    changes = [c for c in details.get("changes", []) if isinstance(c, dict)]
    listed = ", ".join(f"#{c.get('seq')} {str(c.get('type', '')).replace('_', ' ')}" for c in changes[:10])
    more = f" and {len(changes) - 10} more" if len(changes) > 10 else ""
    head = f"Version {details.get('expected')} → {details.get('actual')}"
    return f"{head}: {listed}{more}." if changes else f"{head}."
