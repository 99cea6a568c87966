"""/api/v1/webhooks: an agent's webhook subscriptions. Thin: the token, one service (hooks/services.py), added to the
API by hooks/apps.py, the answer.
The signing secret is in the answer that creates a subscription and in no other answer."""

from datetime import datetime
from typing import Annotated, Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router, Schema
from pydantic import Field

from api.auth import token_of
from api.http import IDEMPOTENCY_KEY_PATTERN, documented, header_parameter
from api.idempotency import idempotent
from hooks.models import URL_MAX, WEBHOOK_EVENTS, WebhookSubscription
from hooks.services import webhook_list, webhook_subscribe, webhook_unsubscribe

router = Router(tags=["webhooks"])

IDEMPOTENCY = header_parameter(
    "Idempotency-Key",
    "Replays the first answer to the same request (with the same secret) for 24 hours.",
    required=False,
    pattern=IDEMPOTENCY_KEY_PATTERN,
)


class SubscriptionIn(Schema):
    # An absolute http(s) URL without credentials (no user:password, no token in the query).
    url: Annotated[str, Field(min_length=1, max_length=URL_MAX)]  # as the service and the column hold it
    # The service names an unknown event (422 webhook_events_invalid); the document lists the known ones.
    events: Annotated[
        list[str],
        Field(
            min_length=1,
            max_length=len(WEBHOOK_EVENTS),
            description=", ".join(WEBHOOK_EVENTS),
            json_schema_extra={"items": {"type": "string", "enum": list(WEBHOOK_EVENTS)}},
        ),
    ]


class SubscriptionOut(Schema):
    id: int
    url: str
    events: list[str]
    created_at: datetime
    # The token it was made with: its scope decides which tasks' events are sent; revoked, nothing is sent.
    token_id: int
    active: bool


class SubscriptionCreated(SubscriptionOut):
    # Signs every delivery (docs/api.md, Webhooks). Shown in this answer only: keep it, it is never shown again.
    secret: str


def subscription_out(subscription: WebhookSubscription) -> SubscriptionOut:
    return SubscriptionOut(
        id=subscription.pk,
        url=subscription.url,
        events=list(subscription.events),
        created_at=subscription.created_at,
        token_id=subscription.token_id,
        active=subscription.deleted_at is None and subscription.token.revoked_at is None,
    )


@router.post(
    "/webhooks",
    response={201: SubscriptionCreated},
    summary="Subscribe to task events",
    openapi_extra=documented(
        IDEMPOTENCY, refuses=("webhook_url_invalid", "webhook_events_invalid", "webhook_limit_reached")
    ),
)
def webhook_create(request: HttpRequest, payload: SubscriptionIn) -> HttpResponse:
    """Deliveries of ``events`` for the tasks in this token's scope are POSTed to ``url``, signed with the
    ``secret`` of this answer (the only time it is shown). 422 webhook_url_invalid (also: a host that is or
    resolves to a loopback, private, link-local or other non-public address) / webhook_events_invalid."""
    token = token_of(request)

    def run() -> HttpResponse:
        subscription, secret = webhook_subscribe(token, payload.url, payload.events)
        body = SubscriptionCreated(**subscription_out(subscription).model_dump(), secret=secret)
        response = JsonResponse(body.model_dump(mode="json"), status=201)
        response["Location"] = f"/api/v1/webhooks/{subscription.pk}"
        return response

    return idempotent(request, token.agent_id, run)


@router.get(
    "/webhooks",
    response={200: list[SubscriptionOut]},
    summary="List this agent's subscriptions",
    openapi_extra=documented(),
)
def webhook_index(request: HttpRequest) -> Any:
    """This agent's live subscriptions, oldest first, without their secrets."""
    return [subscription_out(s) for s in webhook_list(token_of(request))]


@router.delete(
    "/webhooks/{subscription_id}",
    response={204: None},
    summary="Delete a subscription",
    openapi_extra=documented(refuses=("webhook_not_found",)),
)
def webhook_delete(request: HttpRequest, subscription_id: int) -> HttpResponse:
    """Nothing more is sent to it, pending retries included. Another agent's subscription is 404."""
    webhook_unsubscribe(token_of(request), subscription_id)
    return HttpResponse(status=204)
