"""Who calls the agent API: ``Authorization: Bearer <token>`` and nothing else. A console session cookie is not
looked at (a logged-in browser is anonymous here), so the API needs no CSRF protection: no ambient credential.

**Scope first.** The authentication of every operation is also where the token's scope is checked, once, for every
route: a route whose path names a task (``{task_id}``) is answered ``404 task_not_found`` — exactly as for a task
that does not exist — when that task is outside the token's scope, before the body is parsed, before any header
is read, before an ``Idempotency-Key`` is looked up and before the handler runs. No handler checks the scope
itself, so none can forget it (tests/test_api_scope.py walks every route of the OpenAPI document). A route whose path
names a task kind (``{kind}``) is answered ``404 kind_not_found`` for a kind outside the scope, exactly as for a kind
no task can be of."""

from django.http import HttpRequest
from ninja.security import HttpBearer

from api.http import LEASE_HEADER
from api.models import ApiToken
from api.ratelimit import rate_limit
from api.tokens import api_token_authenticate, require_kind_scope, require_scope
from audit.principals import Principal
from tasks.core.parsing import ascii_int

# The path parameter that names the task a route addresses (every task-addressed route is /tasks/{task_id}/…).
TASK_PARAMETER = "task_id"
# The path parameter that names a task kind (/kinds/{kind}/…).
KIND_PARAMETER = "kind"


class AgentToken(HttpBearer):
    """Sets ``request.auth`` to the live ApiToken; an unknown or revoked token is refused (401), a task outside the
    token's scope is not found (404, api.tokens.require_scope)."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        match = request.resolver_match
        raw = match.kwargs.get(TASK_PARAMETER) if match is not None else None
        # The token and the kind and project of the task the path names, in one query.
        task_id = ascii_int(str(raw)) if raw is not None else None
        # The lease the request names is read with the token (one query); an unreadable header is left to the
        # handler, which refuses it by name — after the scope, as everything else.
        lease_header = request.headers.get(LEASE_HEADER)
        lease_id = ascii_int(lease_header.strip()) if lease_header is not None else None
        row = api_token_authenticate(token, task_id=task_id, lease_id=lease_id)
        if row is None:
            return None
        rate_limit(row.token_hash[:32])  # RateLimited (429) past the token's rate
        if raw is not None:
            require_scope(row, str(raw))  # TaskNotFound (404): answered before anything else
        kind = match.kwargs.get(KIND_PARAMETER) if match is not None else None
        if kind is not None:
            require_kind_scope(row, str(kind))  # KindNotFound (404): the same
        return row


def token_of(request: HttpRequest) -> ApiToken:
    token = getattr(request, "auth", None)
    if not isinstance(token, ApiToken):  # every operation is authenticated: unreachable unless misconfigured
        raise RuntimeError("an API operation ran without an authenticated token")
    return token


def agent_principal(request: HttpRequest) -> Principal:
    """The agent the request's token belongs to: the principal of every service the API calls."""
    return Principal.agent(token_of(request).agent_id)
