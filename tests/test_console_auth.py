"""The console's doors: log in, log out, change the password; the frame (nav by role, name and roles); the 403 and
404 pages that say what to do; access.py reading the user's roles once per request. Each tried as someone who
should be refused."""

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404, HttpRequest
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console import access
from tests.conftest import person

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


def account(name: str, *roles: str, superuser: bool = False) -> User:
    user: User = person(name, *roles, superuser=superuser).user
    user.set_password(PASSWORD)
    user.save()
    return user


# --- log in -----------------------------------------------------------------------------------------------------


def test_a_logged_out_visitor_is_sent_to_the_login_page_with_next(client) -> None:
    response = client.get(reverse("audit-log") + "?action=role_granted")
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")
    page = client.get(response["Location"]).content.decode()
    assert "Log in to Reckon" in page
    assert 'name="next" value="/audit/?action=role_granted"' in page


def test_logging_in_goes_to_next_and_says_who_you_are(client) -> None:
    account("ann", "admin")
    response = client.post(reverse("login"), {"username": "ann", "password": PASSWORD, "next": "/audit/"}, follow=True)
    assert response.redirect_chain[-1][0] == "/audit/"
    html = response.content.decode()
    assert "Signed in as ann." in html
    assert "<strong>ann</strong>" in html and "(admin)" in html


def test_a_wrong_password_says_so_and_logs_nobody_in(client) -> None:
    account("ann", "operator")
    response = client.post(reverse("login"), {"username": "ann", "password": "wrong"})
    assert response.status_code == 200
    assert 'role="alert"' in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_an_operator_without_staff_rights_logs_in_to_the_console(client) -> None:
    account("ann", "operator")  # the Django admin's login would refuse her (not staff)
    response = client.post(reverse("login"), {"username": "ann", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == reverse("task-list")


def test_a_login_never_redirects_to_another_site(client) -> None:
    account("ann", "operator")
    response = client.post(reverse("login"), {"username": "ann", "password": PASSWORD, "next": "https://evil.example/"})
    assert response["Location"] == reverse("task-list")


def test_login_and_logout_refuse_a_post_without_a_csrf_token() -> None:
    account("ann", "operator")
    browser = Client(enforce_csrf_checks=True)
    response = browser.post(reverse("login"), {"username": "ann", "password": PASSWORD})
    assert response.status_code == 403
    assert "nothing was changed" in response.content.decode()
    browser.force_login(User.objects.get(username="ann"))
    assert browser.post(reverse("logout")).status_code == 403
    assert "_auth_user_id" in browser.session


def test_logging_out_takes_a_post_and_says_so(client) -> None:
    client.force_login(account("ann", "operator"))
    assert client.get(reverse("logout")).status_code == 405
    response = client.post(reverse("logout"), follow=True)
    assert "You are logged out." in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_a_password_change_needs_the_old_password_and_a_login(client) -> None:
    assert client.get(reverse("password_change")).status_code == 302
    client.force_login(account("ann", "operator"))
    refused = client.post(
        reverse("password_change"),
        {"old_password": "nope", "new_password1": "a new long pass 42", "new_password2": "a new long pass 42"},
    )
    assert refused.status_code == 200 and "was not changed" in refused.content.decode()
    assert User.objects.get(username="ann").check_password(PASSWORD)
    done = client.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": "a new long pass 42", "new_password2": "a new long pass 42"},
        follow=True,
    )
    assert "Your password was changed" in done.content.decode()
    assert User.objects.get(username="ann").check_password("a new long pass 42")


# --- the frame --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("roles", "shown", "hidden"),
    [
        (("operator",), ["Tasks"], ["Reviews", "Audit log", "Roles"]),
        (("auditor",), ["Tasks", "Reviews", "Audit log"], ["Roles"]),
        (("admin",), ["Tasks", "Reviews", "Audit log", "Roles"], []),
        (("operator", "auditor"), ["Tasks", "Reviews", "Audit log"], ["Roles"]),
    ],
)
def test_the_nav_shows_each_role_its_pages_only(client, roles, shown, hidden) -> None:
    client.force_login(account("ann", *roles))
    html = client.get(reverse("password_change")).content.decode()
    nav = html[html.index('<nav class="main-nav"') : html.index("</nav>")]
    for label in shown:
        assert f">{label}</a>" in nav, label
    for label in hidden:
        assert f">{label}</a>" not in nav, label
    assert f"({', '.join(r for r in ('operator', 'admin', 'auditor') if r in roles)})" in html


def test_a_superuser_without_a_role_sees_no_reckon_pages_and_is_refused(client) -> None:
    client.force_login(account("sue", superuser=True))
    html = client.get(reverse("password_change")).content.decode()
    assert "(no role)" in html
    nav = html[html.index('<nav class="main-nav"') : html.index("</nav>")]
    assert "</a>" not in nav
    for name in ("task-list", "reviews", "audit-log", "roles"):
        assert client.get(reverse(name)).status_code == 403, name


def test_the_403_page_says_what_to_do(client) -> None:
    client.force_login(account("otto"))
    response = client.get(reverse("task-list"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "You have no Reckon role yet" in html
    assert "ask a Reckon admin" in html and "signed in as <strong>otto</strong>" in html


def test_the_404_page_says_what_to_do(client) -> None:
    client.force_login(account("ann", "operator"))
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "Nothing here" in html and "ask a Reckon admin for a grant" in html


# --- access.py --------------------------------------------------------------------------------------------------


def request_of(user: Any) -> HttpRequest:
    request = RequestFactory().get("/")
    request.user = user
    return request


def test_access_reads_the_roles_once_per_request(make_task, clock) -> None:
    user = User.objects.get(pk=account("ada", "admin").pk)
    task = make_task()
    request = request_of(user)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            access.require_console_role(request)
            access.require_admin_role(request)
            access.require_audit_reader(request)
    assert len(queries) == 1
    with CaptureQueriesContext(connection) as queries:
        access.operable_task(request, task.pk)
    assert len(queries) == 1  # the task; roles already known


def test_access_refuses_each_persona_where_it_must(make_task, clock) -> None:
    task = make_task(project="billing")
    personas = {
        "anonymous": AnonymousUser(),
        "outsider": account("otto"),
        "operator": account("ann", "operator"),
        "auditor": account("carol", "auditor"),
        "superuser": account("sue", superuser=True),
        "admin": account("ada", "admin"),
    }
    allowed = {
        "require_console_role": {"operator", "auditor", "admin"},
        "require_admin_role": {"admin"},
        "require_audit_reader": {"auditor", "admin"},
    }
    for check, who in allowed.items():
        for name, user in personas.items():
            request = request_of(user)
            if name in who:
                getattr(access, check)(request)
            else:
                with pytest.raises(PermissionDenied):
                    getattr(access, check)(request)
    with pytest.raises(Http404):
        access.viewable_task(request_of(personas["operator"]), task.pk)  # no grant: not even its existence
    with pytest.raises(Http404):
        access.viewable_task(request_of(personas["admin"]), 987654)
    assert access.viewable_task(request_of(personas["auditor"]), task.pk) == task
    with pytest.raises(PermissionDenied):
        access.operable_task(request_of(personas["auditor"]), task.pk)  # sees it, may not act
    assert access.operable_task(request_of(personas["admin"]), task.pk) == task


def test_a_deactivated_account_is_logged_out_of_an_open_session(client) -> None:
    ada = account("ada", "admin")
    client.force_login(ada)
    assert client.get(reverse("audit-log")).status_code == 200
    ada.is_active = False
    ada.save(update_fields=["is_active"])
    response = client.get(reverse("audit-log"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert client.post(reverse("login"), {"username": "ada", "password": PASSWORD}).status_code == 200
