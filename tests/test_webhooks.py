"""Webhooks: signed deliveries of task events to an agent's URL, from an outbox written with the change.

The signature is checked here by an HMAC written in the test (hmac/hashlib, not hooks/signing.py); deliveries go
to a real HTTP receiver (http.server in a thread) that can fail on purpose. Each test tries to break a rule: a
rolled-back change must send nothing, a failing receiver must get the delivery once it answers 2xx and never
again, a token out of scope or revoked must get nothing, another agent must not see or delete a subscription,
refused requests must write nothing."""

import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import DjangoCaptureOnCommitCallbacks, Settings

from api.models import ApiToken
from api.tokens import api_token_issue, api_token_revoke
from audit.models import AuditEvent
from audit.principals import Principal
from hooks import services
from hooks.errors import WebhookEventsInvalid, WebhookLimitReached, WebhookNotFound, WebhookUrlInvalid
from hooks.jobs import sweep
from hooks.models import WEBHOOK_EVENTS, DeliveryStatus, WebhookDelivery, WebhookSubscription
from hooks.services import deliver, webhook_list, webhook_subscribe, webhook_unsubscribe
from leases.clock import ControllableClock
from tasks.engine.events import event_appended
from tasks.models import Event, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import lease_force_release
from tasks.people.takeover import NodeResult, takeover_claim, takeover_submit
from tests.conftest import chain_plan, person
from tests.workers import celery_worker

pytestmark = pytest.mark.django_db

CREATOR = Principal.agent("tester")  # make_task's tasks are created by agent:tester: it may cancel them
JUSTIFICATION = "the agent's host is gone and its lease blocks the migration"
IMPACT = "the open copy will be reconciled by the next holder of the task"


# --- a receiver, and an HMAC of the test's own --------------------------------------------------------------------


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Settings) -> None:
    """The receivers here listen on 127.0.0.1, which deliveries never reach by default (hooks/targets.py): these
    tests open exactly that address, as a demo would. tests/test_webhook_targets.py tests the default."""
    settings.RECKON_WEBHOOK_ALLOW_NETWORKS = "127.0.0.1/32"


class Receiver:
    """An HTTP endpoint on a free loopback port: records every POST (headers, raw body) and answers ``fail_status``
    to the first ``fail_first`` of them, 200 afterwards."""

    def __init__(self, fail_first: int = 0, fail_status: int = 500, delay: float = 0.0) -> None:
        self.fail_first, self.fail_status, self.delay = fail_first, fail_status, delay
        self.received: list[tuple[dict[str, str], bytes, int]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                time.sleep(receiver.delay)  # a slow receiver: the send is in flight meanwhile
                with receiver._lock:
                    status = receiver.fail_status if len(receiver.received) < receiver.fail_first else 200
                    receiver.received.append((dict(self.headers.items()), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/reckon/hooks"

    def accepted(self) -> list[dict[str, Any]]:
        """The bodies answered 2xx, parsed."""
        with self._lock:
            return [json.loads(body) for _h, body, status in self.received if 200 <= status < 300]

    def by_delivery(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for _h, body, _s in self.received:
                key = json.loads(body)["delivery_id"]
                counts[key] = counts.get(key, 0) + 1
        return counts


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(fail_first: int = 0, fail_status: int = 500, delay: float = 0.0) -> Receiver:
        made = Receiver(fail_first, fail_status, delay)
        made.thread.start()
        started.append(made)
        return made

    yield start
    for made in started:
        made.server.shutdown()
        made.server.server_close()


def independent_signature_ok(secret: str, headers: dict[str, str], body: bytes, now: float) -> bool:
    """The verification docs/api.md asks of receivers, written from the text, not from hooks/signing.py."""
    timestamp = headers["Reckon-Timestamp"]
    if abs(now - int(timestamp)) > 300:
        return False
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest("v1=" + mac, part.strip()) for part in headers["Reckon-Signature"].split(","))


# --- tokens and subscriptions -------------------------------------------------------------------------------------


@pytest.fixture
def admin() -> Principal:
    return person("root", "admin")


@pytest.fixture
def issue(admin: Principal) -> Callable[..., tuple[ApiToken, str]]:
    def make(kinds: tuple[str, ...] = ("test",), projects: tuple[str, ...] = (), agent: str = "agent-7") -> Any:
        return api_token_issue(actor=admin, agent_id=agent, kinds=kinds, projects=projects)

    return make


def bearer(token: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def hooks_rows() -> dict[str, list[tuple[Any, ...]]]:
    return {
        "subscriptions": list(WebhookSubscription.objects.order_by("pk").values_list()),
        "deliveries": list(WebhookDelivery.objects.order_by("pk").values_list()),
        "audit": list(AuditEvent.objects.order_by("seq").values_list("seq", "action")),
    }


def cancel(task: Task, reason: str = "the customer withdrew the order") -> Task:
    return task_request_cancel(actor=CREATOR, task_id=task.pk, reason=reason)


def only_delivery(**filters: Any) -> WebhookDelivery:
    rows = list(WebhookDelivery.objects.filter(**filters))
    assert len(rows) == 1, rows
    return rows[0]


# --- signatures and what a delivery carries ----------------------------------------------------------------------


def test_a_delivery_is_signed_as_documented_and_verified_by_an_independent_hmac(
    make_task, issue, receiver: Callable[..., Receiver]
) -> None:
    token, _plaintext = issue()
    hook = receiver()
    subscription, secret = webhook_subscribe(token, hook.url, ["cancel_requested"])
    task = make_task(chain_plan("a", "b"))
    cancel(task)
    delivery = only_delivery(subscription=subscription)
    assert deliver(delivery.delivery_id).outcome == "delivered"

    [(headers, body, status)] = hook.received
    assert status == 200
    assert independent_signature_ok(secret, headers, body, now=time.time())
    sent = json.loads(body)
    assert set(sent) == {"delivery_id", "event", "task_id", "task_version", "occurred_at", "data"}
    assert sent["delivery_id"] == headers["Reckon-Delivery"] == str(delivery.delivery_id)
    assert sent["event"] == headers["Reckon-Event"] == "cancel_requested"
    assert sent["task_id"] == task.pk
    assert sent["task_version"] == Event.objects.get(task=task, type="cancel_requested").seq
    assert sent["data"]["reason"] == "the customer withdrew the order" and sent["data"]["by"] == "agent:tester"
    assert headers["Content-Type"] == "application/json"

    # A changed byte, another secret or an old timestamp is refused by the same independent check.
    assert not independent_signature_ok(secret, headers, body.replace(b"withdrew", b"withdrow"), now=time.time())
    assert not independent_signature_ok("whsec_another", headers, body, now=time.time())
    assert not independent_signature_ok(secret, headers, body, now=time.time() + 301)
    # hooks.signing agrees with the independent implementation.
    from hooks.signing import verify

    assert verify(
        secret, timestamp=headers["Reckon-Timestamp"], body=body, signature=headers["Reckon-Signature"], now=time.time()
    )
    assert not verify(
        secret,
        timestamp=headers["Reckon-Timestamp"],
        body=body + b" ",
        signature=headers["Reckon-Signature"],
        now=time.time(),
    )


def test_no_secret_travels_in_a_delivery(make_task, issue, receiver: Callable[..., Receiver]) -> None:
    token, plaintext = issue()
    hook = receiver()
    subscription, secret = webhook_subscribe(token, hook.url, list(WEBHOOK_EVENTS))
    task = make_task(chain_plan("a"))
    cancel(task)  # nothing in flight: cancel_requested and task_finished (stopped)
    for delivery in WebhookDelivery.objects.filter(subscription=subscription):
        assert deliver(delivery.delivery_id).outcome == "delivered"
    assert sorted(json.loads(body)["event"] for _h, body, _s in hook.received) == ["cancel_requested", "task_finished"]
    for headers, body, _status in hook.received:
        everything = body.decode() + "\n".join(f"{k}: {v}" for k, v in headers.items())
        assert secret not in everything and secret.removeprefix("whsec_") not in everything
        assert plaintext not in everything and token.token_hash not in everything
        assert "Authorization" not in headers
    # Nor in what the database keeps of the delivery.
    for row in WebhookDelivery.objects.values_list("payload", "last_error"):
        assert secret not in json.dumps(row)


# --- retries, backoff, exactly one success -----------------------------------------------------------------------


def test_a_failing_receiver_is_retried_with_growing_backoff_and_gets_the_delivery_once(
    make_task, issue, receiver: Callable[..., Receiver], clock: ControllableClock, settings: Settings
) -> None:
    settings.RECKON_WEBHOOK_BACKOFF_BASE = timedelta(seconds=60)
    token, _ = issue()
    hook = receiver(fail_first=2)
    subscription, secret = webhook_subscribe(token, hook.url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    delivery_id = only_delivery(subscription=subscription).delivery_id

    first = deliver(delivery_id)
    assert first.outcome == "retry" and first.status_code == 500 and first.retry_at is not None
    first_delay = first.retry_at - clock.now()
    assert timedelta(seconds=45) <= first_delay <= timedelta(seconds=75)  # 60 s ± 25%
    # Not due yet: a duplicate message, or the sweep, sends nothing.
    assert deliver(delivery_id).outcome == "skipped"
    assert services.deliveries_due() == []
    assert len(hook.received) == 1

    clock.advance(first_delay)
    assert services.deliveries_due() == [str(delivery_id)]
    second = deliver(delivery_id)
    assert second.outcome == "retry" and second.retry_at is not None
    second_delay = second.retry_at - clock.now()
    assert timedelta(seconds=90) <= second_delay <= timedelta(seconds=150)  # 120 s ± 25%: longer than the first

    clock.advance(second_delay)
    assert deliver(delivery_id).outcome == "delivered"
    for _ in range(3):  # redelivered messages, sweeps, a day later: nothing more is sent
        assert deliver(delivery_id).outcome == "skipped"
        clock.advance(timedelta(hours=8))
    assert services.deliveries_due() == []

    assert hook.by_delivery() == {str(delivery_id): 3}  # two failures, then one success
    assert [b["delivery_id"] for b in hook.accepted()] == [str(delivery_id)]
    stamps = [int(h["Reckon-Timestamp"]) for h, _b, _s in hook.received]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3  # each attempt signed when it was sent
    assert all(independent_signature_ok(secret, h, b, now=int(h["Reckon-Timestamp"])) for h, b, _s in hook.received)
    row = WebhookDelivery.objects.get(delivery_id=delivery_id)
    assert (row.status, row.attempts, row.last_status_code) == (DeliveryStatus.DELIVERED, 3, 200)
    assert row.delivered_at is not None and row.last_error == ""


def test_a_delivery_is_given_up_after_the_maximum_attempts(
    make_task, issue, receiver: Callable[..., Receiver], clock: ControllableClock, settings: Settings
) -> None:
    settings.RECKON_WEBHOOK_MAX_ATTEMPTS = 3
    token, _ = issue()
    hook = receiver(fail_first=100, fail_status=503)
    subscription, _secret = webhook_subscribe(token, hook.url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    delivery_id = only_delivery(subscription=subscription).delivery_id
    outcomes = []
    for _ in range(5):
        outcomes.append(deliver(delivery_id).outcome)
        clock.advance(timedelta(days=1))
    assert outcomes == ["retry", "retry", "dead", "skipped", "skipped"]
    row = WebhookDelivery.objects.get(delivery_id=delivery_id)
    assert (row.status, row.attempts, row.last_status_code, row.delivered_at) == (DeliveryStatus.DEAD, 3, 503, None)
    assert len(hook.received) == 3


def test_an_unreachable_receiver_is_a_failed_attempt_not_an_error(
    make_task, issue, clock: ControllableClock, settings: Settings
) -> None:
    settings.RECKON_WEBHOOK_TIMEOUT_SECONDS = 1.0
    token, _ = issue()
    subscription, _ = webhook_subscribe(token, "http://127.0.0.1:9/nobody-listens", ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    attempt = deliver(only_delivery(subscription=subscription).delivery_id)
    assert attempt.outcome == "retry" and attempt.status_code is None
    row = only_delivery(subscription=subscription)
    assert row.status == DeliveryStatus.PENDING and row.attempts == 1 and row.last_error.startswith("Connect")


def test_a_delivery_being_sent_is_claimed_so_a_second_worker_sends_nothing(
    make_task, issue, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    token, _ = issue()
    hook = receiver()
    subscription, _ = webhook_subscribe(token, hook.url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    delivery_id = only_delivery(subscription=subscription).delivery_id
    during: list[str] = []
    real_send = services.send

    def post_while_another_worker_tries(*args: Any, **kwargs: Any) -> Any:
        during.append(deliver(delivery_id).outcome)  # a second worker, while the first one is sending
        return real_send(*args, **kwargs)

    monkeypatch.setattr(services, "send", post_while_another_worker_tries)
    assert deliver(delivery_id).outcome == "delivered"
    assert during == ["skipped"]
    assert hook.by_delivery() == {str(delivery_id): 1}


def test_a_denied_network_is_never_called(
    make_task, issue, receiver: Callable[..., Receiver], settings: Settings
) -> None:
    token, _ = issue()
    with pytest.raises(WebhookUrlInvalid, match=r"169\.254\.169\.254 is a cloud metadata service"):
        webhook_subscribe(token, "http://169.254.169.254/latest/meta-data/", ["cancel_requested"])
    hook = receiver()
    subscription, _ = webhook_subscribe(token, hook.url, ["cancel_requested"])
    settings.RECKON_WEBHOOK_DENY_NETWORKS = "127.0.0.0/8"  # loopback denied after the subscription was made
    cancel(make_task(chain_plan("a")))
    attempt = deliver(only_delivery(subscription=subscription).delivery_id)
    # A literal address refused: it never will be sent to, so the delivery is given up at once.
    assert attempt.outcome == "dead" and attempt.status_code is None
    assert only_delivery(subscription=subscription).last_error == (
        "refused: 127.0.0.1 is in RECKON_WEBHOOK_DENY_NETWORKS"
    )
    assert hook.received == []


def test_settled_deliveries_are_forgotten_after_the_keep_days_and_pending_ones_never(
    make_task, issue, receiver: Callable[..., Receiver], clock: ControllableClock, settings: Settings
) -> None:
    settings.RECKON_WEBHOOK_KEEP_DAYS = 7
    token, _ = issue()
    delivered_to = receiver()
    subscription, _ = webhook_subscribe(token, delivered_to.url, ["cancel_requested"])
    failing, _ = webhook_subscribe(token, receiver(fail_first=100).url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    for delivery in WebhookDelivery.objects.all():
        deliver(delivery.delivery_id)
    clock.advance(timedelta(days=6))
    assert services.deliveries_expire() == 0
    clock.advance(timedelta(days=2))
    assert services.deliveries_expire() == 1
    assert list(WebhookDelivery.objects.values_list("subscription", "status")) == [(failing.pk, "pending")]
    assert not WebhookDelivery.objects.filter(subscription=subscription).exists()


# --- the outbox: the change's transaction ------------------------------------------------------------------------


def test_the_outbox_row_is_written_in_the_changes_transaction_and_sent_only_after_commit(
    make_task, issue, django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks
) -> None:
    token, _ = issue()
    subscription, _ = webhook_subscribe(token, "https://agent.example/hooks", ["cancel_requested"])
    task = make_task(chain_plan("a"))

    class Abandon(Exception):
        pass

    with django_capture_on_commit_callbacks() as sent_on_commit, pytest.raises(Abandon), transaction.atomic():
        cancel(task)
        assert WebhookDelivery.objects.filter(subscription=subscription).count() == 1  # inside: written
        raise Abandon
    assert not WebhookDelivery.objects.exists()
    assert Task.objects.get(pk=task.pk).cancel_requested_at is None
    assert sent_on_commit == []  # a rolled-back change asks for no send

    with django_capture_on_commit_callbacks() as sent_on_commit:
        cancel(task)
        cancel(task)  # asking twice changes nothing: no second event, no second delivery
    delivery = only_delivery(subscription=subscription)
    assert delivery.event == "cancel_requested" and delivery.status == DeliveryStatus.PENDING
    assert delivery.task_version == Event.objects.get(task=task, type="cancel_requested").seq
    assert len(sent_on_commit) == 1


def test_an_event_nobody_maps_costs_no_query_and_a_mapped_one_with_no_subscriber_costs_one(make_task) -> None:
    """Through tasks.engine.events.event_appended, as every path that appends an event calls it: the step's events
    (operations, nodes) do not reach the outbox at all."""
    task = make_task(chain_plan("a"))
    for step_type in ("operation_dispatched", "node_succeeded", "operation_accepted", "inputs_confirmed"):
        step = Event(task_id=task.pk, seq=9, type=step_type, payload={"nodes": {"p1/a": {"status": "succeeded"}}})
        with CaptureQueriesContext(connection) as queries:
            event_appended(task, step)
        assert len(queries) == 0, step_type
    for mapped in (
        Event(task_id=task.pk, seq=9, type="cancel_requested", payload={"task": {"cancel_reason": "x"}}),
        Event(task_id=task.pk, seq=9, type="node_succeeded", payload={"task": {"status": "completed"}}),
    ):
        with CaptureQueriesContext(connection) as queries:
            event_appended(task, mapped)
        assert len(queries) == 1
    assert not WebhookDelivery.objects.exists()


# --- who receives what -------------------------------------------------------------------------------------------


def test_a_token_out_of_scope_gets_nothing(make_task, issue) -> None:
    in_scope, _ = issue(kinds=("test",), agent="agent-in")
    by_project, _ = issue(kinds=("other",), projects=("acme",), agent="agent-project")
    out_of_scope, _ = issue(kinds=("other",), projects=("globex",), agent="agent-out")
    subs = {
        name: webhook_subscribe(token, f"https://{name}.example/h", list(WEBHOOK_EVENTS))[0]
        for name, token in (("in", in_scope), ("project", by_project), ("out", out_of_scope))
    }
    cancel(make_task(chain_plan("a"), project="acme"))
    events = {
        name: sorted(WebhookDelivery.objects.filter(subscription=s).values_list("event", flat=True))
        for name, s in subs.items()
    }
    assert events == {
        "in": ["cancel_requested", "task_finished"],
        "project": ["cancel_requested", "task_finished"],
        "out": [],
    }


def test_a_revoked_tokens_subscription_gets_nothing_not_even_what_was_pending(
    make_task, issue, admin: Principal, receiver: Callable[..., Receiver]
) -> None:
    token, _ = issue()
    hook = receiver()
    subscription, _ = webhook_subscribe(token, hook.url, list(WEBHOOK_EVENTS))
    first = make_task(chain_plan("a"))
    cancel(first)
    pending = list(WebhookDelivery.objects.filter(subscription=subscription))
    assert len(pending) == 2
    api_token_revoke(actor=admin, token_id=token.pk, reason="the agent's host was retired")
    cancel(make_task(chain_plan("a")))
    assert WebhookDelivery.objects.filter(subscription=subscription).count() == 2  # nothing new
    for delivery in pending:
        assert deliver(delivery.delivery_id).outcome == "dead"
    assert hook.received == []
    assert set(WebhookDelivery.objects.values_list("status", "last_error")) == {
        (DeliveryStatus.DEAD, "the subscription's token was revoked")
    }


def test_a_deleted_subscription_gets_nothing_more(make_task, issue, receiver: Callable[..., Receiver]) -> None:
    token, _ = issue()
    hook = receiver()
    subscription, _ = webhook_subscribe(token, hook.url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    pending = only_delivery(subscription=subscription)
    webhook_unsubscribe(token, subscription.pk)
    cancel(make_task(chain_plan("a")))
    assert deliver(pending.delivery_id).outcome == "dead"
    assert hook.received == [] and WebhookDelivery.objects.count() == 1
    with pytest.raises(WebhookNotFound):
        webhook_unsubscribe(token, subscription.pk)  # deleting twice: not found


def test_each_webhook_event_from_the_services_that_record_it(make_task, issue, agent_lease) -> None:
    token, _ = issue()
    subscription, _ = webhook_subscribe(token, "https://agent.example/h", list(WEBHOOK_EVENTS))
    ann, root = person("ann", "admin"), person("boss", "admin")

    def events_of(task: Task) -> list[tuple[str, dict[str, Any]]]:
        rows = WebhookDelivery.objects.filter(subscription=subscription, task_id=task.pk).order_by("task_version", "pk")
        return [(d.event, d.payload) for d in rows]

    resumed = make_task(chain_plan("a", "b"))
    lease = takeover_claim(actor=ann, task_id=resumed.pk).lease
    assert lease is not None
    takeover_submit(
        actor=ann,
        lease=lease,
        based_on_version=Task.objects.get(pk=resumed.pk).version,
        decision="resume_agent",
        results=[NodeResult(node_key="a", remote_id="r-a")],
        note="copied by hand, checked the counts",
    )
    [(started, started_data), (name, data)] = events_of(resumed)
    assert (started, started_data) == ("takeover_started", {"operator": ann.id})
    assert name == "task_resumed" and data["decision"] == "resume_agent" and data["operator"] == ann.id
    assert data["nodes"] == ["a"] and [r["remote_id"] for r in data["receipts"].values()] == ["r-a"]

    replanned = make_task(chain_plan("a"))
    lease = takeover_claim(actor=ann, task_id=replanned.pk).lease
    assert lease is not None
    takeover_submit(
        actor=ann,
        lease=lease,
        based_on_version=Task.objects.get(pk=replanned.pk).version,
        decision="replan",
        replan_reason="the source moved to another bucket",
    )
    assert events_of(replanned)[1] == (
        "replan_requested",
        {"decision": "replan", "operator": ann.id, "reason": "the source moved to another bucket"},
    )

    ended = make_task(chain_plan("a"))
    lease = takeover_claim(actor=ann, task_id=ended.pk).lease
    assert lease is not None
    takeover_submit(
        actor=ann,
        lease=lease,
        based_on_version=Task.objects.get(pk=ended.pk).version,
        decision="end_task",
        end_status="completed",
        results=[NodeResult(node_key="a", remote_id="r-a")],
    )
    assert [(e, d.get("status")) for e, d in events_of(ended)] == [
        ("takeover_started", None),
        ("task_finished", "completed"),
    ]

    forced = make_task(chain_plan("a"))
    held = agent_lease(forced, holder="agent-7")
    lease_force_release(actor=root, task_id=forced.pk, justification=JUSTIFICATION, impact=IMPACT)
    assert events_of(forced) == [
        ("lease_force_released", {"holder": "agent:agent-7", "epoch": held.epoch, "by": str(root)})
    ]


def test_a_subscription_receives_only_the_events_it_names(make_task, issue) -> None:
    token, _ = issue()
    finished_only, _ = webhook_subscribe(token, "https://agent.example/a", ["task_finished"])
    takeovers_only, _ = webhook_subscribe(token, "https://agent.example/b", ["takeover_started"])
    cancel(make_task(chain_plan("a")))
    assert list(WebhookDelivery.objects.values_list("subscription", "event")) == [(finished_only.pk, "task_finished")]
    assert not WebhookDelivery.objects.filter(subscription=takeovers_only).exists()


# --- the service's refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://agent.example/h",
        "javascript:alert(1)",
        "/relative/path",
        "https://",
        "https://user:hunter2@agent.example/h",
        "https://user@agent.example/h",
        "https://agent.example/h?token=abc123",
        "https://agent.example/h?api_key=abc123",
        "https://agent.example/h with space",
        "https://agent.example:99999/h",
        "https://agent.example/" + "x" * 2000,
    ],
)
def test_an_invalid_url_is_refused_and_writes_nothing(issue, url: str) -> None:
    token, _ = issue()
    before = hooks_rows()
    with pytest.raises(WebhookUrlInvalid):
        webhook_subscribe(token, url, ["cancel_requested"])
    assert hooks_rows() == before


@pytest.mark.parametrize("events", [[], ["cancel_requested", "task_started"], ["*"], "cancel_requested"])
def test_invalid_events_are_refused_and_write_nothing(issue, events: Any) -> None:
    token, _ = issue()
    before = hooks_rows()
    with pytest.raises(WebhookEventsInvalid):
        webhook_subscribe(token, "https://agent.example/h", events)
    assert hooks_rows() == before


def test_an_agent_has_a_bounded_number_of_subscriptions(issue, settings: Settings) -> None:
    settings.RECKON_WEBHOOK_MAX_SUBSCRIPTIONS = 2
    token, _ = issue()
    other, _ = issue(agent="agent-8")
    for n in range(2):
        webhook_subscribe(token, f"https://agent.example/{n}", ["cancel_requested"])
    before = hooks_rows()
    with pytest.raises(WebhookLimitReached):
        webhook_subscribe(token, "https://agent.example/3", ["cancel_requested"])
    assert hooks_rows() == before
    webhook_subscribe(other, "https://agent.example/other", ["cancel_requested"])  # per agent
    webhook_unsubscribe(token, webhook_list(token)[0].pk)
    webhook_subscribe(token, "https://agent.example/3", ["cancel_requested"])  # a deleted one frees a place


# --- the API ------------------------------------------------------------------------------------------------------


def test_the_secret_is_shown_once_on_creation_and_never_listed(client: Client, issue) -> None:
    _token, plaintext = issue()
    created = client.post(
        "/api/v1/webhooks",
        {"url": "https://agent.example/h", "events": ["task_finished", "cancel_requested"]},
        content_type="application/json",
        **bearer(plaintext),
    )
    assert created.status_code == 201, created.content
    body = created.json()
    row = WebhookSubscription.objects.get()
    assert body["secret"] == row.secret and body["secret"].startswith("whsec_")
    assert body["id"] == row.pk and body["events"] == ["cancel_requested", "task_finished"] and body["active"]
    assert created["Location"] == f"/api/v1/webhooks/{row.pk}"
    listed = client.get("/api/v1/webhooks", **bearer(plaintext))
    assert listed.status_code == 200
    [item] = listed.json()
    assert "secret" not in item and row.secret not in listed.content.decode()
    assert item["id"] == row.pk and item["url"] == "https://agent.example/h"
    audit = AuditEvent.objects.get(action="webhook_subscribed")
    assert audit.actor_kind == "agent" and audit.actor_id == "agent-7" and row.secret not in json.dumps(audit.details)


def test_another_agent_can_neither_see_nor_delete_a_subscription(client: Client, issue) -> None:
    _a, mine = issue(agent="agent-7")
    _b, theirs = issue(agent="agent-8")
    created = client.post(
        "/api/v1/webhooks",
        {"url": "https://agent.example/h", "events": ["cancel_requested"]},
        content_type="application/json",
        **bearer(mine),
    ).json()
    assert client.get("/api/v1/webhooks", **bearer(theirs)).json() == []
    before = hooks_rows()
    refused = client.delete(f"/api/v1/webhooks/{created['id']}", **bearer(theirs))
    missing = client.delete("/api/v1/webhooks/999999", **bearer(theirs))
    assert refused.status_code == missing.status_code == 404
    assert refused.json()["code"] == "webhook_not_found"
    assert refused.json()["detail"].replace(str(created["id"]), "X") == missing.json()["detail"].replace("999999", "X")
    assert hooks_rows() == before
    assert client.delete(f"/api/v1/webhooks/{created['id']}", **bearer(mine)).status_code == 204
    assert client.get("/api/v1/webhooks", **bearer(mine)).json() == []
    assert WebhookSubscription.objects.get().deleted_at is not None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"url": "ftp://agent.example/h", "events": ["cancel_requested"]}, "webhook_url_invalid"),
        ({"url": "https://u:p@agent.example/h", "events": ["cancel_requested"]}, "webhook_url_invalid"),
        ({"url": "https://agent.example/h", "events": ["everything"]}, "webhook_events_invalid"),
        ({"url": "https://agent.example/h", "events": []}, "validation_error"),
        ({"url": "https://agent.example/h"}, "validation_error"),
        ({"events": ["cancel_requested"]}, "validation_error"),
    ],
)
def test_refused_subscriptions_answer_422_and_write_nothing(client: Client, issue, body: Any, code: str) -> None:
    _token, plaintext = issue()
    before = hooks_rows()
    response = client.post("/api/v1/webhooks", body, content_type="application/json", **bearer(plaintext))
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/problem+json" and response.json()["code"] == code
    assert hooks_rows() == before


def test_webhooks_need_a_live_token(client: Client, issue, admin: Principal) -> None:
    token, plaintext = issue()
    webhook_subscribe(token, "https://agent.example/h", ["cancel_requested"])
    api_token_revoke(actor=admin, token_id=token.pk, reason="rotated")
    before = hooks_rows()
    for response in (
        client.get("/api/v1/webhooks"),
        client.get("/api/v1/webhooks", **bearer(plaintext)),
        client.post(
            "/api/v1/webhooks",
            {"url": "https://a.example/h", "events": ["cancel_requested"]},
            content_type="application/json",
            **bearer(plaintext),
        ),
        client.delete(f"/api/v1/webhooks/{WebhookSubscription.objects.get().pk}", **bearer(plaintext)),
    ):
        assert response.status_code == 401
    assert hooks_rows() == before


def test_the_webhook_operations_are_in_the_openapi_document(client: Client) -> None:
    document = client.get("/api/v1/openapi.json").json()
    assert {"post", "get"} <= set(document["paths"]["/api/v1/webhooks"])
    assert "delete" in document["paths"]["/api/v1/webhooks/{subscription_id}"]
    schemas = document["components"]["schemas"]
    assert "secret" in schemas["SubscriptionCreated"]["properties"]
    assert "secret" not in schemas["SubscriptionOut"]["properties"]


def test_a_new_subscription_with_an_idempotency_key_is_made_once(client: Client, issue) -> None:
    _token, plaintext = issue()
    key: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4())}
    body = {"url": "https://agent.example/h", "events": ["cancel_requested"]}
    first = client.post("/api/v1/webhooks", body, content_type="application/json", **bearer(plaintext), **key)
    again = client.post("/api/v1/webhooks", body, content_type="application/json", **bearer(plaintext), **key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert WebhookSubscription.objects.count() == 1


# --- a real Celery worker ----------------------------------------------------------------------------------------


def wait_until_delivered(count: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).count() >= count:
            return
        time.sleep(0.2)
    rows = list(WebhookDelivery.objects.values_list("event", "status", "attempts", "last_error"))
    raise AssertionError(f"not delivered in {seconds}s: {rows}")


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_delivers_after_commit_retries_a_failure_and_the_sweep_sends_a_lost_one(
    make_task, issue, receiver: Callable[..., Receiver], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the committed cancel asks for its deliveries on commit; the worker sends them, the receiver
    refuses the first POST, the worker asks for a retry after the (shortened) backoff and sends it again. Then a
    delivery whose message was lost is sent by the sweep."""
    monkeypatch.setenv("RECKON_WEBHOOK_BACKOFF_BASE_SECONDS", "0.5")  # the worker's backoff: half a second
    monkeypatch.setenv("RECKON_WEBHOOK_ALLOW_NETWORKS", "127.0.0.1/32")  # the worker's too: the receiver's address
    token, _ = issue()
    hook = receiver(fail_first=1)
    subscription, secret = webhook_subscribe(token, hook.url, ["cancel_requested", "task_finished"])
    with celery_worker("http://127.0.0.1:9") as queue:
        settings.RECKON_WEBHOOK_QUEUE = queue
        cancel(make_task(chain_plan("a")))  # committed: cancel_requested and task_finished (stopped)
        wait_until_delivered(2)
        counts = hook.by_delivery()
        assert sorted(counts.values()) == [1, 2]  # the refused one was sent again, once
        assert sorted(b["delivery_id"] for b in hook.accepted()) == sorted(counts)  # each accepted exactly once
        assert all(independent_signature_ok(secret, h, b, now=time.time()) for h, b, _s in hook.received)

        monkeypatch.setattr(services, "_send_later", lambda ids: None)  # the next change's message is lost
        cancel(make_task(chain_plan("a")))
        assert WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).count() == 2
        assert sweep(queue=queue) == 2
        wait_until_delivered(4)
    rows = list(WebhookDelivery.objects.filter(subscription=subscription).values_list("status", "attempts"))
    assert sorted(rows) == [("delivered", 1), ("delivered", 1), ("delivered", 1), ("delivered", 2)]
    assert len(hook.received) == 5 and len(hook.accepted()) == 4


@pytest.mark.django_db(transaction=True)
def test_workers_racing_for_one_delivery_send_it_once(make_task, issue, receiver: Callable[..., Receiver]) -> None:
    """Four threads (four database connections) call deliver at the same moment while the receiver is slow: the
    conditional UPDATE lets exactly one through."""
    token, _ = issue()
    hook = receiver(delay=0.5)
    subscription, _ = webhook_subscribe(token, hook.url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    delivery_id = only_delivery(subscription=subscription).delivery_id
    start = threading.Barrier(4)
    outcomes: list[str] = []

    def worker() -> None:
        try:
            start.wait()
            outcomes.append(deliver(delivery_id).outcome)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["delivered", "skipped", "skipped", "skipped"]
    assert hook.by_delivery() == {str(delivery_id): 1}
    assert only_delivery(subscription=subscription).attempts == 1


def test_the_first_job_sends_a_delivery_whose_event_time_ran_ahead_of_the_clock(
    make_task, issue, receiver: Callable[..., Receiver]
) -> None:
    """A delivery is made due at its event's write time, an estimate of the database clock that may run ahead of
    the next reading by that estimate's error (a slow round trip on a loaded machine): the job sent on commit must
    still send it, not find it "not due yet" and leave it to the next sweep. A delivery tried once stays held to its
    time."""
    token, _ = issue()
    hook = receiver(fail_first=1)
    subscription, _secret = webhook_subscribe(token, hook.url, ["cancel_requested"])
    cancel(make_task(chain_plan("a")))
    delivery = only_delivery(subscription=subscription)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=F("next_attempt_at") + timedelta(seconds=2))
    assert deliver(delivery.delivery_id).outcome == "retry"  # sent at once; the receiver failed it
    assert deliver(delivery.delivery_id).outcome == "skipped"  # its retry's time has not come
    assert len(hook.received) == 1
