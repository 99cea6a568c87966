"""The named refusals of webhook subscriptions. ``code`` is stable: the agent API answers it as problem details
(api/errors.py maps it to a status). A refusal is raised before anything is written."""

from audit.errors import Refused


class WebhookError(Refused):
    code = "webhook_error"


class WebhookUrlInvalid(WebhookError):
    """Not an absolute http(s) URL with a host, too long, or carrying credentials (user:password, a token in the
    query string): a URL is stored and shown, so it must not be a secret. Or its host is, in any spelling, or
    resolves to an address deliveries never go to (loopback, private, link-local, metadata…: hooks/targets.py)."""

    code = "webhook_url_invalid"


class WebhookEventsInvalid(WebhookError):
    """No events, or a name that is not one of the six webhook events."""

    code = "webhook_events_invalid"


class WebhookNotFound(WebhookError):
    """No such subscription for this agent (another agent's is answered the same: its existence is not disclosed)."""

    code = "webhook_not_found"


class WebhookLimitReached(WebhookError):
    """The agent already has RECKON_WEBHOOK_MAX_SUBSCRIPTIONS live subscriptions: every one is a delivery per
    event, so their number is bounded."""

    code = "webhook_limit_reached"
