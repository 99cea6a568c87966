"""Agent API tokens: issued and revoked by admins only, each audited in the same transaction (a refusal writes
nothing), the plaintext shown once and never stored; the admin page "Agent tokens" refuses everyone else, refuses
POSTs without a CSRF token and costs a fixed number of queries whatever the number of tokens."""

import hashlib
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from api.models import ApiToken
from api.tokens import TokenError, api_token_authenticate, api_token_issue, api_token_revoke
from audit.hygiene import SecretInPayload
from audit.models import AuditEvent
from audit.principals import Principal
from tasks.access.permissions import PermissionDenied
from tests.conftest import person, snapshot

pytestmark = pytest.mark.django_db

REASON = "the agent's host was retired"


@pytest.fixture
def admin() -> Principal:
    return person("root", "admin")


def every_stored_value() -> str:
    """Every row of every table, as text: where a leaked plaintext would show."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608 (names from the schema)
            found.append(repr(cursor.fetchall()))
    return "\n".join(found)


# --- services ---------------------------------------------------------------------------------------------------


def test_issuing_stores_only_the_hash_and_writes_one_audit_row(admin: Principal) -> None:
    row, plaintext = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy", " copy "], projects=["acme"])
    assert row.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    assert row.kinds == ["copy"] and row.projects == ["acme"] and row.created_by == "user:root"
    assert plaintext not in every_stored_value()
    audit = AuditEvent.objects.get()
    assert audit.action == "api_token_issued" and audit.actor_id == "root"
    assert plaintext not in repr(audit.details)
    assert api_token_authenticate(plaintext) == row


def test_two_tokens_never_share_a_plaintext(admin: Principal) -> None:
    first = api_token_issue(actor=admin, agent_id="a", kinds=["copy"], projects=[])[1]
    second = api_token_issue(actor=admin, agent_id="a", kinds=["copy"], projects=[])[1]
    assert first != second and len(first) > 40


@pytest.mark.parametrize("roles", [(), ("operator",), ("auditor",)])
def test_only_admins_issue_or_revoke_and_a_refusal_writes_nothing(admin: Principal, roles: tuple[str, ...]) -> None:
    row, _ = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy"], projects=[])
    someone = person("someone", *roles)
    before = snapshot()
    with pytest.raises(PermissionDenied):
        api_token_issue(actor=someone, agent_id="agent-8", kinds=["copy"], projects=[])
    with pytest.raises(PermissionDenied):
        api_token_revoke(actor=someone, token_id=row.pk, reason=REASON)
    with pytest.raises(PermissionDenied):
        api_token_issue(actor=Principal.agent("agent-7"), agent_id="agent-8", kinds=["copy"], projects=[])
    assert snapshot() == before and ApiToken.objects.count() == 1


@pytest.mark.parametrize(
    ("agent", "kinds", "projects"),
    [("", ["copy"], []), ("agent-7", [], []), ("agent-7", [" "], [""]), ("agent-7", ["k" * 101], []),
     ("a" * 201, ["copy"], []), ("agent-7", [f"k{i}" for i in range(51)], [])],
)  # fmt: skip
def test_a_bad_issue_is_refused_and_writes_nothing(
    admin: Principal, agent: str, kinds: list[str], projects: list[str]
) -> None:
    before = snapshot()
    with pytest.raises(TokenError):
        api_token_issue(actor=admin, agent_id=agent, kinds=kinds, projects=projects)
    assert snapshot() == before and not ApiToken.objects.exists()


def test_a_token_s_name_is_audited_and_a_credential_pasted_into_it_is_refused_writing_nothing(
    admin: Principal,
) -> None:
    row, _ = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy"], projects=[], name=" nightly sync ")
    assert row.name == "nightly sync" and AuditEvent.objects.get().details["name"] == "nightly sync"
    before = snapshot()
    with pytest.raises(SecretInPayload):
        api_token_issue(actor=admin, agent_id="agent-8", kinds=["copy"], projects=[], name="password=hunter2hunter2")
    assert snapshot() == before and ApiToken.objects.count() == 1


def test_revoking_is_audited_once_and_cannot_be_repeated(admin: Principal) -> None:
    row, plaintext = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy"], projects=[])
    revoked = api_token_revoke(actor=admin, token_id=row.pk, reason=REASON)
    assert revoked.revoked and revoked.revoked_by == "user:root" and revoked.revoke_reason == REASON
    assert api_token_authenticate(plaintext) is None
    audit = AuditEvent.objects.filter(action="api_token_revoked").get()
    assert audit.reason == REASON
    before = snapshot()
    with pytest.raises(TokenError, match="already revoked"):
        api_token_revoke(actor=admin, token_id=row.pk, reason=REASON)
    with pytest.raises(TokenError, match="does not exist"):
        api_token_revoke(actor=admin, token_id=row.pk + 1, reason=REASON)
    with pytest.raises(TokenError, match="say why"):
        api_token_revoke(actor=admin, token_id=row.pk, reason="  ")
    assert snapshot() == before


# --- the page ---------------------------------------------------------------------------------------------------

PAGE = "/api-tokens/"


def browser_of(*roles: str, name: str = "ann", csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(person(name, *roles).user)
    return client


def test_the_page_is_for_admins_only(admin: Principal) -> None:
    row, _ = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy"], projects=[])
    urls = [
        ("get", PAGE, {}),
        ("post", reverse("api-token-issue"), {"agent_id": "x", "kinds": "copy"}),
        ("post", reverse("api-token-revoke", args=[row.pk]), {"reason": REASON}),
    ]
    logged_out = Client()
    for method, url, data in urls:
        response = getattr(logged_out, method)(url, data)
        assert response.status_code == 302 and "/login" in response["Location"]
    before = snapshot()
    for index, roles in enumerate([(), ("operator",), ("auditor",)]):
        client = browser_of(*roles, name=f"user{index}")
        before = snapshot()
        for method, url, data in urls:
            assert getattr(client, method)(url, data).status_code == 403, (roles, url)
        assert snapshot() == before


def test_an_admin_issues_a_token_shown_once_and_never_cached() -> None:
    client = browser_of("admin")
    response = client.post(reverse("api-token-issue"), {"agent_id": "agent-7", "kinds": "copy, sync", "projects": ""})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    plaintext = re.search(r'value="(rk_[^"]+)"', response.content.decode())
    assert plaintext is not None
    row = ApiToken.objects.get()
    assert row.kinds == ["copy", "sync"] and row.created_by == "user:ann"
    assert api_token_authenticate(plaintext.group(1)) == row
    listing = client.get(PAGE).content.decode()
    assert "agent-7" in listing and plaintext.group(1) not in listing and "live" in listing


def test_a_bad_issue_on_the_page_is_a_message_and_writes_nothing() -> None:
    client = browser_of("admin")
    before = snapshot()
    response = client.post(
        reverse("api-token-issue"), {"agent_id": "agent-7", "kinds": "", "projects": ""}, follow=True
    )
    assert "at least one task kind or project" in response.content.decode()
    assert snapshot() == before


def test_an_admin_revokes_a_token_with_a_reason(admin: Principal) -> None:
    row, plaintext = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy"], projects=[])
    client = browser_of("admin")
    before = snapshot()
    refused = client.post(reverse("api-token-revoke", args=[row.pk]), {"reason": ""}, follow=True)
    assert "Reason" in refused.content.decode() and snapshot() == before
    response = client.post(reverse("api-token-revoke", args=[row.pk]), {"reason": REASON}, follow=True)
    assert f"Token {row.pk} of agent agent-7 is revoked" in response.content.decode()
    assert api_token_authenticate(plaintext) is None
    assert "revoked" in client.get(PAGE).content.decode()


def test_posts_without_a_csrf_token_are_refused(admin: Principal) -> None:
    row, _ = api_token_issue(actor=admin, agent_id="agent-7", kinds=["copy"], projects=[])
    client = browser_of("admin", csrf=True)
    before = snapshot()
    assert client.post(reverse("api-token-issue"), {"agent_id": "x", "kinds": "copy"}).status_code == 403
    assert client.post(reverse("api-token-revoke", args=[row.pk]), {"reason": REASON}).status_code == 403
    assert snapshot() == before


def test_the_page_costs_the_same_with_3_or_30_tokens(admin: Principal) -> None:
    client = browser_of("admin")

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(PAGE).status_code == 200
        return len(queries)

    for i in range(3):
        api_token_issue(actor=admin, agent_id=f"agent-{i}", kinds=["copy"], projects=[])
    few = count()
    for i in range(27):
        api_token_issue(actor=admin, agent_id=f"agent-x{i}", kinds=["copy"], projects=["acme"])
    assert count() == few
    assert few <= 5, few  # session, user, roles, tokens (and messages)
