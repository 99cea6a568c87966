"""The admin and auditor pages: roles and scope grants, the review queue of forced releases, the audit log (filters,
keyset pages, CSV export) and the recorded check of both logs. Every page and endpoint is tried by who must be
refused; a refused action writes nothing; pages cost a fixed number of queries whatever the number of rows."""

import csv
import io
import re
import types
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.models import AuditEvent, VerificationRun
from audit.principals import Principal
from audit.services import audit_append
from console.views import admin as admin_views
from console.views import admin as views
from leases.models import ForcedRelease
from tasks.access.permissions import ADMIN, has_role, permission_grant
from tasks.jobs import verify_logs
from tasks.models import ScopeGrant, Task
from tasks.people.forced_release import forced_release_review, lease_force_release
from tests.conftest import as_a_tamperer, person, snapshot

pytestmark = pytest.mark.django_db

JUSTIFICATION = "agent worker-7 has been wedged for an hour"
IMPACT = "its in-flight copy is reconciled by op key afterwards"
NOTE = "agreed: the worker was stuck and nothing was lost"


def streamed(response: Any) -> str:
    """A streamed response's whole body (the test client's response type does not declare streaming_content)."""
    return b"".join(response.streaming_content).decode()


def matched(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in the page"
    return found


def state() -> tuple[Any, ...]:
    """Everything a refused action must leave as it was: Reckon's rows, role memberships, accounts."""
    groups = sorted(User.groups.through.objects.values_list("user__username", "group__name"))
    return snapshot(), groups, sorted(User.objects.values_list("username", "is_active", "password"))


def logged_in(user: User | None, *, csrf: bool = False) -> Client:
    browser = Client(enforce_csrf_checks=csrf)
    if user is not None:
        browser.force_login(user)
    return browser


@pytest.fixture
def people(db: None) -> dict[str, User | None]:
    return {
        "anonymous": None,
        "outsider": person("otto").user,
        "operator": person("olga", "operator").user,
        "auditor": person("carol", "auditor").user,
        "superuser": person("sue", superuser=True, staff=True).user,
        "admin": person("ada", "admin").user,
    }


@pytest.fixture
def forced(make_task, agent_lease, clock, people) -> ForcedRelease:
    """A forced release by ada, waiting for another admin's review."""
    task = make_task(title="migrate acme")
    agent_lease(task)
    return lease_force_release(
        actor=Principal.of_user(people["admin"]), task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT
    )


# --- who may open what ------------------------------------------------------------------------------------------

READERS = {"auditor", "admin"}
PAGES = {"roles": {"admin"}, "reviews": READERS, "audit-log": READERS, "audit-log-csv": READERS}


@pytest.mark.parametrize("page", PAGES)
def test_each_page_refuses_whoever_may_not_read_it(people, forced, page) -> None:
    for name, user in people.items():
        response = logged_in(user).get(reverse(page))
        if user is None:
            assert response.status_code == 302 and response["Location"].startswith(reverse("login")), page
        elif name in PAGES[page]:
            assert response.status_code == 200, (page, name)
        else:
            assert response.status_code == 403, (page, name)


def post_endpoints(forced: ForcedRelease) -> dict[str, tuple[str, dict[str, str]]]:
    """Every action, with a body the admin's request would be granted on."""
    return {
        "role-grant": (reverse("role-grant"), {"username": "otto", "role": "operator"}),
        "role-revoke": (reverse("role-revoke"), {"username": "olga", "role": "operator"}),
        "scope-grant": (reverse("scope-grant"), {"username": "olga", "project": "billing", "kind": "*"}),
        "scope-revoke": (reverse("scope-revoke"), {"username": "olga", "project": "acme", "kind": "*"}),
        "review": (reverse("review", args=[forced.pk]), {"verdict": "accepted", "note": NOTE}),
        "verify-logs": (reverse("verify-logs"), {}),
        "task-grant": (reverse("task-grant"), {"username": "olga", "task": str(forced.task_id)}),
        "task-revoke": (reverse("task-revoke"), {"username": "carol", "task": str(forced.task_id)}),
        "account-create": (reverse("account-create"), {"username": "newbie", "role": "auditor"}),
        "password-reset": (reverse("password-reset", args=[User.objects.get(username="olga").pk]), {}),
    }


AUDIT_ROWS = {"account-create": 2}  # account_created + role_granted; every other action writes one row


def test_every_action_refuses_everyone_but_an_admin_and_writes_nothing(people, forced, clock) -> None:
    permission_grant(actor=Principal.of_user(people["admin"]), user=people["operator"], project="acme")
    permission_grant(actor=Principal.of_user(people["admin"]), user=people["auditor"], task=forced.task)
    other_admin = person("max", "admin").user
    for endpoint, (url, body) in post_endpoints(forced).items():
        for name, user in people.items():
            if name == "admin":
                continue
            before = state()
            response = logged_in(user).post(url, body)
            expected = 302 if user is None else 403
            assert response.status_code == expected, (endpoint, name)
            assert state() == before, (endpoint, name)
        before = state()
        assert logged_in(other_admin, csrf=True).post(url, body).status_code == 403, endpoint  # no CSRF token
        assert logged_in(other_admin).get(url).status_code == 405, endpoint
        assert state() == before, endpoint


@pytest.mark.usefixtures("verification_at_once")
def test_an_admin_may_do_every_action(people, forced, clock) -> None:
    permission_grant(actor=Principal.of_user(people["admin"]), user=people["operator"], project="acme")
    permission_grant(actor=Principal.of_user(people["admin"]), user=people["auditor"], task=forced.task)
    reviewer = logged_in(person("max", "admin").user)
    for endpoint, (url, body) in post_endpoints(forced).items():
        audited = AuditEvent.objects.count()
        response = reviewer.post(url, body, follow=True)
        assert response.status_code == 200, endpoint
        html = response.content.decode()
        assert "message-success" in html or "It is shown <strong>only now</strong>" in html, endpoint
        assert AuditEvent.objects.count() == audited + AUDIT_ROWS.get(endpoint, 1), endpoint


# --- roles ------------------------------------------------------------------------------------------------------


def test_granting_and_revoking_a_role_on_the_page_writes_one_audit_row_each(people, clock) -> None:
    admin = logged_in(people["admin"])
    response = admin.post(reverse("role-grant"), {"username": "otto", "role": "auditor"}, follow=True)
    assert "otto is now auditor." in response.content.decode()
    assert list(AuditEvent.objects.values_list("actor_id", "action", "details")) == [
        ("ada", "role_granted", {"user": "otto", "role": "auditor"})
    ]
    assert logged_in(User.objects.get(username="otto")).get(reverse("audit-log")).status_code == 200
    admin.post(reverse("role-revoke"), {"username": "otto", "role": "auditor"})
    assert AuditEvent.objects.latest("seq").action == "role_revoked"
    assert AuditEvent.objects.count() == 2
    assert logged_in(User.objects.get(username="otto")).get(reverse("audit-log")).status_code == 403


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"username": "olga", "role": "operator"}, "olga is already an operator"),
        ({"username": "nobody", "role": "operator"}, "There is no user with that name."),
        ({"username": "olga", "role": "superuser"}, "Select a valid choice"),
    ],
)
def test_a_refused_grant_says_why_and_writes_nothing(people, clock, body, said) -> None:
    before = state()
    response = logged_in(people["admin"]).post(reverse("role-grant"), body, follow=True)
    assert said in response.content.decode()
    assert state() == before


def test_an_admin_opens_an_account_whose_password_is_shown_once_and_works(people, clock) -> None:
    response = logged_in(people["admin"]).post(reverse("account-create"), {"username": "newbie", "role": "operator"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    password = matched(r'id="generated" class="secret" value="([^"]+)"', response.content.decode()).group(1)
    newbie = User.objects.get(username="newbie")
    assert newbie.check_password(password) and has_role(Principal.of_user(newbie), "operator")
    assert list(AuditEvent.objects.values_list("actor_id", "action", "details")) == [
        ("ada", "account_created", {"user": "newbie"}),
        ("ada", "role_granted", {"user": "newbie", "role": "operator"}),
    ]
    assert password not in logged_in(people["admin"]).get(reverse("roles")).content.decode()


@pytest.mark.parametrize(
    ("username", "said"),
    [("olga", "already an account named olga"), ("bad name!", "not a valid user name"), ("AnonymousUser", "reserved")],
)
def test_an_account_that_cannot_be_opened_says_why_and_writes_nothing(people, clock, username, said) -> None:
    before = state()
    response = logged_in(people["admin"]).post(
        reverse("account-create"), {"username": username, "role": "operator"}, follow=True
    )
    assert said in response.content.decode()
    assert state() == before


def test_a_new_password_ends_the_accounts_sessions_and_is_refused_for_admins_and_oneself(people, clock) -> None:
    olga_browser = logged_in(people["operator"])
    assert olga_browser.get(reverse("task-list")).status_code == 200
    admin = logged_in(people["admin"])
    response = admin.post(reverse("password-reset", args=[people["operator"].pk]))
    password = matched(r'id="generated" class="secret" value="([^"]+)"', response.content.decode()).group(1)
    assert User.objects.get(pk=people["operator"].pk).check_password(password)
    assert olga_browser.get(reverse("task-list")).status_code == 302  # her old session ended
    assert AuditEvent.objects.get().action == "password_reset"
    max_ = person("max", "admin").user
    for target, said in ((max_, "max is an admin"), (people["admin"], "change your own password")):
        before = state()
        refused = admin.post(reverse("password-reset", args=[target.pk]), follow=True).content.decode()
        assert said in refused
        assert state() == before
    assert admin.post(reverse("password-reset", args=[987654])).status_code == 404
    html = admin.get(reverse("roles")).content.decode()
    assert f'action="{reverse("password-reset", args=[max_.pk])}"' not in html
    assert f'action="{reverse("password-reset", args=[people["operator"].pk])}"' in html


def test_the_last_admin_cannot_revoke_their_own_admin_role_on_the_page(people, clock) -> None:
    ada = people["admin"]
    before = state()
    response = logged_in(ada).post(reverse("role-revoke"), {"username": "ada", "role": "admin"}, follow=True)
    assert "ada is the last admin" in response.content.decode()
    assert state() == before
    assert has_role(Principal.of_user(User.objects.get(pk=ada.pk)), ADMIN)


def test_a_superuser_cannot_make_themselves_admin_on_the_page(people, clock) -> None:
    before = state()
    response = logged_in(people["superuser"]).post(reverse("role-grant"), {"username": "sue", "role": "admin"})
    assert response.status_code == 403
    assert state() == before


def test_scope_grants_are_granted_listed_and_revoked_on_the_page(people, clock) -> None:
    admin = logged_in(people["admin"])
    admin.post(reverse("scope-grant"), {"username": "olga", "project": "billing", "kind": "*"})
    assert list(ScopeGrant.objects.values_list("user__username", "project", "kind")) == [("olga", "billing", "*")]
    html = admin.get(reverse("roles")).content.decode()
    assert "billing / *" in html
    before = state()
    everything = admin.post(reverse("scope-grant"), {"username": "olga", "project": "*", "kind": "*"}, follow=True)
    assert "Name a project or a kind" in everything.content.decode()
    twice = admin.post(reverse("scope-grant"), {"username": "olga", "project": "billing", "kind": "*"}, follow=True)
    assert "already operates project billing" in twice.content.decode()
    assert state() == before
    admin.post(reverse("scope-revoke"), {"username": "olga", "project": "billing", "kind": "*"})
    assert not ScopeGrant.objects.exists()
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["permission_granted", "permission_revoked"]


def test_single_task_grants_are_granted_listed_and_revoked_on_the_page(people, make_task, clock) -> None:
    task = make_task(project="billing")
    admin = logged_in(people["admin"])
    olga = logged_in(people["operator"])
    assert olga.get(reverse("task-detail", args=[task.pk])).status_code == 404
    admin.post(reverse("task-grant"), {"username": "olga", "task": task.pk})
    assert olga.get(reverse("task-detail", args=[task.pk])).status_code == 200
    row = admin.get(reverse("roles")).content.decode().split('<th scope="row">olga')[1].split("</tr>")[0]
    assert f"task {task.pk}" in row
    before = state()
    for body, said in (
        ({"username": "olga", "task": task.pk}, f"olga already operates task {task.pk}"),
        ({"username": "olga", "task": 987654}, "There is no task 987654."),
        ({"username": "carol", "task": task.pk}, f"carol has no grant on task {task.pk}"),
    ):
        url = reverse("task-revoke" if body["username"] == "carol" else "task-grant")
        assert said in admin.post(url, body, follow=True).content.decode()
        assert state() == before
    admin.post(reverse("task-revoke"), {"username": "olga", "task": task.pk})
    assert olga.get(reverse("task-detail", args=[task.pk])).status_code == 404
    assert list(AuditEvent.objects.values_list("action", "task_id")) == [
        ("permission_granted", task.pk),
        ("permission_revoked", task.pk),
    ]


def test_the_roles_page_lists_accounts_roles_grants_and_flags(people, clock) -> None:
    permission_grant(actor=Principal.of_user(people["admin"]), user=people["operator"], kind="migrate")
    html = logged_in(people["admin"]).get(reverse("roles")).content.decode()
    olga = html[html.index('<th scope="row">olga') :].split("</tr>")[0]
    assert "operator" in olga and "* / migrate" in olga
    sue = html[html.index('<th scope="row">sue') :].split("</tr>")[0]
    assert "superuser" in sue and "no role (cannot use the console)" in sue


def test_the_roles_page_finds_accounts_by_name_and_says_when_it_shows_only_the_first(people, clock, monkeypatch):
    monkeypatch.setattr(views, "PEOPLE_SHOWN", 2)
    admin = logged_in(people["admin"])
    html = admin.get(reverse("roles")).content.decode()
    assert html.count('<th scope="row">') == 2 and "Only the first 2 accounts are listed" in html
    found = admin.get(reverse("roles"), {"name": "OLG"}).content.decode()
    assert re.findall(r'<th scope="row">(\w+)', found) == ["olga"] and "Only the first" not in found
    assert "No account matches “zzz”" in admin.get(reverse("roles"), {"name": "zzz"}).content.decode()


ROLES_QUERIES = 7  # session, user, roles, accounts, their roles, their scope grants, their single-task grants


@pytest.mark.parametrize("count", [3, 30])
def test_the_roles_page_costs_the_same_for_3_accounts_as_for_30(people, make_task, clock, count) -> None:
    admin = Principal.of_user(people["admin"])
    tasks = [make_task(), make_task()]
    for index in range(count):
        user = person(f"user{index:02}", "operator").user
        permission_grant(actor=admin, user=user, project=f"p{index}")
        permission_grant(actor=admin, user=user, task=tasks[index % 2])
    browser = logged_in(people["admin"])
    with CaptureQueriesContext(connection) as queries:
        response = browser.get(reverse("roles"))
    assert response.content.decode().count('<th scope="row">') == count + len(people) - 1
    assert len(queries) == ROLES_QUERIES, [q["sql"][:100] for q in queries.captured_queries]


# --- reviews ----------------------------------------------------------------------------------------------------


def test_the_review_queue_shows_what_a_reviewer_needs(people, forced) -> None:
    html = logged_in(person("max", "admin").user).get(reverse("reviews")).content.decode()
    for fact in (JUSTIFICATION, IMPACT, "user:ada", "agent:agent-1", f"task {forced.task_id}", "migrate acme"):
        assert fact in html, fact
    assert f'action="{reverse("review", args=[forced.pk])}"' in html


def test_the_admin_who_forced_a_release_is_told_another_admin_reviews_it_and_is_refused(people, forced) -> None:
    ada = logged_in(people["admin"])
    html = ada.get(reverse("reviews")).content.decode()
    assert "You forced this release: another admin reviews it." in html
    assert f'action="{reverse("review", args=[forced.pk])}"' not in html
    before = state()
    response = ada.post(reverse("review", args=[forced.pk]), {"verdict": "accepted", "note": NOTE}, follow=True)
    assert "reviewed by another admin" in response.content.decode()
    assert state() == before


def test_an_auditor_reads_the_queue_without_a_form(people, forced) -> None:
    html = logged_in(people["auditor"]).get(reverse("reviews")).content.decode()
    assert JUSTIFICATION in html
    assert "<form" not in html.split("<main")[1].split("Recently reviewed")[0]


def test_a_review_of_an_already_reviewed_release_is_refused_and_writes_nothing(people, forced, clock) -> None:
    forced_release_review(
        actor=Principal.of_user(person("max", "admin").user), forced_release_id=forced.pk, verdict="accepted", note=NOTE
    )
    nia = person("nia", "admin").user
    before = state()
    response = logged_in(nia).post(
        reverse("review", args=[forced.pk]), {"verdict": "disputed", "note": NOTE}, follow=True
    )
    assert "already reviewed" in response.content.decode()
    assert state() == before
    html = logged_in(people["auditor"]).get(reverse("reviews")).content.decode()
    assert "No forced release waits for review." in html and "user:max" in html


def test_a_review_with_a_short_note_is_refused_and_writes_nothing(people, forced) -> None:
    max_ = person("max", "admin").user
    before = state()
    response = logged_in(max_).post(
        reverse("review", args=[forced.pk]), {"verdict": "accepted", "note": "ok"}, follow=True
    )
    assert "at least 20 characters" in response.content.decode()
    assert state() == before


REVIEWS_QUERIES = 5  # session, user, roles, the pending releases with their tasks, the recent reviews


@pytest.mark.parametrize("count", [3, 30])
def test_the_review_queue_costs_the_same_for_3_releases_as_for_30(make_task, agent_lease, clock, people, count):
    ada, max_ = Principal.of_user(people["admin"]), Principal.of_user(person("max", "admin").user)
    for index in range(count):
        task = make_task()
        agent_lease(task)
        release = lease_force_release(actor=ada, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)
        if index % 2:
            forced_release_review(actor=max_, forced_release_id=release.pk, verdict="accepted", note=NOTE)
    browser = logged_in(people["auditor"])
    with CaptureQueriesContext(connection) as queries:
        response = browser.get(reverse("reviews"))
    assert response.content.decode().count('class="card review"') == count - count // 2
    assert len(queries) == REVIEWS_QUERIES, [q["sql"][:100] for q in queries.captured_queries]


# --- the audit log ----------------------------------------------------------------------------------------------


def append(action: str, *, actor: Principal | None = None, task_id: int | None = None, reason: str = "") -> None:
    from django.db import transaction

    from leases import clock

    with transaction.atomic():
        audit_append(
            actor=actor or Principal.system("test"), action=action, at=clock.now(), task_id=task_id, reason=reason
        )


def seqs(html: str) -> list[int]:
    body = html.split('<table class="audit">')[1].split("</tbody>")[0]
    return [int(row.split("<td>")[1].split("</td>")[0]) for row in body.split("<tr>")[2:] if "<td>" in row]


def test_the_audit_log_filters_by_actor_action_task_and_forced_releases(people, forced, clock) -> None:
    ann = Principal.of_user(people["operator"])
    append("note_added", actor=ann, task_id=forced.task_id)
    append("note_added", actor=Principal.agent("olga"), task_id=999)
    append("cancel_requested", actor=ann, task_id=999)
    browser = logged_in(people["auditor"])
    url = reverse("audit-log")
    every = seqs(browser.get(url).content.decode())
    assert every == sorted(every, reverse=True) and len(every) == 4
    assert seqs(browser.get(url, {"actor": "user:olga"}).content.decode()) == [4, 2]
    assert seqs(browser.get(url, {"actor": "olga"}).content.decode()) == [4, 3, 2]
    assert seqs(browser.get(url, {"action": "note_added"}).content.decode()) == [3, 2]
    assert seqs(browser.get(url, {"task": forced.task_id}).content.decode()) == [2, 1]
    assert seqs(browser.get(url, {"forced": "on"}).content.decode()) == [1]
    assert seqs(browser.get(url, {"forced": "on", "actor": "user:olga"}).content.decode()) == []
    refused = browser.get(url, {"task": "not-a-number"})
    assert refused.status_code == 200 and "Enter a whole number." in refused.content.decode()
    assert seqs(refused.content.decode()) == []


def test_the_audit_log_pages_newest_first_by_keyset(people, clock, monkeypatch) -> None:
    monkeypatch.setattr(views, "AUDIT_PAGE_SIZE", 3)
    for index in range(7):
        append("note_added", reason=f"r{index}")
    browser = logged_in(people["auditor"])
    first = browser.get(reverse("audit-log"), {"action": "note_added"}).content.decode()
    assert seqs(first) == [7, 6, 5]
    link = first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert "action=note_added" in link and "before=5" in link
    append("note_added")  # newer than every row shown: changes no later page
    second = browser.get(link).content.decode()
    assert seqs(second) == [4, 3, 2]
    assert 'rel="next"' in second
    assert seqs(browser.get(reverse("audit-log"), {"before": "2"}).content.decode()) == [1]


def test_an_htmx_filter_gets_the_results_only_and_every_answer_varies_on_hx_request(people, clock) -> None:
    append("note_added")
    append("cancel_requested")
    browser = logged_in(people["auditor"])
    full = browser.get(reverse("audit-log"), {"action": "note_added"})
    assert "HX-Request" in full["Vary"] and "<html" in full.content.decode()
    rows = browser.get(reverse("audit-log"), {"action": "note_added"}, headers={"HX-Request": "true"})
    html = rows.content.decode()
    assert "HX-Request" in rows["Vary"]
    assert "<html" not in html and "<form" not in html
    assert seqs(html) == [1]
    assert "export.csv?action=note_added" in html
    restore = browser.get(
        reverse("audit-log"),
        {"action": "note_added"},
        headers={"HX-Request": "true", "HX-History-Restore-Request": "true"},
    )
    assert "<html" in restore.content.decode()
    invalid = browser.get(reverse("audit-log"), {"task": "x"}, headers={"HX-Request": "true"}).content.decode()
    assert "Fix the filters" in invalid and "Enter a whole number." in invalid


def test_every_htmx_link_on_the_audit_log_is_also_a_plain_link(people, clock, monkeypatch) -> None:
    monkeypatch.setattr(views, "AUDIT_PAGE_SIZE", 1)
    for _ in range(3):
        append("note_added")
    html = logged_in(people["auditor"]).get(reverse("audit-log"), {"before": "3"}).content.decode()
    links = re.findall(r"<a [^>]*hx-get=[^>]*>", html)
    assert len(links) == 2
    for link in links:
        assert matched(r'href="([^"]+)"', link).group(1) == matched(r'hx-get="([^"]+)"', link).group(1)


AUDIT_QUERIES = 5  # session, user, roles, the page of events, the last verification


@pytest.mark.parametrize("count", [3, 30])
def test_the_audit_log_costs_the_same_for_3_rows_as_for_30(people, make_task, clock, count) -> None:
    tasks = [make_task() for _ in range(3)]
    for index in range(count):
        append("note_added", task_id=tasks[index % 3].pk, actor=Principal.of_user(people["operator"]))
    browser = logged_in(people["auditor"])
    for query in ({}, {"actor": "user:olga"}, {"action": "note_added", "task": tasks[0].pk}):
        with CaptureQueriesContext(connection) as queries:
            response = browser.get(reverse("audit-log"), query)
        assert len(seqs(response.content.decode())) == (count if len(query) < 2 else len(range(0, count, 3)))
        assert len(queries) == AUDIT_QUERIES, [q["sql"][:100] for q in queries.captured_queries]


def test_the_csv_export_streams_the_filtered_log_and_defuses_formulas(people, forced, clock) -> None:
    append("note_added", actor=Principal.agent("bot"), reason='=HYPERLINK("https://evil.example")')
    append("note_added", actor=Principal.agent("other"))
    response = logged_in(people["auditor"]).get(reverse("audit-log-csv"), {"actor": "agent:bot"})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(streamed(response))))
    assert rows[0][:4] == ["seq", "at", "actor", "action"]
    assert len(rows) == 2 and rows[1][2] == "agent:bot"
    assert rows[1][8].startswith("'=")  # shown as text by a spreadsheet, never run
    everything = logged_in(people["admin"]).get(reverse("audit-log-csv"))
    assert len(list(csv.reader(io.StringIO(streamed(everything))))) == 4
    bad = logged_in(people["admin"]).get(reverse("audit-log-csv"), {"task": "x"})
    assert bad.status_code == 400


# --- verification of both logs ----------------------------------------------------------------------------------


@pytest.fixture
def verification_at_once(monkeypatch):
    """The "verify now" job run in the request, as soon as it is sent: these tests are about what it finds and
    shows. That it goes to a worker after the commit is test_verify_now_is_sent_to_a_worker_after_the_commit."""
    monkeypatch.setattr(admin_views, "transaction", types.SimpleNamespace(on_commit=lambda run, robust=False: run()))
    monkeypatch.setattr(verify_logs, "delay", verify_logs)


def test_verify_now_is_sent_to_a_worker_after_the_commit(people, django_capture_on_commit_callbacks, monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(verify_logs, "delay", sent.append)
    with django_capture_on_commit_callbacks() as callbacks:
        response = logged_in(people["admin"]).post(reverse("verify-logs"), follow=True)
        assert sent == []  # nothing is walked in the request, nothing sent before the commit
    assert "Verification started" in response.content.decode()
    for callback in callbacks:
        callback()
    assert sent == ["ada"] and not VerificationRun.objects.exists()


@pytest.mark.usefixtures("verification_at_once")
def test_verify_now_records_what_it_found_and_the_page_shows_it(people, make_task, clock) -> None:
    make_task()
    make_task()
    auditor = logged_in(people["auditor"])
    assert "Never verified." in auditor.get(reverse("audit-log")).content.decode()
    assert "Verify now" not in auditor.get(reverse("audit-log")).content.decode()
    response = logged_in(people["admin"]).post(reverse("verify-logs"), follow=True)
    assert "Both logs verified" in response.content.decode()  # the page shows the run's result
    run = VerificationRun.objects.get()
    assert (run.run_by, run.tasks_checked, run.tasks_with_problems, run.audit_problem) == ("user:ada", 2, 0, "")
    assert AuditEvent.objects.latest("seq").action == "logs_verified"
    html = auditor.get(reverse("audit-log")).content.decode()
    assert "Both logs verified." in html and "2 tasks checked" in html and "by user:ada" in html


@pytest.mark.usefixtures("verification_at_once")
def test_verify_now_reports_a_tampered_audit_chain(people, clock) -> None:
    append("note_added", reason="the original words")
    as_a_tamperer()
    from django.db import connection as db

    with db.cursor() as cursor:
        cursor.execute("UPDATE audit_auditevent SET reason = 'rewritten' WHERE seq = 1")
    response = logged_in(people["admin"]).post(reverse("verify-logs"), follow=True)
    html = response.content.decode()
    assert "Problems found." in html and "was altered after it was written" in html
    assert not VerificationRun.objects.get().sound


@pytest.mark.usefixtures("verification_at_once")
def test_verify_now_reports_and_quarantines_a_task_whose_log_was_cut(people, make_task, clock) -> None:
    task = make_task()
    Task.objects.filter(pk=task.pk).update(log_head="f" * 64)  # the head no longer names the log's last event
    response = logged_in(people["admin"]).post(reverse("verify-logs"), follow=True)
    html = response.content.decode()
    assert "1 with problems" in html and f"Task {task.pk}" in html
    run = VerificationRun.objects.get()
    assert (run.tasks_with_problems, run.tasks_quarantined) == (1, 1)
    assert Task.objects.get(pk=task.pk).status == "quarantined"
