"""The demo's agent over HTTP (the README's agent quick start): a token for the kind the reference agent over the
API drives (examples/migrate_agent.py), issued afresh on every load and printed once, and the source it migrates
registered in the simulator. Earlier demo tokens are revoked (audited) so that only the printed one works."""

from api.models import ApiToken
from api.tokens import api_token_issue, api_token_revoke
from audit.principals import Principal
from reference.migrate_table import KIND as TABLE_KIND

API_KIND = "migrate_project_api"  # examples/migrate_agent.py's KIND: no connector here, its agent drives it
# What else the printed token may drive against the demo: the reference agent's PostgreSQL kind (with databases of
# one's own) and the framework examples' tool calls (reckon_client.tools.KIND).
DEMO_KINDS = [API_KIND, TABLE_KIND, "tool_call"]
DEMO_AGENT = "demo-agent"
QUICKSTART_PROJECT = "quickstart"


def demo_agent_token(actor: Principal) -> str:
    """A new token for the demo agent, scoped to DEMO_KINDS; every earlier live one is revoked."""
    for token_id in ApiToken.objects.filter(agent_id=DEMO_AGENT, revoked_at__isnull=True).values_list("pk", flat=True):
        api_token_revoke(actor=actor, token_id=token_id, reason="the demo was loaded again: a new token was issued")
    _row, plaintext = api_token_issue(
        actor=actor, agent_id=DEMO_AGENT, kinds=DEMO_KINDS, projects=[], name="demo agent (README quick start)"
    )
    return plaintext
