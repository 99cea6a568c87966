"""Browser tests: the console in real Chromium (Debian's ``chromium``, never a downloaded browser) driven by
Playwright against pytest-django's live server, which serves the test database (a SQLite file, or PostgreSQL) from
a thread of this process.

    login(page, user)         logs ``user`` in through the console's login form
    screenshot(page, "name")  saves screenshots/name-light.png and screenshots/name-dark.png (git-ignored)
    worker                    a real Celery worker process (and the simulator, ``store``) that every wake-up the
                              services ask for (``drive_task.delay``, e.g. "resume the agent") goes to

Every test module here is marked ``browser`` (``pytestmark``): .ci/run runs them in its SQLite pass only
(``-m "not browser"`` in the PostgreSQL pass). Without /usr/bin/chromium they are skipped
(``apt-get install -y chromium``; .ci/run does it).
"""

import os
import secrets
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from tasks.jobs import drive_task
from tests.simulator_fixture import Simulator
from tests.workers import celery_worker

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """One Playwright per module. Its sync API keeps an event loop in this thread, which Django's ORM takes for an
    async context: the check is lifted only while it runs, and the loop is gone before other modules' tests."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run installs it)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as running:
            yield running


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()


@pytest.fixture(autouse=True)
def operator_leases_outlast_the_walk(settings: Any) -> None:
    """An operator's lease lasts an hour here, not two minutes: a test that takes a task over while it sets up and
    walks a dozen pages before it reads the takeover page took longer than that on a loaded CI machine, and the page
    rightly showed the lease gone. A test about expiry sets its own TTL or moves the clock."""
    settings.RECKON_OPERATOR_LEASE_TTL = timedelta(hours=1)


@pytest.fixture
def page(browser: Browser, live_server: Any) -> Iterator[Page]:
    """A fresh browser context (no cookies) at 1280 by 800, its base URL the live server."""
    context = browser.new_context(base_url=live_server.url, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    yield opened
    context.close()


@pytest.fixture
def login() -> Callable[[Page, User], None]:
    def log_in(page: Page, user: User) -> None:
        """Through the login form, with a password set for this test (people made by ``person`` have none)."""
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save(update_fields=["password"])
        page.goto("/login/")
        page.get_by_label("User name").fill(user.get_username())
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_load_state()
        assert "/login/" not in page.url, f"{user.get_username()} could not log in"

    return log_in


@pytest.fixture
def screenshot() -> Callable[[Page, str], list[Path]]:
    def take(page: Page, name: str) -> list[Path]:
        """The page as it is, in light and in dark mode (prefers-color-scheme), full length. RECKON_SCREENSHOTS=0
        saves none (.ci/run: the checks made on each page stay; only the pictures, which nobody looks at there,
        are left out)."""
        if os.environ.get("RECKON_SCREENSHOTS", "1") == "0":
            return []
        SCREENSHOTS.mkdir(exist_ok=True)
        paths = []
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            path = SCREENSHOTS / f"{name}-{scheme}.png"
            page.screenshot(path=str(path), full_page=True)
            paths.append(path)
        page.emulate_media(color_scheme="no-preference")
        return paths

    return take


@pytest.fixture
def worker(store: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Celery worker in its own process, on a queue of this test's own (other runs share the broker folder), with
    the test database and the simulator (``store``: the demo plan's source registered). The live server's wake-ups
    (``drive_task.delay``, sent on commit by resume, approval and re-plan) are routed to that queue."""
    with celery_worker(store.url, prefix="browser", drop_env=("DJANGO_ALLOW_ASYNC_UNSAFE",)) as queue:

        def delay(*args: Any, **kwargs: Any) -> Any:
            return drive_task.apply_async(args, kwargs, queue=queue)

        monkeypatch.setattr(drive_task, "delay", delay)
        yield queue
