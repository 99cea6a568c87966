"""/api/v1/webhooks: an agent's webhook subscriptions (being written)."""

from ninja import Router

router = Router(tags=["webhooks"])
