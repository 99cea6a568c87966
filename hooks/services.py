"""Webhooks: an agent's subscriptions, the outbox written with the change, and the signed, retried delivery.

Every rule about webhooks is here; the API handlers (hooks/api.py) and the Celery jobs (hooks/jobs.py) call
these functions and nothing else.

- A subscription belongs to a token: the token's scope says which tasks' events it receives, the token's liveness
  is the subscription's. Its secret is made here, returned once, stored to sign, never listed, sent or logged.
- The outbox: ``outbox_listener`` is called inside the transaction that appends an event (tasks/engine/events.py). It
  writes one delivery per matching live subscription, so a change that rolls back leaves no delivery and a
  committed one always has its delivery; the Celery job is asked for on commit only. A lost message costs latency
  (the sweep finds the row), never the delivery.
- Where: a URL is stored canonical, and only a public address is ever sent to (hooks/targets.py): checked at
  subscription, and at each send, where the name is resolved once and the connection pinned to the checked address.
- Sending: ``deliver`` claims the delivery with one conditional UPDATE (two workers never send it at once), POSTs
  it signed, and records the answer: a 2xx delivers it; anything else is tried again after an exponential backoff
  with jitter, until RECKON_WEBHOOK_MAX_ATTEMPTS. A receiver may still see a delivery twice (its 2xx lost on the
  way back): it dedupes by ``delivery_id``.
"""

import hashlib
import json
import logging
import random
import secrets
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import F, Q, QuerySet

from api.models import ApiToken
from api.tokens import scope_covers
from audit.hygiene import scan_payload
from audit.principals import Principal
from audit.services import audit_append
from hooks import signing, targets
from hooks.errors import WebhookEventsInvalid, WebhookLimitReached, WebhookNotFound, WebhookUrlInvalid
from hooks.models import URL_MAX, WEBHOOK_EVENTS, DeliveryStatus, WebhookDelivery, WebhookSubscription
from leases import clock
from tasks.engine.enqueue import send_job
from tasks.engine.events import ENDING_STATUSES
from tasks.models import Event, Task

logger = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"  # noqa: S105 (marks a webhook secret, so that a leaked one is recognisable)
# The task events the outbox listens to (every event that ends the task is listened to as well: task_finished).
SOURCE_EVENTS = frozenset({"cancel_requested", "takeover_granted", "takeover_result_submitted", "lease_forced_release"})
# A claimed delivery is not due again before its send has surely ended (httpx's timeout applies per phase:
# connect, write, read, pool): a worker that died while sending leaves it to be sent again after this.
CLAIM_MARGIN = timedelta(seconds=60)
ERROR_MAX = 500


# --- subscriptions ----------------------------------------------------------------------------------------------


def webhook_subscribe(token: ApiToken, url: str, events: Sequence[str]) -> tuple[WebhookSubscription, str]:
    """Subscribe ``token``'s agent to ``events`` of the tasks in the token's scope, delivered to ``url``. Returns
    the subscription and its signing secret: the only time the secret leaves Reckon. Audited."""
    url, names = _valid_url(url), _valid_events(events)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    limit: int = settings.RECKON_WEBHOOK_MAX_SUBSCRIPTIONS
    with transaction.atomic():
        # The agent's tokens locked: two subscriptions made at once are counted one after the other.
        list(ApiToken.objects.select_for_update().filter(agent_id=token.agent_id).values_list("pk"))
        if _live(token.agent_id).count() >= limit:
            raise WebhookLimitReached(f"agent {token.agent_id} already has {limit} webhook subscriptions")
        now = clock.now()
        subscription = WebhookSubscription.objects.create(
            token=token, url=url, events=names, secret=secret, created_at=now
        )
        audit_append(
            actor=Principal.agent(token.agent_id),
            action="webhook_subscribed",
            at=now,
            details={"subscription": subscription.pk, "token": token.pk, "url": url, "events": names},
        )
    return subscription, secret


def webhook_list(token: ApiToken) -> list[WebhookSubscription]:
    """The live subscriptions of the token's agent (made with any of its tokens), oldest first: one query."""
    return list(_live(token.agent_id).select_related("token"))


def webhook_unsubscribe(token: ApiToken, subscription_id: int) -> None:
    """Delete one of the agent's subscriptions: nothing more is sent to it, deliveries still pending included.
    Another agent's subscription, or one already deleted, is not found. Audited."""
    with transaction.atomic():
        now = clock.now()
        deleted = _live(token.agent_id).filter(pk=subscription_id).update(deleted_at=now)
        if deleted != 1:
            raise WebhookNotFound(f"webhook subscription {subscription_id} does not exist")
        audit_append(
            actor=Principal.agent(token.agent_id),
            action="webhook_unsubscribed",
            at=now,
            details={"subscription": subscription_id, "token": token.pk},
        )


def _live(agent_id: str) -> "QuerySet[WebhookSubscription]":
    return WebhookSubscription.objects.filter(token__agent_id=agent_id, deleted_at__isnull=True)


def _valid_url(url: str) -> str:
    """An absolute http(s) URL with a host, at most URL_MAX characters, carrying no credentials: neither
    user:password nor anything credential-like in the query (the URL is stored, listed and audited)."""
    url = url.strip()
    if not url or len(url) > URL_MAX:
        raise WebhookUrlInvalid(f"a webhook URL is 1 to {URL_MAX} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise WebhookUrlInvalid("a webhook URL contains no spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number or out of range
    except ValueError:
        raise WebhookUrlInvalid("not a valid URL") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise WebhookUrlInvalid("a webhook URL is an absolute http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise WebhookUrlInvalid("a webhook URL carries no credentials (user:password@): verify the signature instead")
    host = _checked_host(parts.hostname, port or (443 if parts.scheme == "https" else 80))
    # Stored canonical: the scheme and host in lower case (what the CHECK constraint and every later reading expect),
    # the host as it is connected to (IDNA-encoded, no trailing dot, an IPv4 address in its dotted form).
    netloc = host.netloc_host + (f":{port}" if port is not None else "")
    url = urlunsplit((parts.scheme.lower(), netloc, parts.path, parts.query, parts.fragment))
    if len(url) > URL_MAX:
        raise WebhookUrlInvalid(f"a webhook URL is 1 to {URL_MAX} characters")
    if list(scan_payload(url)) or list(scan_payload(dict(parse_qsl(parts.query, keep_blank_values=True)))):
        raise WebhookUrlInvalid("a webhook URL carries no credentials (a token in the query): verify the signature")
    return url


def _checked_host(hostname: str, port: int) -> targets.Host:
    """The URL's host, canonical, refused if it is (or its name resolves now to) an address deliveries never go to
    (hooks/targets.py). A name that does not resolve yet is accepted: every delivery resolves and checks it again."""
    try:
        host = targets.canonical_host(hostname)
        targets.pinned_addresses(host, port)
    except targets.TargetRefused as refused:
        raise WebhookUrlInvalid(f"webhook deliveries are never sent there: {refused}") from None
    except targets.Unresolved:
        pass
    return host


def _valid_events(events: Sequence[str]) -> list[str]:
    if isinstance(events, str) or not events:
        raise WebhookEventsInvalid(f"subscribe to at least one of: {', '.join(WEBHOOK_EVENTS)}")
    unknown = sorted({str(name) for name in events} - set(WEBHOOK_EVENTS))
    if unknown:
        known = ", ".join(WEBHOOK_EVENTS)
        raise WebhookEventsInvalid(f"not webhook events: {', '.join(unknown)[:200]}; known: {known}")
    return sorted(set(events))


# --- the outbox -------------------------------------------------------------------------------------------------


def webhook_events_of(event: Event) -> list[tuple[str, dict[str, Any]]]:
    """The webhook events a task event is, with their ``data``: none, one, or two (a cancel that stops the task at
    once is ``cancel_requested`` and ``task_finished``). References only: what the event's payload already holds,
    which passed the hygiene check (audit/hygiene.py) — never a secret."""
    payload: dict[str, Any] = event.payload or {}
    task: dict[str, Any] = payload.get("task") or {}
    data: dict[str, Any] = payload.get("data") or {}
    found: list[tuple[str, dict[str, Any]]] = []
    if event.type == "cancel_requested":
        found.append(
            (
                "cancel_requested",
                {"reason": task.get("cancel_reason", ""), "by": task.get("cancel_requested_by", "")},
            )
        )
    elif event.type == "takeover_granted":
        found.append(("takeover_started", {"operator": data.get("operator", "")}))
    elif event.type == "takeover_result_submitted":
        decision = data.get("decision")
        if decision == "resume_agent" and task.get("status") == "pending":  # not when a recorded cancel stands
            found.append(
                (
                    "task_resumed",
                    {
                        "decision": decision,
                        "operator": data.get("operator", ""),
                        # What the person settled: the nodes and their receipts (remote ids, counts, digests).
                        "nodes": data.get("nodes", []),
                        "receipts": data.get("receipts", {}),
                        "inputs_recheck_required": bool(task.get("inputs_recheck_required", False)),
                    },
                )
            )
        elif decision == "replan" and task.get("status_reason") == "needs_replan":
            found.append(
                (
                    "replan_requested",
                    {"decision": decision, "operator": data.get("operator", ""), "reason": task.get("status_detail")},
                )
            )
    elif event.type == "lease_forced_release":
        released = {"holder": data.get("holder", ""), "epoch": data.get("epoch"), "by": data.get("by", "")}
        found.append(("lease_force_released", released))
    if task.get("status") in ENDING_STATUSES:
        found.append(
            (
                "task_finished",
                {
                    "status": task["status"],
                    "status_reason": task.get("status_reason", ""),
                    "status_detail": task.get("status_detail", ""),
                },
            )
        )
    return found


def outbox_listener(task: Task, event: Event) -> None:
    """Write the deliveries of ``event`` in its transaction (tasks/engine/events.py calls this there). One query when
    the
    event is a webhook event (the live subscriptions), one insert when some match; nothing at all for the others
    (the listener is registered for SOURCE_EVENTS and for the events that end a task only)."""
    found = webhook_events_of(event)
    if not found:
        return
    rows = [
        WebhookDelivery(
            subscription_id=subscription,
            delivery_id=uuid.uuid4(),
            event=name,
            task_id=task.pk,
            task_version=event.seq,
            occurred_at=event.created_at,
            payload=data,
            next_attempt_at=event.created_at,
            created_at=event.created_at,
        )
        for subscription, events in _live_subscriptions(task)
        for name, data in found
        if name in events
    ]
    if not rows:
        return
    WebhookDelivery.objects.bulk_create(rows)
    ids = [str(row.delivery_id) for row in rows]
    transaction.on_commit(lambda: _send_later(ids), robust=True)


def _live_subscriptions(task: Task) -> list[tuple[int, list[str]]]:
    """The live subscriptions whose token's scope covers ``task``: (id, events), in id order. One query, compiled
    once per process (the ORM compiled it at every task's end: ~1.3 ms of CPU, against ~0.1 ms for this)."""
    sql, params = _live_subscriptions_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return [
        (pk, _json_list(events))
        for pk, events, kinds, projects in found
        if scope_covers(_json_list(kinds), _json_list(projects), task)
    ]


@cache
def _live_subscriptions_sql() -> tuple[str, tuple[Any, ...]]:
    query = (
        WebhookSubscription.objects.filter(deleted_at__isnull=True, token__revoked_at__isnull=True)
        .order_by("pk")
        .values_list("pk", "events", "token__kinds", "token__projects")
        .query
    )
    sql, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    return sql, tuple(params)


def _json_list(value: Any) -> list[str]:
    """A JSON list column as a raw cursor gives it: text (Django reads JSON as text on every backend) or a list."""
    return list(json.loads(value) if isinstance(value, str | bytes) else value)


def _send_later(delivery_ids: Iterable[str]) -> None:
    for delivery_id in delivery_ids:
        enqueue_delivery(delivery_id)


# --- sending ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """What one call of ``deliver`` did: ``skipped`` when it could not claim the delivery (already delivered, given
    up, not due yet, or another worker sending it); ``retry_at`` when it is to be tried again."""

    outcome: Literal["delivered", "retry", "dead", "skipped"]
    retry_at: datetime | None = None
    status_code: int | None = None


def delivery_body(delivery: WebhookDelivery) -> bytes:
    """The exact bytes sent (and signed): the same for every attempt of a delivery."""
    body = {
        "delivery_id": str(delivery.delivery_id),
        "event": delivery.event,
        "task_id": delivery.task_id,
        "task_version": delivery.task_version,
        "occurred_at": clock.as_utc(delivery.occurred_at).isoformat(),
        "data": delivery.payload,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def delivery_headers(delivery: WebhookDelivery, secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": "Reckon-Webhooks/1",
        signing.HEADER_DELIVERY: str(delivery.delivery_id),
        signing.HEADER_EVENT: delivery.event,
        signing.HEADER_TIMESTAMP: str(timestamp),
        signing.HEADER_SIGNATURE: signing.sign(secret, timestamp, body),
    }


def deliver(delivery_id: str | uuid.UUID) -> Attempt:
    """Send one delivery if it is due, and record the answer. Safe to call any number of times, from any number
    of workers: the claim (a conditional UPDATE that pushes ``next_attempt_at`` past the send) lets one caller
    through; the others are ``skipped``. Call it outside a transaction: the claim must be visible at once."""
    timeout: float = settings.RECKON_WEBHOOK_TIMEOUT_SECONDS
    now = clock.now()
    # A delivery never tried is due at once: it was made due at its event's time, a write time that may run ahead
    # of this reading by the estimate's error (leases/clock.py write_time), and the job sent on commit must not
    # find it "not due yet" and leave it to the sweep.
    due = Q(attempts=0) | Q(next_attempt_at__lte=now)
    claimed = WebhookDelivery.objects.filter(due, delivery_id=delivery_id, status=DeliveryStatus.PENDING).update(
        attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=4 * timeout) + CLAIM_MARGIN
    )
    if claimed != 1:
        return Attempt("skipped")
    delivery = WebhookDelivery.objects.select_related("subscription__token").get(delivery_id=delivery_id)
    subscription = delivery.subscription
    gone = (
        "the subscription was deleted"
        if subscription.deleted_at is not None
        else "the subscription's token was revoked"
        if subscription.token.revoked_at is not None
        else ""
    )
    if gone:
        _record(delivery, status=DeliveryStatus.DEAD, status_code=None, error=gone)
        return Attempt("dead")
    body = delivery_body(delivery)
    headers = delivery_headers(delivery, subscription.secret, body, int(clock.now().timestamp()))
    status_code, error, final = send(subscription.url, body, headers, timeout)
    if not error:
        _record(delivery, status=DeliveryStatus.DELIVERED, status_code=status_code, error="")
        outcome = Attempt("delivered", status_code=status_code)
    elif final or delivery.attempts >= settings.RECKON_WEBHOOK_MAX_ATTEMPTS:
        _record(delivery, status=DeliveryStatus.DEAD, status_code=status_code, error=error)
        outcome = Attempt("dead", status_code=status_code)
    else:
        retry_at = clock.now() + delivery_backoff(delivery.delivery_id, delivery.attempts)
        _record(delivery, status=DeliveryStatus.PENDING, status_code=status_code, error=error, retry_at=retry_at)
        outcome = Attempt("retry", retry_at=retry_at, status_code=status_code)
    # Never the URL, the headers or the body: the delivery's id says where to look.
    logger.info(
        "webhook delivery %s (%s) attempt %d: %s %s",
        delivery.delivery_id,
        delivery.event,
        delivery.attempts,
        outcome.outcome,
        status_code or error[:80],
    )
    return outcome


def _record(
    delivery: WebhookDelivery,
    *,
    status: DeliveryStatus,
    status_code: int | None,
    error: str,
    retry_at: datetime | None = None,
) -> None:
    """The answer of the attempt this caller claimed (``attempts`` as its claim left it): if the claim lapsed and
    another worker claimed it since, that worker's answer is the one kept."""
    fields: dict[str, Any] = {"status": status, "last_status_code": status_code, "last_error": error[:ERROR_MAX]}
    if status == DeliveryStatus.DELIVERED:
        fields["delivered_at"] = clock.now()
    if retry_at is not None:
        fields["next_attempt_at"] = retry_at
    WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING, attempts=delivery.attempts).update(
        **fields
    )


def delivery_backoff(delivery_id: uuid.UUID | str, attempt: int) -> timedelta:
    """base * 2^(attempt-1), capped, ±25% jitter drawn from the delivery and the attempt: receivers that were down
    together are not hit together when they come back, and a test can predict the delay."""
    base: timedelta = settings.RECKON_WEBHOOK_BACKOFF_BASE
    cap: timedelta = settings.RECKON_WEBHOOK_BACKOFF_CAP
    raw = min(cap.total_seconds(), base.total_seconds() * 2 ** max(attempt - 1, 0))
    seed = int.from_bytes(hashlib.sha256(f"{delivery_id}:{attempt}".encode()).digest()[:8])
    return timedelta(seconds=raw * random.Random(seed).uniform(0.75, 1.25))  # noqa: S311 (spread, not secrecy)


def send(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str, bool]:
    """POST ``body`` to ``url``: (the status code, why it failed or "", whether that is final). The host is read as
    at subscription, resolved once, every address checked (hooks/targets.py); the connection goes to the checked
    address itself, the name carried in Host (and SNI, whose name the certificate is verified against), so nothing
    resolves the name again between the check and the connect. A redirect is not followed: a failed attempt.

    Final: the URL itself can never be sent to (a literal refused address; a row from before these checks). A name
    refused, or not resolving, is tried again: what it resolves to may change."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port or (443 if scheme == "https" else 80)
        host = targets.canonical_host(parts.hostname or "")
        addresses = targets.pinned_addresses(host, port)
    except targets.TargetRefused as refused:
        return None, f"refused: {refused}", host_is_literal(urlsplit(url).hostname)
    except ValueError as invalid:
        return None, f"refused: not a valid URL ({invalid})", True
    except targets.Unresolved as unresolved:
        return None, f"ConnectError: {unresolved}", False
    address = addresses[0]
    connect_host = f"[{address}]" if address.version == 6 else str(address)
    target = urlunsplit((scheme, f"{connect_host}:{port}", parts.path or "/", parts.query, ""))
    default_port = parts.port is None or parts.port == (443 if scheme == "https" else 80)
    sent_headers = {**headers, "Host": host.netloc_host + ("" if default_port else f":{port}")}
    extensions = {"sni_hostname": host.name} if scheme == "https" and host.address is None else {}
    try:
        # Streamed and closed unread: only the status matters, and a receiver cannot make a worker read a large body.
        with (
            httpx.Client(timeout=timeout, follow_redirects=False) as client,
            client.stream("POST", target, content=body, headers=sent_headers, extensions=extensions) as response,
        ):
            status_code = response.status_code
    except httpx.HTTPError as failure:  # refused, timed out, reset, a bad TLS certificate, …
        return None, f"{type(failure).__name__}: {failure}", False
    if 200 <= status_code < 300:
        return status_code, "", False
    if 300 <= status_code < 400:
        return status_code, f"answered HTTP {status_code}: a redirect, not followed", False
    return status_code, f"answered HTTP {status_code}", False


def host_is_literal(hostname: str | None) -> bool:
    try:
        return targets.canonical_host(hostname or "").address is not None
    except targets.TargetRefused:
        return True


def deliveries_due(*, limit: int = 500) -> list[str]:
    """The pending deliveries whose time has come, oldest first (the sweep sends them): the index on
    (status, next_attempt_at) answers it. A delivery being sent is not due (its claim pushed it on)."""
    ids = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=clock.now()).order_by(
        "next_attempt_at"
    )
    return [str(i) for i in ids.values_list("delivery_id", flat=True)[:limit]]


def deliveries_expire(*, limit: int = 1000) -> int:
    """Delete up to ``limit`` deliveries delivered or given up more than RECKON_WEBHOOK_KEEP_DAYS ago (the sweep):
    the outbox keeps what is still to send and a week of history, not every event for ever. Returns how many."""
    keep = timedelta(days=settings.RECKON_WEBHOOK_KEEP_DAYS)
    old = WebhookDelivery.objects.filter(
        status__in=[DeliveryStatus.DELIVERED, DeliveryStatus.DEAD], created_at__lte=clock.now() - keep
    )
    pks = list(old.order_by("pk").values_list("pk", flat=True)[:limit])
    deleted, _ = WebhookDelivery.objects.filter(pk__in=pks).delete()
    return deleted


def enqueue_delivery(delivery_id: str, *, countdown: float = 0.0, queue: str = "") -> None:
    """Ask a worker to send the delivery (after ``countdown`` seconds, on ``queue`` or the webhook queue)."""
    queue = queue or settings.RECKON_WEBHOOK_QUEUE
    options: dict[str, Any] = {"countdown": countdown} if countdown else {}
    if queue:
        options["queue"] = queue
    # Named, not imported: the job (hooks/jobs.py) sits above the services it calls.
    send_job("hooks.deliver", delivery_id, **options)
