"""The demo's agent over HTTP (the README's agent quick start): a token for the kind the reference agent over the
API drives (examples/migrate_agent.py), issued afresh on every load and printed once, and the source it migrates
registered in the simulator. Earlier demo tokens are revoked (audited) so that only the printed one works."""

from api.models import ApiToken
from api.tokens import api_token_issue, api_token_revoke
from audit.principals import Principal

API_KIND = "migrate_project_api"  # examples/migrate_agent.py's KIND: no connector here, its agent drives it
DEMO_AGENT = "demo-agent"
QUICKSTART_PROJECT = "quickstart"


def demo_agent_token(actor: Principal) -> str:
    """A new token for the demo agent, scoped to API_KIND; every earlier live one is revoked."""
    for token_id in ApiToken.objects.filter(agent_id=DEMO_AGENT, revoked_at__isnull=True).values_list("pk", flat=True):
        api_token_revoke(actor=actor, token_id=token_id, reason="the demo was loaded again: a new token was issued")
    _row, plaintext = api_token_issue(
        actor=actor, agent_id=DEMO_AGENT, kinds=[API_KIND], projects=[], name="demo agent (README quick start)"
    )
    return plaintext
