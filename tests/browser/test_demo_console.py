"""The demo, as people see it: after ``load_demo`` the console's queues show every demo task to those who may see
them, the needs-attention queue holds exactly the ones waiting for a person, and each task's page is saved as a
screenshot (light and dark) under the state it landed in."""

import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from playwright.sync_api import Page, expect

from reference.demo import migration_plan
from reference.demo_states import CREATED_BY
from reference.migrate_project import KIND
from tasks.core.lifecycle import NodeStatus
from tasks.engine.plans import task_create
from tasks.jobs import drive_task
from tasks.models import Node, Task
from tests.conftest import person
from tests.simulator_fixture import Simulator

pytestmark = pytest.mark.browser

WAITING_FOR_A_PERSON = {"birch", "ginkgo", "hazel", "juniper", "maple", "nutmeg"}
# One page per state worth comparing (stopping, stopped pending and completed side by side); each costs ~1.5 s.
SCREENSHOT = {"alder", "birch", "dogwood", "elm", "juniper", "larch", "maple", "nutmeg"}


@pytest.fixture
def demo(simulator: Simulator) -> list[Task]:
    call_command("load_demo", store_url=simulator.url, wait=5, stdout=StringIO())
    return list(Task.objects.filter(created_by=CREATED_BY).order_by("pk"))


def test_the_operator_sees_every_demo_task_and_the_ones_waiting_for_a_person(
    page: Page, demo: list[Task], login: Callable[..., None], screenshot: Callable[..., list[Path]]
) -> None:
    login(page, User.objects.get(username="operator"))
    page.goto("/")
    for task in demo:
        expect(page.get_by_text(task.title)).to_be_visible()
    screenshot(page, "demo-work-queue-operator")
    page.goto("/attention/")
    for task in demo:
        if task.project in WAITING_FOR_A_PERSON:
            expect(page.get_by_text(task.title)).to_be_visible()
    expect(page.get_by_text("Migrate project alder")).to_have_count(0)
    screenshot(page, "demo-needs-attention-operator")


def test_every_demo_task_page_opens_for_the_auditor(
    page: Page, demo: list[Task], login: Callable[..., None], screenshot: Callable[..., list[Path]]
) -> None:
    login(page, User.objects.get(username="auditor"))
    for task in demo:
        response = page.goto(f"/tasks/{task.pk}/")
        assert response is not None and response.status == 200, task.title
        expect(page.get_by_text(task.title).first).to_be_visible()
        state = f"{task.status}-{task.status_reason}" if task.status_reason else task.status
        if task.project in SCREENSHOT:
            screenshot(page, f"demo-task-{task.project}-{state}")


def test_a_task_the_real_worker_drives_shows_its_progress(
    page: Page, worker: str, login: Callable[..., None], screenshot: Callable[..., list[Path]]
) -> None:
    """The worker fixture end to end: the wake-up goes to a worker process, which runs the demo plan against the
    simulator up to its approval; the task's page, read afresh, shows the nodes it ran."""
    task = task_create(
        kind=KIND, title="Migrate project acme", plan=migration_plan(), created_by=CREATED_BY, project="acme"
    )
    drive_task.delay(task.pk)
    deadline = time.monotonic() + 30
    while Node.objects.filter(task=task, status=NodeStatus.SUCCEEDED).count() < 6:
        assert time.monotonic() < deadline, "the worker did not run the task"
        time.sleep(0.2)
    login(page, person("ann", "admin").user)
    page.goto(f"/tasks/{task.pk}/")
    expect(page.get_by_text("approve-cleanup").first).to_be_visible()
    screenshot(page, "task-detail-awaiting-approval")
