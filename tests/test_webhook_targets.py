"""Webhooks that cannot be aimed inward (issue 25, point 3).

Every spelling of an inward address is refused at subscription (a named 422, nothing written), and again at
delivery, where the name is resolved once, every address checked, and the connection made to the checked address.
Names are resolved by a stub (``hooks.targets.resolve`` replaced): ``*.agent.example`` answer what the test says.
The receivers are real HTTP servers on 127.0.0.1; they prove the refusal's other half: nothing was received.
The settings are the production default (no RECKON_WEBHOOK_ALLOW_NETWORKS) unless a test opens 127.0.0.1 itself."""

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from hypothesis import given
from hypothesis import settings as settings_of_hypothesis
from hypothesis import strategies as st
from pytest_django.fixtures import Settings

from api.models import ApiToken
from api.tokens import api_token_issue
from audit.models import AuditEvent
from audit.principals import Principal
from hooks import services, targets
from hooks.errors import WebhookUrlInvalid
from hooks.models import DeliveryStatus, WebhookDelivery, WebhookSubscription
from hooks.services import deliver, webhook_subscribe
from leases import clock
from tasks.people.cancel import task_request_cancel
from tests.conftest import chain_plan, person

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"  # a globally routable address (the stub answers it; nothing connects to it)


# --- the resolver stub and a receiver -------------------------------------------------------------------------------


class Stub:
    """Answers for names: ``answers[name]`` is a list of addresses, or a list of lists (one per lookup, the last
    repeated). An unknown name does not resolve. Every lookup is recorded."""

    def __init__(self) -> None:
        self.answers: dict[str, list[Any]] = {}
        self.lookups: list[str] = []

    def __call__(self, name: str, port: int) -> list[str]:
        self.lookups.append(name)
        if name not in self.answers:
            raise OSError(-2, "Name or service not known")
        answers = self.answers[name]
        if answers and isinstance(answers[0], list):
            return list(answers[0] if len(answers) == 1 else answers.pop(0))
        return list(answers)


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Stub:
    settings.RECKON_WEBHOOK_ALLOW_NETWORKS = ""  # the production default, whatever the environment says
    settings.RECKON_WEBHOOK_DENY_NETWORKS = ""
    made = Stub()
    monkeypatch.setattr(targets, "resolve", made)
    return made


class Receiver:
    """A real HTTP server on 127.0.0.1: records every request's method, path and Host; answers ``status`` (and
    ``location``, for a redirect)."""

    def __init__(self, status: int = 200, location: str = "") -> None:
        self.received: list[tuple[str, str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.received.append(("POST", self.path, self.headers.get("Host", "")))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(status: int = 200, location: str = "") -> Receiver:
        started.append(Receiver(status, location))
        return started[-1]

    yield start
    for made in started:
        made.server.shutdown()
        made.server.server_close()


@pytest.fixture
def token() -> ApiToken:
    issued, _plaintext = api_token_issue(
        actor=person("root", "admin"), agent_id="agent-7", kinds=("test",), projects=()
    )
    return issued


def hooks_rows() -> dict[str, list[tuple[Any, ...]]]:
    return {
        "subscriptions": list(WebhookSubscription.objects.order_by("pk").values_list()),
        "deliveries": list(WebhookDelivery.objects.order_by("pk").values_list()),
        "audit": list(AuditEvent.objects.order_by("seq").values_list("seq", "action")),
    }


def one_delivery(make_task: Callable[..., Any], subscription: WebhookSubscription) -> WebhookDelivery:
    task_request_cancel(actor=Principal.agent("tester"), task_id=make_task(chain_plan("a")).pk, reason="withdrawn")
    rows = list(WebhookDelivery.objects.filter(subscription=subscription, event="cancel_requested"))
    assert len(rows) == 1
    return rows[0]


def stored(token: ApiToken, url: str) -> WebhookSubscription:
    """A subscription written as an older Reckon (or a raw INSERT) could have: no check of the URL."""
    return WebhookSubscription.objects.create(
        token=token, url=url, events=["cancel_requested"], secret="whsec_x", created_at=clock.now()
    )


# --- the table: refused at subscription, nothing written -------------------------------------------------------------

REFUSED = [
    # loopback, every spelling
    ("http://127.0.0.1/h", "127.0.0.1 is a loopback address"),
    ("http://127.0.0.2:8080/h", "127.0.0.2 is a loopback address"),
    ("http://127.1/h", "127.0.0.1 is a loopback address"),
    ("http://2130706433/h", "127.0.0.1 is a loopback address"),
    ("http://0177.0.0.1/h", "127.0.0.1 is a loopback address"),
    ("http://0x7f.1/h", "127.0.0.1 is a loopback address"),
    ("http://0x7F000001/h", "127.0.0.1 is a loopback address"),
    ("http://0x7f.0.0.1/h", "127.0.0.1 is a loopback address"),
    ("http://127.0.0.1./h", "127.0.0.1 is a loopback address"),
    ("http://[::1]/h", "::1 is a loopback address"),
    ("http://[0:0:0:0:0:0:0:1]/h", "::1 is a loopback address"),
    ("http://localhost/h", "localhost is a loopback name"),
    ("http://localhost./h", "localhost is a loopback name"),
    ("http://LOCALHOST/h", "localhost is a loopback name"),
    ("http://api.localhost/h", "api.localhost is a loopback name"),
    ("http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/h", "localhost is a loopback name"),  # full-width
    ("http://\uff11\uff12\uff17\u3002\uff10\u3002\uff10\u3002\uff11/h", "127.0.0.1 is a loopback address"),
    # IPv4-mapped and -compatible IPv6, both notations; 6to4 and NAT64 of loopback and of private addresses
    ("http://[::ffff:127.0.0.1]/h", "127.0.0.1 is a loopback address"),
    ("http://[::ffff:7f00:1]/h", "127.0.0.1 is a loopback address"),
    ("http://[0:0:0:0:0:ffff:7f00:0001]/h", "127.0.0.1 is a loopback address"),
    ("http://[::FFFF:127.0.0.1]:8000/h", "127.0.0.1 is a loopback address"),
    ("http://[::127.0.0.1]/h", "127.0.0.1 is a loopback address"),
    ("http://[::7f00:1]/h", "127.0.0.1 is a loopback address"),
    ("http://[::ffff:10.0.0.1]/h", "10.0.0.1 is a private address"),
    ("http://[::ffff:a9fe:a9fe]/h", "169.254.169.254 is a cloud metadata service"),
    ("http://[2002:7f00:1::]/h", "2002:7f00:1:: (it carries 127.0.0.1) is a loopback address"),
    ("http://[2002:c0a8:101::1]/h", "2002:c0a8:101::1 (it carries 192.168.1.1) is a private address"),
    ("http://[64:ff9b::a00:1]/h", "64:ff9b::a00:1 (it carries 10.0.0.1) is a private address"),
    # private, shared, link-local, the metadata service
    ("http://10.0.0.1/h", "10.0.0.1 is a private address"),
    ("http://172.16.5.4/h", "172.16.5.4 is a private address"),
    ("http://192.168.1.1/h", "192.168.1.1 is a private address"),
    ("http://3232235777/h", "192.168.1.1 is a private address"),
    ("http://100.64.0.1/h", "100.64.0.1 is a shared (CGNAT) address"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata service"),
    ("http://0xa9fea9fe/latest/meta-data/", "169.254.169.254 is a cloud metadata service"),
    ("http://169.254.1.1/h", "169.254.1.1 is a link-local address"),
    ("http://[fd00:ec2::254]/h", "fd00:ec2::254 is a cloud metadata service"),
    ("http://[fe80::1]/h", "fe80::1 is a link-local address"),
    ("http://[fc00::1]/h", "fc00::1 is a private address"),
    ("http://[fd12:3456::1]/h", "fd12:3456::1 is a private address"),
    # unspecified, multicast, broadcast, reserved, documentation
    ("http://0.0.0.0/h", "0.0.0.0 is the unspecified address"),
    ("http://0/h", "0.0.0.0 is the unspecified address"),
    ("http://[::]/h", ":: is the unspecified address"),
    ("http://224.0.0.1/h", "224.0.0.1 is a multicast address"),
    ("http://[ff02::1]/h", "ff02::1 is a multicast address"),
    ("http://255.255.255.255/h", "255.255.255.255 is the broadcast address"),
    ("http://240.0.0.1/h", "240.0.0.1 is a"),
    ("http://192.0.2.10/h", "192.0.2.10 is a"),
    # names that resolve inward (the stub), one of several answers inward, upper-case schemes
    ("https://inward.agent.example/h", "10.1.2.3 is a private address (inward.agent.example resolves to it)"),
    ("https://mixed.agent.example/h", "127.0.0.1 is a loopback address (mixed.agent.example resolves to it)"),
    ("https://mapped.agent.example/h", "127.0.0.1 is a loopback address (mapped.agent.example resolves to it)"),
    ("https://INWARD.agent.example./h", "10.1.2.3 is a private address (inward.agent.example resolves to it)"),
    ("HTTP://127.0.0.1/h", "127.0.0.1 is a loopback address"),
    ("HTTPS://[::FFFF:7F00:1]/h", "127.0.0.1 is a loopback address"),
]
INVALID = [
    "http://1.2.3.256/h",  # ends in a number, and is no address
    "http://hooks.123/h",
    "http://1.2.3.4.5/h",
    "http://0x100000000/h",
    "http://08.0.0.1/h",  # not octal
    "http://%31%32%37.0.0.1/h",  # percent-encoded 127.0.0.1
    "http://[fe80::1%25eth0]/h",  # a zone
    "http://a..b/h",
    "http://\u2488.example/h",  # NFKC makes a dot of it
]


def resolving(stub: Stub) -> None:
    stub.answers |= {
        "inward.agent.example": ["10.1.2.3"],
        "mixed.agent.example": [PUBLIC, "127.0.0.1"],
        "mapped.agent.example": ["::ffff:127.0.0.1"],
        "hooks.agent.example": [PUBLIC, "2606:4700::1111"],
    }


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_an_inward_url_is_refused_with_its_reason_and_writes_nothing(
    stub: Stub, token: ApiToken, url: str, why: str
) -> None:
    resolving(stub)
    before = hooks_rows()
    with pytest.raises(WebhookUrlInvalid, match="webhook deliveries are never sent there") as refused:
        webhook_subscribe(token, url, ["cancel_requested"])
    assert why in str(refused.value)
    assert hooks_rows() == before


@pytest.mark.parametrize("url", INVALID)
def test_a_host_that_is_neither_a_name_nor_an_address_is_refused(stub: Stub, token: ApiToken, url: str) -> None:
    before = hooks_rows()
    with pytest.raises(WebhookUrlInvalid):
        webhook_subscribe(token, url, ["cancel_requested"])
    assert hooks_rows() == before


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://hooks.agent.example/reckon?x=1", "https://hooks.agent.example/reckon?x=1"),
        ("HTTPS://Hooks.Agent.Example./Reckon", "https://hooks.agent.example/Reckon"),
        ("https://b\u00fccher.agent.example/h", "https://xn--bcher-kva.agent.example/h"),
        ("https://not-yet-in-dns.agent.example/h", "https://not-yet-in-dns.agent.example/h"),  # checked at delivery
        ("http://8.8.8.8:8080/h", "http://8.8.8.8:8080/h"),
        ("http://134744072/h", "http://8.8.8.8/h"),  # 8.8.8.8 in decimal, stored as it is connected to
        ("http://[::ffff:8.8.8.8]/h", "http://8.8.8.8/h"),
        ("https://[2606:4700:0:0::1111]/h", "https://[2606:4700::1111]/h"),
        ("https://[2002:808:808::1]/h", "https://[2002:808:808::1]/h"),  # 6to4 of a public address
    ],
)
def test_a_public_url_is_accepted_and_stored_canonical(stub: Stub, token: ApiToken, url: str, kept: str) -> None:
    resolving(stub)
    stub.answers["xn--bcher-kva.agent.example"] = [PUBLIC]
    subscription, _secret = webhook_subscribe(token, url, ["cancel_requested"])
    assert WebhookSubscription.objects.get(pk=subscription.pk).url == kept


def test_the_allow_list_opens_only_what_it_names_and_never_the_metadata_service(
    stub: Stub, token: ApiToken, settings: Settings
) -> None:
    settings.RECKON_WEBHOOK_ALLOW_NETWORKS = "127.0.0.1/32,169.254.0.0/16,0.0.0.0/0"
    webhook_subscribe(token, "http://127.0.0.1:8000/h", ["cancel_requested"])
    webhook_subscribe(token, "http://[::ffff:127.0.0.1]:8000/h", ["cancel_requested"])  # the same address
    webhook_subscribe(token, "http://localhost:8000/h", ["cancel_requested"])  # loopback allowed: to resolution
    for url in ("http://169.254.169.254/", "http://0.0.0.0/", "http://224.0.0.1/", "http://[::1]/"):
        with pytest.raises(WebhookUrlInvalid):
            webhook_subscribe(token, url, ["cancel_requested"])


# --- the API: a named 422, never a 500; the upper-case scheme on both databases --------------------------------------


def api_post(client: Client, plaintext: str, url: str) -> Any:
    return client.post(
        "/api/v1/webhooks",
        {"url": url, "events": ["cancel_requested"]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {plaintext}",
    )


@pytest.mark.parametrize(
    "url",
    ["http://[::ffff:127.0.0.1]:8000/h", "http://[::ffff:7f00:1]/h", "HTTP://0x7f.1/h", "http://localhost./h"],
)
def test_the_api_answers_a_named_422_and_writes_nothing(client: Client, stub: Stub, url: str) -> None:
    _token, plaintext = api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=("test",), projects=())
    before = hooks_rows()
    response = api_post(client, plaintext, url)
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "webhook_url_invalid" and "is a loopback" in problem["detail"]
    assert hooks_rows() == before


def test_an_upper_case_scheme_is_case_folded_before_the_check_constraint(client: Client, stub: Stub) -> None:
    """The issue's 500 on PostgreSQL: the scheme reached the CHECK constraint as it was typed."""
    stub.answers["hooks.agent.example"] = [PUBLIC]
    _token, plaintext = api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=("test",), projects=())
    response = api_post(client, plaintext, "HTTPS://HOOKS.Agent.Example/Path")
    assert response.status_code == 201, response.content
    assert response.json()["url"] == "https://hooks.agent.example/Path"
    assert WebhookSubscription.objects.get().url == "https://hooks.agent.example/Path"


@pytest.mark.parametrize("url", ["HTTPS://hooks.agent.example/h", "Http://hooks.agent.example/h", "ftp://x/h"])
def test_the_database_refuses_a_scheme_not_in_lower_case_on_both_backends(token: ApiToken, url: str) -> None:
    """The CHECK constraint and the Python check agree: an exact, lower-case scheme (SQLite's LIKE would have let
    an upper-case one through where PostgreSQL refused it)."""
    with pytest.raises(IntegrityError), transaction.atomic():
        stored(token, url)
    stored(token, "https://hooks.agent.example/h")
    stored(token, "http://hooks.agent.example/h")


# --- delivery: resolved once, every address checked, connected to the checked address ---------------------------------


def test_dns_rebinding_public_at_subscription_loopback_at_delivery_sends_nothing(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any], receiver: Callable[..., Receiver]
) -> None:
    hook = receiver()
    stub.answers["rebind.agent.example"] = [[PUBLIC], ["127.0.0.1"]]  # public first, loopback afterwards
    subscription, _ = webhook_subscribe(token, f"http://rebind.agent.example:{hook.port}/h", ["cancel_requested"])
    delivery = one_delivery(make_task, subscription)
    attempt = deliver(delivery.delivery_id)
    assert attempt.outcome == "retry" and attempt.status_code is None
    row = WebhookDelivery.objects.get(pk=delivery.pk)
    assert row.status == DeliveryStatus.PENDING and row.delivered_at is None
    assert row.last_error == "refused: 127.0.0.1 is a loopback address (rebind.agent.example resolves to it)"
    assert hook.received == []  # the server on 127.0.0.1 got nothing
    assert stub.lookups == ["rebind.agent.example", "rebind.agent.example"]  # once at subscription, once to send


def test_a_delivery_connects_to_the_address_it_checked_and_resolves_nothing_again(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any], receiver: Callable[..., Receiver], settings: Settings
) -> None:
    """The control of the rebinding test: with 127.0.0.1 opened, the same delivery reaches the server: through the
    stub's one answer (the system resolver knows no rebind.agent.example), the name carried in Host."""
    settings.RECKON_WEBHOOK_ALLOW_NETWORKS = "127.0.0.1/32"
    hook = receiver()
    stub.answers["rebind.agent.example"] = ["127.0.0.1"]
    subscription, _ = webhook_subscribe(token, f"http://rebind.agent.example:{hook.port}/h?a=1", ["cancel_requested"])
    stub.lookups.clear()
    assert deliver(one_delivery(make_task, subscription).delivery_id).outcome == "delivered"
    assert hook.received == [("POST", "/h?a=1", f"rebind.agent.example:{hook.port}")]
    assert stub.lookups == ["rebind.agent.example"]


def test_a_name_with_any_address_inward_is_not_sent_to(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any], receiver: Callable[..., Receiver]
) -> None:
    hook = receiver()
    stub.answers["mixed.agent.example"] = [[PUBLIC], [PUBLIC, "::ffff:127.0.0.1"]]
    subscription, _ = webhook_subscribe(token, f"http://mixed.agent.example:{hook.port}/h", ["cancel_requested"])
    delivery = one_delivery(make_task, subscription)
    assert deliver(delivery.delivery_id).outcome == "retry"
    assert "127.0.0.1 is a loopback address" in WebhookDelivery.objects.get(pk=delivery.pk).last_error
    assert hook.received == []


@pytest.mark.parametrize(
    "host",
    ["[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0x7f.1", "2130706433", "127.1", "localhost.", "[::127.0.0.1]"],
)
def test_a_stored_inward_url_from_before_the_checks_is_given_up_unsent(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any], receiver: Callable[..., Receiver], host: str
) -> None:
    """The issue's finding: such a row was delivered to loopback and marked delivered."""
    hook = receiver()
    subscription = stored(token, f"http://{host}:{hook.port}/h")
    delivery = one_delivery(make_task, subscription)
    attempt = deliver(delivery.delivery_id)
    row = WebhookDelivery.objects.get(pk=delivery.pk)
    assert row.status != DeliveryStatus.DELIVERED and row.delivered_at is None
    assert row.last_error.startswith("refused: ") and "loopback" in row.last_error
    assert attempt.outcome == ("retry" if host == "localhost." else "dead")  # a literal never changes
    assert hook.received == []


def test_a_redirect_is_not_followed_and_is_a_named_failure(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any], receiver: Callable[..., Receiver], settings: Settings
) -> None:
    settings.RECKON_WEBHOOK_ALLOW_NETWORKS = "127.0.0.1/32"  # the first hop, a real server, is allowed
    inward = receiver()
    for location in (f"http://[::ffff:127.0.0.1]:{inward.port}/admin", f"http://127.0.0.1:{inward.port}/admin"):
        redirecting = receiver(status=302, location=location)
        subscription, _ = webhook_subscribe(token, f"http://127.0.0.1:{redirecting.port}/h", ["cancel_requested"])
        delivery = one_delivery(make_task, subscription)
        attempt = deliver(delivery.delivery_id)
        assert attempt.outcome == "retry" and attempt.status_code == 302
        row = WebhookDelivery.objects.get(pk=delivery.pk)
        assert row.last_error == "answered HTTP 302: a redirect, not followed" and row.delivered_at is None
        assert len(redirecting.received) == 1
    assert inward.received == []  # neither redirect was followed


def test_a_name_that_does_not_resolve_at_delivery_is_a_retryable_failure(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any]
) -> None:
    subscription, _ = webhook_subscribe(token, "https://gone.agent.example/h", ["cancel_requested"])
    delivery = one_delivery(make_task, subscription)
    assert deliver(delivery.delivery_id).outcome == "retry"
    assert WebhookDelivery.objects.get(pk=delivery.pk).last_error.startswith(
        "ConnectError: gone.agent.example does not resolve"
    )


def test_https_is_sent_to_the_checked_address_with_the_name_in_host_and_sni(
    stub: Stub, token: ApiToken, make_task: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The certificate is verified against the name (SNI), the TCP connection goes to the address checked."""
    stub.answers["hooks.agent.example"] = ["2606:4700::1111", PUBLIC]
    subscription, _ = webhook_subscribe(token, "https://hooks.agent.example:8443/h?x=1", ["cancel_requested"])
    seen: list[tuple[str, str, dict[str, Any], bool]] = []

    def capture(self: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
        seen.append((url, kwargs["headers"]["Host"], kwargs["extensions"], self.follow_redirects))
        raise httpx.ConnectError("captured, not sent")

    monkeypatch.setattr(httpx.Client, "stream", capture)
    assert deliver(one_delivery(make_task, subscription).delivery_id).outcome == "retry"
    assert seen == [
        (
            "https://[2606:4700::1111]:8443/h?x=1",
            "hooks.agent.example:8443",
            {"sni_hostname": "hooks.agent.example"},
            False,
        )
    ]


def test_the_networks_settings_are_refused_at_start_up_when_not_networks() -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={
            "PATH": "/usr/bin:/bin",
            "RECKON_ENV": "test",
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "RECKON_WEBHOOK_ALLOW_NETWORKS": "127.0.0.1/32,not-a-network",
        },
        capture_output=True,
        text=True,
        check=False,
        cwd=services.__file__.rsplit("/hooks/", 1)[0],
    )
    assert run.returncode != 0 and "RECKON_WEBHOOK_ALLOW_NETWORKS" in run.stderr


HOSTISH = st.text(alphabet=st.sampled_from("0123456789abcdefxX.:[]%-_ \u3002\uff10\uff11\uff4c\u00fcffff"), max_size=40)


@settings_of_hypothesis(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(["http", "HTTPS", "hTtP", "ftp"]), host=HOSTISH | st.text(max_size=30))
def test_any_url_is_accepted_canonical_or_refused_by_name_never_an_error(scheme: str, host: str) -> None:
    """Whatever the host, the check answers a stored URL or WebhookUrlInvalid (the API's 422), never another
    exception (a 500); and a URL it accepts reads back as itself and is not inward."""
    with mock.patch.object(targets, "resolve", lambda name, port: [PUBLIC]):
        try:
            url = services._valid_url(f"{scheme}://{host}/h")
        except WebhookUrlInvalid:
            return
        assert url.startswith(("http://", "https://")) and services._valid_url(url) == url
        hostname = urlsplit(url).hostname or ""
        address = targets.canonical_host(hostname).address
        assert address is None or targets.configured_refusal(address) == ""


@pytest.mark.django_db(transaction=True)
def test_the_migration_lower_cases_the_scheme_of_rows_stored_before_it(token: ApiToken) -> None:
    """On SQLite the old CHECK (LIKE) let an upper-case scheme be stored; 0002 case-folds such rows before its exact
    CHECK is added, so migrating an existing database cannot fail on them."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's old CHECK already refused an upper-case scheme: no such row exists there")
    executor = MigrationExecutor(connection)
    executor.migrate([("hooks", "0001_initial")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO hooks_webhooksubscription (token_id, url, events, secret, created_at)"
                " VALUES (%s, 'HTTPS://Hooks.Agent.Example/Kept', '[\"cancel_requested\"]', 'whsec_x', %s)",
                [token.pk, clock.now().isoformat()],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert list(WebhookSubscription.objects.values_list("url", flat=True)) == ["https://Hooks.Agent.Example/Kept"]
