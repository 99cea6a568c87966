"""Who gets in, in a real browser: a user logs in and out through the console's own pages; a logged-out visitor
is sent to the login page from every console URL; an outsider (logged in, no Reckon role) is refused on every
console URL, and sees nothing of the task it names. The URLs are read from console.urls, so a page added later is
covered without editing this file."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.converters import IntConverter
from playwright.sync_api import Page, expect

from tasks.core.parsing import IdConverter
from tasks.models import Task
from tests.conftest import person

pytestmark = pytest.mark.browser

# Pages anyone may open, or every logged-in user (their own password), or Django's admin with its own login; and
# the Prometheus endpoint, which checks its own bearer token (tests/test_metrics.py); health and readiness, open and
# saying nothing (tests/test_health.py).
NOT_CONSOLE_PAGES = {"login", "logout", "password_change", "password_change_done", "metrics", "healthz", "readyz"}
SAMPLE_OP_KEY = "rk-0000-p1-copy-batch-1-0"


def _patterns(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            # Django's admin has its own login; the agent API its own tokens (tests/test_api_foundation.py).
            if str(entry.pattern) not in ("admin/", "api/v1/"):
                yield from _patterns(entry.url_patterns, prefix + str(entry.pattern))
        elif entry.name:
            yield prefix + str(entry.pattern), entry


def console_urls(task: Task) -> list[str]:
    """Every console URL, each id filled with a sample: the task given, 1 for other rows, a sample op key."""
    urls = []
    for _route, pattern in _patterns(get_resolver().url_patterns):
        if pattern.name in NOT_CONSOLE_PAGES:
            continue
        kwargs: dict[str, object] = {}
        for name, converter in pattern.pattern.converters.items():
            if name == "task_id":
                kwargs[name] = task.pk
            else:
                kwargs[name] = 1 if isinstance(converter, IntConverter | IdConverter) else SAMPLE_OP_KEY
        urls.append(reverse(pattern.name, kwargs=kwargs))
    return urls


def csrf_token(page: Page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def test_every_console_url_is_found(make_task: Callable[..., Task]) -> None:
    urls = console_urls(make_task())
    assert "/" in urls and any("/takeover/" in u for u in urls) and any(u.startswith("/audit/") for u in urls)


def test_a_user_logs_in_and_out(
    page: Page, make_task: Callable[..., Task], login: Callable[..., None], screenshot: Callable[..., list[Path]]
) -> None:
    make_task(title="Migrate project acme")
    ann = person("ann", "admin").user
    page.goto("/login/")
    screenshot(page, "login")
    login(page, ann)
    expect(page.get_by_text("Signed in as ann.")).to_be_visible()
    expect(page.locator("header .who")).to_contain_text("ann")
    screenshot(page, "task-list-admin")
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_text("You are logged out.")).to_be_visible()
    assert page.url.endswith("/login/")
    page.goto("/")
    assert "/login/?next=/" in page.url, "the session is gone"


def test_a_wrong_password_is_refused(page: Page) -> None:
    ann = person("ann", "operator").user
    ann.set_password("right-password-1")
    ann.save(update_fields=["password"])
    page.goto("/login/")
    page.get_by_label("User name").fill("ann")
    page.get_by_label("Password").fill("wrong-password-1")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_be_visible()
    assert page.url.endswith("/login/")


def test_a_logged_out_visitor_is_sent_to_the_login_page_from_every_console_url(
    page: Page, make_task: Callable[..., Task]
) -> None:
    task = make_task(title="Migrate project secret-acme")
    for url in console_urls(task):
        page.goto(url)
        assert "/login/?next=" in page.url, f"{url} did not ask for a login: {page.url}"
        assert "secret-acme" not in page.content(), url
        expect(page.get_by_role("heading", name="Log in to Reckon")).to_be_visible()


def test_an_outsider_is_refused_on_every_console_url(
    page: Page, make_task: Callable[..., Task], login: Callable[..., None], screenshot: Callable[..., list[Path]]
) -> None:
    task = make_task(title="Migrate project secret-acme")
    login(page, person("oscar").user)
    refused = {}
    for url in console_urls(task):
        # Through the browser's own session (its cookies); a 405 has no page for Chromium to show, hence request.
        answer = page.request.get(url, max_redirects=0)
        if answer.status == 405:  # an action: POST it, as a form or htmx would, with a valid CSRF token
            answer = page.request.post(url, headers={"X-CSRFToken": csrf_token(page)}, form={"reason": "x"})
        assert "secret-acme" not in answer.text(), url
        refused[url] = answer.status
    assert {url: status for url, status in refused.items() if status != 403} == {}
    page.goto(f"/tasks/{task.pk}/")
    expect(page.get_by_text("You have no Reckon role yet")).to_be_visible()
    screenshot(page, "refused-outsider")
