"""Who calls the agent API: ``Authorization: Bearer <token>`` and nothing else. A console session cookie is not
looked at (a logged-in browser is anonymous here), so the API needs no CSRF protection: no ambient credential."""

from django.http import HttpRequest
from ninja.security import HttpBearer

from api.models import ApiToken
from api.ratelimit import rate_limit
from api.tokens import api_token_authenticate
from audit.principals import Principal


class AgentToken(HttpBearer):
    """Sets ``request.auth`` to the live ApiToken; an unknown or revoked token is refused (401)."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        row = api_token_authenticate(token)
        if row is not None:
            rate_limit(row.token_hash[:32])  # RateLimited (429) past the token's rate
        return row


def token_of(request: HttpRequest) -> ApiToken:
    token = getattr(request, "auth", None)
    if not isinstance(token, ApiToken):  # every operation is authenticated: unreachable unless misconfigured
        raise RuntimeError("an API operation ran without an authenticated token")
    return token


def agent_principal(request: HttpRequest) -> Principal:
    """The agent the request's token belongs to: the principal of every service the API calls."""
    return Principal.agent(token_of(request).agent_id)
