"""The bulk pages: every endpoint refuses whoever may not act and a POST without a CSRF token; the
preview counts per outcome in a fixed number of queries; the confirmation (typed reason, typed count) records a run
whose job changes the previewed tasks only, skipping and listing a task that moved or was never the person's; the
progress page polls until the run is done."""

import html
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from guardian.shortcuts import assign_perm

from audit.models import AuditEvent
from leases.models import Lease
from leases.services import lease_release
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Failed
from tasks.models import BulkItemStatus, BulkRun, BulkRunItem, Event, Task
from tasks.people.bulk import Seen, bulk_run_apply, bulk_run_create
from tasks.people.takeover import takeover_claim
from tests.conftest import chain_plan, person
from tests.steps import record, send

pytestmark = pytest.mark.django_db

PROJECT = "outage"
OPERATE = "tasks.operate_task"
REASON = "the outage is over: cancel what it left"
PINNED = {"preview": 6, "run": 7}
PREVIEW = f"{reverse('bulk')}?project={PROJECT}&op=cancel"


def paused(make_task: Callable[..., Task], agent_lease: Callable[..., Lease], title: str = "paused") -> Task:
    task = make_task(chain_plan("a", "b"), project=PROJECT, title=title)
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.PERMISSION_REVOKED, "403 from the store"), lease)
    lease_release(lease=lease)
    return Task.objects.get(pk=task.pk)


def task_state(task: Task) -> tuple[Any, ...]:
    return (
        Task.objects.filter(pk=task.pk).values().get(),
        list(Event.objects.filter(task=task).values_list("seq", "type")),
        list(AuditEvent.objects.filter(task_id=task.pk).values_list("seq", "action")),
    )


def hidden(content: bytes, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', content.decode())
    assert found, name
    return html.unescape(found.group(1))


def confirm_data(page: bytes, typed: str, reason: str = REASON) -> dict[str, str]:
    return {
        "operation": hidden(page, "operation"),
        "seen": hidden(page, "seen"),
        "filter": hidden(page, "filter"),
        "reason": reason,
        "confirm": typed,
    }


@pytest.fixture
def run_of_bob(make_task: Callable[..., Task], agent_lease: Callable[..., Lease]) -> BulkRun:
    task = paused(make_task, agent_lease)
    return bulk_run_create(
        actor=person("bob", "admin"), operation="cancel", reason=REASON, seen=[Seen(task.pk, task.version, None)]
    )


def endpoints(run: BulkRun) -> list[tuple[str, str]]:
    return [
        ("get", PREVIEW),
        ("post", reverse("bulk")),
        ("get", reverse("bulk-run", args=[run.pk])),
        ("get", reverse("bulk-run-status", args=[run.pk])),
    ]


def test_every_bulk_endpoint_sends_a_logged_out_visitor_to_the_login_page(client: Client, run_of_bob: BulkRun) -> None:
    for method, url in endpoints(run_of_bob):
        response = getattr(client, method)(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


@pytest.mark.parametrize("roles", [(), ("auditor",)])
def test_an_outsider_and_an_auditor_get_403_everywhere_and_nothing_is_written(
    client: Client, run_of_bob: BulkRun, roles: tuple[str, ...]
) -> None:
    client.force_login(person("someone", *roles).user)
    runs = BulkRun.objects.count()
    for method, url in endpoints(run_of_bob):
        assert getattr(client, method)(url, {}).status_code == 403, url
    assert BulkRun.objects.count() == runs


def test_another_persons_run_is_not_found(client: Client, run_of_bob: BulkRun) -> None:
    client.force_login(person("ann", "operator").user)
    assert client.get(reverse("bulk-run", args=[run_of_bob.pk])).status_code == 404
    assert client.get(reverse("bulk-run-status", args=[run_of_bob.pk])).status_code == 404


def test_a_confirmation_without_a_csrf_token_is_refused(
    make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    task = paused(make_task, agent_lease)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(person("ada", "admin").user)
    page = strict.get(PREVIEW).content
    assert strict.post(reverse("bulk"), confirm_data(page, "1")).status_code == 403
    assert not BulkRun.objects.exists()
    assert Task.objects.get(pk=task.pk).cancel_requested_at is None


def test_the_preview_counts_then_the_confirmed_run_changes_those_tasks_and_lists_each(
    client: Client, make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    one, two = paused(make_task, agent_lease), paused(make_task, agent_lease)
    done = paused(make_task, agent_lease)
    ada = person("ada", "admin")
    takeover_claim(actor=ada, task_id=done.pk)
    client.force_login(ada.user)
    client.post(reverse("bulk"), {})  # an empty confirmation: refused, nothing written
    assert not BulkRun.objects.exists()
    page = client.get(PREVIEW)
    assert page.status_code == 200 and "HX-Request" in page["Vary"]
    assert b"Type 3 to confirm" in page.content
    assert b"3 tasks will change" in page.content
    partial = client.get(PREVIEW, headers={"HX-Request": "true"})  # the operation chooser's hx-get
    assert partial.status_code == 200 and b"<html" not in partial.content and b"Type 3 to confirm" in partial.content
    # A wrong typed count is refused: nothing recorded.
    assert client.post(reverse("bulk"), confirm_data(page.content, "2")).status_code == 400
    assert not BulkRun.objects.exists()
    response = client.post(reverse("bulk"), confirm_data(page.content, "3"))
    assert response.status_code == 303
    run = BulkRun.objects.get()
    assert response["Location"] == reverse("bulk-run", args=[run.pk])
    status = reverse("bulk-run-status", args=[run.pk])
    assert client.get(status, headers={"HX-Request": "true"}).status_code == 200  # still to do: keeps polling
    bulk_run_apply(run_id=run.pk)
    for task in (one, two, done):
        assert Task.objects.get(pk=task.pk).cancel_requested_at is not None
        assert AuditEvent.objects.filter(task_id=task.pk, action="cancel_requested").count() == 1
        assert Event.objects.filter(task=task, type="cancel_requested").count() == 1
    polled = client.get(status, headers={"HX-Request": "true"})
    assert polled.status_code == 286  # htmx: stop polling
    assert b"3 done, 0 skipped, 0 failed, 0 to do" in polled.content and b"<html" not in polled.content
    full = client.get(status)
    assert full.status_code == 200 and b"<html" in full.content


def test_a_task_that_moves_after_the_preview_is_skipped_listed_and_untouched(
    client: Client, make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    still, moved = paused(make_task, agent_lease), paused(make_task, agent_lease)
    ada = person("ada", "admin")
    client.force_login(ada.user)
    page = client.get(PREVIEW).content
    takeover_claim(actor=person("bob", "admin"), task_id=moved.pk)
    before = task_state(moved)
    assert client.post(reverse("bulk"), confirm_data(page, "2")).status_code == 303
    run = BulkRun.objects.get()
    bulk_run_apply(run_id=run.pk)
    assert task_state(moved) == before
    assert Task.objects.get(pk=still.pk).cancel_requested_at is not None
    shown = client.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert f"#{moved.pk}</a>" in shown and "Changed since the preview" in shown


def test_an_id_injected_into_the_confirmation_is_never_changed(
    client: Client, make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    mine, not_mine = paused(make_task, agent_lease, "granted to ann"), paused(make_task, agent_lease, "secret merger")
    ann = person("ann", "operator")
    assign_perm(OPERATE, ann.user, mine)
    client.force_login(ann.user)
    page = client.get(PREVIEW).content
    data = confirm_data(page, "2")
    data["seen"] += f" {not_mine.pk}:{not_mine.version}:-"
    before = task_state(not_mine)
    assert client.post(reverse("bulk"), data).status_code == 303
    bulk_run_apply(run_id=BulkRun.objects.get().pk)
    assert task_state(not_mine) == before
    assert BulkRunItem.objects.get(task_id=not_mine.pk).status == BulkItemStatus.SKIPPED
    assert BulkRunItem.objects.get(task_id=mine.pk).status == BulkItemStatus.DONE
    shown = client.get(reverse("bulk-run", args=[BulkRun.objects.get().pk])).content.decode()
    assert f'#{not_mine.pk} <span class="muted">(not yours to see)</span>' in shown
    assert not_mine.title not in shown.replace(mine.title, "")


def test_an_altered_preview_token_is_refused(
    client: Client, make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    paused(make_task, agent_lease)
    client.force_login(person("ada", "admin").user)
    data = confirm_data(client.get(PREVIEW).content, "1")
    data["seen"] = "1:1:1; DROP TABLE"
    assert client.post(reverse("bulk"), data).status_code == 400
    assert not BulkRun.objects.exists()


@pytest.mark.parametrize("page", ["preview", "run"])
def test_the_bulk_pages_read_the_same_number_of_queries_for_3_and_30_tasks(
    client: Client, make_task: Callable[..., Task], page: str
) -> None:
    ada = person("ada", "admin")
    client.force_login(ada.user)
    counts = []
    made: list[Task] = []
    for n in (3, 30):
        made += [make_task(chain_plan("a"), project=PROJECT, title=f"t{i}") for i in range(n - len(made))]
        url = PREVIEW
        if page == "run":
            run = bulk_run_create(
                actor=ada, operation="cancel", reason=REASON, seen=[Seen(t.pk, t.version, None) for t in made]
            )
            bulk_run_apply(run_id=run.pk)
            url = reverse("bulk-run", args=[run.pk])
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200
        counts.append(len(queries))
    # Session, user, roles; the preview: the tasks with their lease facts, the operable ones, the database clock; the
    # run page: the run, its items, the titles of the tasks the reader may see (and the run's actor, for its name).
    assert counts == [PINNED[page]] * 2, counts


def test_a_history_restore_of_a_pushed_preview_gets_the_whole_page(
    client: Client, make_task: Callable[..., Task], agent_lease: Callable[..., Lease]
) -> None:
    paused(make_task, agent_lease)
    client.force_login(person("ada", "admin").user)
    restored = client.get(PREVIEW, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert restored.status_code == 200 and b"<html" in restored.content
