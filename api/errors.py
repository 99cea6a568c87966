"""Every error of the agent API as RFC 9457 problem details (``application/problem+json``), mapped once here.

A named error (``tasks.core.errors``, ``leases.errors``, ``tasks.access.permissions.PermissionDenied``, the API's own)
is
answered with the status its ``code`` maps to and the stable type ``https://reckon.dev/problems/<code>``; a code
not in the table is a 409 (a rule refused the request: re-read and decide), never a 500. Validation errors carry
field-level ``errors``."""

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, JsonResponse

PROBLEM_TYPE_BASE = "https://reckon.dev/problems/"
CONTENT_TYPE = "application/problem+json"

# code → HTTP status. A code absent from this table answers 409.
STATUS_OF: Mapping[str, int] = {
    # Who is asking
    "unauthenticated": 401,
    "permission_denied": 403,
    # What is asked for (a task out of the token's scope is not found: its existence is not disclosed)
    "task_not_found": 404,
    "operation_not_found": 404,
    "node_not_found": 404,
    "receipt_not_found": 404,
    "temp_resource_not_found": 404,
    "not_found": 404,
    "token_not_found": 404,
    "webhook_not_found": 404,
    "retention_not_found": 404,
    "kind_not_found": 404,
    "method_not_allowed": 405,
    # Retained objects (retention.errors): gone is 410 — re-create it from external facts and retain it again
    "retention_expired": 410,
    "retention_corrupt": 409,
    "retention_key_mismatch": 409,
    "database_unavailable": 503,
    "retention_key_invalid": 503,
    "retention_key_missing": 503,
    # Compare-and-set and leases
    "version_conflict": 412,
    "lease_held": 409,
    "lease_lost": 409,
    "lease_expired": 409,
    "renewal_out_of_order": 409,
    "lease_not_held": 409,
    "lease_refused": 409,
    "lease_reserved": 423,
    "takeover_held": 423,
    "takeover_requested": 423,
    "takeover_required": 423,
    # What was sent
    "validation_error": 422,
    "invalid_cursor": 422,
    "plan_invalid": 422,
    "payload_rejected": 422,
    "secret_in_payload": 422,
    "evidence_insufficient": 422,
    "unknown_task_kind": 422,
    "webhook_url_invalid": 422,
    "webhook_events_invalid": 422,
    "payload_too_large": 413,
    "malformed_body": 400,
    "invalid_header": 400,
    "precondition_required": 428,
    "idempotency_key_reused": 422,
    "retention_error": 422,
    "retention_refused": 422,
    "retention_extension_refused": 409,
    "retention_extension_reason_missing": 422,
    "retention_extension_beyond_bound": 422,
    "retention_extension_limit_reached": 422,
    # Approvals bound to the exact call (tasks/decide/approval_binding.py): the start waits for a new approval
    "approval_missing": 409,
    "approval_request_changed": 409,
    "approval_plan_moved": 409,
    "approval_expired": 409,
    "approval_ttl_invalid": 422,
    "approval_not_given": 409,
    # The step's rules: re-read the task (the directive) and decide
    "node_not_ready": 409,
    "invalid_transition": 409,
    "cancel_requested": 409,
    "inputs_recheck_required": 409,
    "operations_open": 409,
    "proposal_superseded": 409,
    "task_not_runnable": 409,
    "stored_fact_altered": 409,
    "webhook_limit_reached": 409,
    # Pacing
    "backoff_active": 429,
    "not_found_not_final": 409,
    "rate_limited": 429,
    "budget_exhausted": 409,
}
DEFAULT_STATUS = 409

TITLE_OF: Mapping[str, str] = {
    "unauthenticated": "A valid agent token is required",
    "permission_denied": "Not allowed",
    "task_not_found": "No such task",
    "kind_not_found": "No such task kind",
    "database_unavailable": "The database did not answer: try again",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "version_conflict": "The task changed since you read it",
    "lease_held": "Another holder has the lease",
    "lease_reserved": "A person is taking this task over",
    "takeover_held": "A person holds this task",
    "validation_error": "The request is not valid",
    "invalid_cursor": "Not a cursor of this list",
    "payload_too_large": "The request body is too large",
    "malformed_body": "The request body is not valid JSON",
    "secret_in_payload": "The payload contains a secret",
    "precondition_required": "A header this request needs is missing",
    "idempotency_key_reused": "The Idempotency-Key was used for another request",
    "rate_limited": "Too many requests",
    "lease_not_held": "That lease is not yours on this task",
    "invalid_header": "A header is not valid",
    "webhook_url_invalid": "Not a webhook URL",
    "webhook_events_invalid": "Not webhook events",
    "webhook_not_found": "No such webhook subscription",
    "retention_not_found": "No such retained object",
    "retention_expired": "The retained object is gone: re-create it",
    "retention_corrupt": "The retained object fails its integrity check",
    "retention_refused": "The object cannot be retained as sent",
    "not_found_not_final": "Not found is not final before the request's deadline",
    "approval_missing": "No approval permits this request",
    "approval_request_changed": "The request is not the one approved",
    "approval_plan_moved": "The approval was given under an earlier plan",
    "approval_expired": "The approval has expired",
}


# What a client does about a refusal of each status (docs/api.md's table of problem types: problem_table()).
ADVICE: Mapping[int, str] = {
    400: "fix the JSON or the header",
    401: "a live token (unknown or revoked tokens are 401)",
    403: "outside the token's scope, or not this agent's to do",
    404: "a task, kind or object outside the token's scope is answered as one that does not exist",
    405: "use a method the route takes",
    409: "another holder or a rule: re-read the task or the directive, then decide (an `approval_*` refusal: the step "
    "waits for a person's new approval — [Approvals](#approvals-bound-to-the-exact-call))",
    410: "a retained object's retention has ended: re-create it from external facts and retain it again "
    "([Retained objects](#retained-objects))",
    412: "the task moved: the body's `current_version` (and `ETag`) say where it is; re-read the directive",
    413: "bodies are capped at 256 KiB",
    422: "fix what the body says: `errors` names the fields (for a plan, the node and the field)",
    423: "a person is taking the task over or holds it: stop, wait for a webhook or poll",
    428: "send the header the detail names (`If-Match`, `Reckon-Lease`)",
    429: "`rate_limited`: wait `Retry-After` seconds; `backoff_active`: the node is backing off: read the directive "
    "(`wait` until `until`)",
    503: "`database_unavailable`: the database did not answer (a lost connection, a deadlock, a statement timeout): "
    "wait `Retry-After` seconds and send it again (the Python client does); a write that did commit is refused on "
    "the retry as `version_conflict`, never applied twice. `retention_key_*`: the server's `RECKON_RETENTION_KEY` is "
    "not usable: an admin must fix it",
}
# A word on a code whose name does not say enough.
NOTE_OF: Mapping[str, str] = {
    "lease_not_held": "that lease id is not yours on this task",
    "plan_invalid": "each problem named; `errors` names the node and the field of a wrong input",
    "node_not_ready": "its dependencies have not succeeded",
    "evidence_insufficient": "a receipt without a remote id; a receipt short of the node's evidence spec is recorded "
    "and answered 200, the node failed and the task paused",
}


# What any request may be answered, whatever it takes: the token, its rate, the database.
ANY_REQUEST = ("unauthenticated", "rate_limited", "database_unavailable")


def implied_codes(operation: Mapping[str, Any]) -> set[str]:
    """The problem codes an operation may answer because of what it takes, read from its OpenAPI operation: a path
    parameter may name nothing (a task or a kind out of the token's scope is answered as one that does not exist,
    before anything else) or hold what no name holds; a query parameter or a body may not be valid, a body may be
    malformed or too large; each header it reads may be malformed, missing when required, stale (If-Match) or not
    the caller's (Reckon-Lease); an Idempotency-Key may be malformed or reused."""
    codes = set(ANY_REQUEST)
    for parameter in operation.get("parameters", []):
        where, name, required = parameter["in"], parameter["name"].lower(), parameter.get("required", False)
        if where == "path":  # an id past any column (not_found), a NUL or not a number (validation_error)
            codes |= {"not_found", "validation_error"}
            codes |= {"task_id": {"task_not_found"}, "kind": {"kind_not_found"}}.get(name, set())  # api/auth.py
        elif where == "query":
            codes.add("validation_error")
        elif name in ("if-match", "reckon-lease"):
            codes |= {"invalid_header", "version_conflict" if name == "if-match" else "lease_not_held"}
            if required:
                codes.add("precondition_required")
        elif name == "idempotency-key":
            codes |= {"validation_error", "idempotency_key_reused"}
    if "requestBody" in operation:
        codes |= {"malformed_body", "payload_too_large", "validation_error"}
    return codes


def declared_problems(operation: Mapping[str, Any], refuses: Sequence[str]) -> dict[int, list[str]]:
    """Status → the codes an operation may answer with it: those its inputs imply and those its services refuse
    with (``refuses``, declared on the route: api.http.documented)."""
    by_status: dict[int, list[str]] = {}
    for code in sorted(implied_codes(operation) | set(refuses)):
        by_status.setdefault(status_of(code), []).append(code)
    return dict(sorted(by_status.items()))


def problem_table() -> str:
    """The table of problem types in docs/api.md (between its ``problems`` markers), made from STATUS_OF, NOTE_OF
    and ADVICE: tests/test_problem_table.py compares the two, ``manage.py api_problem_table --write`` rewrites it."""
    rows = ["| status | codes (`type` suffix) | what to do |", "|---|---|---|"]
    for status in sorted(set(STATUS_OF.values())):
        codes = sorted(code for code, s in STATUS_OF.items() if s == status)
        named = ", ".join(f"`{c}` ({NOTE_OF[c]})" if c in NOTE_OF else f"`{c}`" for c in codes)
        rows.append(f"| {status} | {named} | {ADVICE[status]} |")
    return "\n".join(rows) + "\n"


def status_of(code: str) -> int:
    return STATUS_OF.get(code, DEFAULT_STATUS)


def problem_type(code: str) -> str:
    return PROBLEM_TYPE_BASE + code


def problem(
    request: HttpRequest | None,
    *,
    code: str,
    detail: str,
    status: int | None = None,
    errors: Sequence[Mapping[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JsonResponse:
    """The problem-details response for ``code``."""
    status = status if status is not None else status_of(code)
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": TITLE_OF.get(code) or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if request is not None:
        body["instance"] = request.path
    if errors is not None:
        body["errors"] = list(errors)
    for name, value in (extra or {}).items():
        body.setdefault(name, value)
    response = JsonResponse(body, status=status, content_type=CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def problem_of(request: HttpRequest, error: Exception) -> JsonResponse:
    """A named error (anything with a ``code``) as its problem."""
    code = str(getattr(error, "code", "error"))
    return problem(request, code=code, detail=str(error))


def validation_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors (as ninja hands them over) as field-level details: where, what, the message."""
    return [
        {
            "field": ".".join(str(part) for part in e.get("loc", ())),
            "code": str(e.get("type", "invalid")),
            "message": str(e.get("msg", "")),
        }
        for e in errors
    ]


# A lost connection, a deadlock or a statement timeout: the database, not the request, failed. How long a client waits
# before it asks again (Retry-After, seconds).
DATABASE_RETRY_AFTER = 1
DATABASE_UNAVAILABLE_DETAIL = (
    "The database did not answer (a lost connection, a deadlock or a statement timeout): send the request again. A "
    "write is a compare-and-set on the task version: if it did commit, the retry is refused as version_conflict, "
    "never applied twice."
)


def database_unavailable(request: HttpRequest | None) -> JsonResponse:
    """503 with Retry-After for a database that did not answer (django.db's OperationalError or InterfaceError)."""
    return problem(
        request,
        code="database_unavailable",
        detail=DATABASE_UNAVAILABLE_DETAIL,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
    )
