"""Why a task a person took over had paused (issue 24: hazel's takeover page did not say). Taking a paused task over
clears its pause reason and detail on the task row; the event log keeps them, and the takeover page reads them
from there (tasks.reads.takeover.pause_before_takeover) — only the pause the takeover found, never an older one the
task has since left."""

from collections.abc import Callable
from html import unescape
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from leases.models import Lease
from leases.services import lease_open, lease_release
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Failed
from tasks.models import Task
from tasks.people.takeover import takeover_claim, takeover_submit
from tasks.reads.takeover import pause_before_takeover
from tests.conftest import chain_plan, person
from tests.steps import record, send, version

REFUSED = "the store answered 403 to switch_reference"


@pytest.fixture
def ann(db: None) -> Any:
    ann = person("ann", "operator")
    permission_grant(actor=person("root", "admin"), user=ann.user, kind="test")
    return ann


def paused(make_task: Callable[..., Task], agent_lease: Callable[..., Lease]) -> Task:
    """The remote refused the first step for lack of permission: paused, permission_revoked, the agent gone."""
    task = make_task(chain_plan("switch", "after"), title="Migrate project hazel")
    lease = agent_lease(task)
    record(send(task, lease, "switch"), Failed(FailureClass.PERMISSION_REVOKED, detail=REFUSED), lease)
    lease_release(lease=lease)
    task = Task.objects.get(pk=task.pk)
    assert (task.status, task.status_reason) == ("paused", "permission_revoked")
    assert REFUSED in task.status_detail
    return task


def own(task: Task) -> Lease:
    lease = lease_open(task.pk)
    assert lease is not None and lease.holder_kind == "operator"
    return lease


def page(client: Any, ann: Any, task: Task) -> str:
    client.force_login(ann.user)
    response = client.get(reverse("takeover", args=[task.pk]))
    assert response.status_code == 200
    return unescape(response.content.decode())


def test_a_paused_task_taken_over_says_why_it_paused(client, make_task, agent_lease, ann) -> None:
    task = paused(make_task, agent_lease)
    detail = task.status_detail
    assert pause_before_takeover(task) is None  # paused still: the row itself says why (the page's badge)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    taken = Task.objects.get(pk=task.pk)
    assert (taken.status, taken.status_reason, taken.status_detail) == ("human", "", "")  # the row forgot

    pause = pause_before_takeover(taken)
    assert pause is not None and (pause.reason, pause.detail) == ("permission_revoked", detail)
    html = page(client, ann, taken)
    assert "Paused before it was taken over: permission revoked." in html
    assert f"Detail: {detail}" in html and f"event #{pause.seq}" in html


def test_a_task_taken_from_a_running_agent_names_no_pause(client, make_task, agent_lease, ann) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    send(task, lease, "a")
    assert not takeover_claim(actor=ann, task_id=task.pk).granted  # reserved: the agent finishes its step first
    lease_release(lease=lease)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    taken = Task.objects.get(pk=task.pk)
    assert taken.status == "human"
    assert pause_before_takeover(taken) is None
    assert "Paused before" not in page(client, ann, taken)


def test_an_older_pause_the_task_has_left_is_not_shown(client, make_task, agent_lease, ann) -> None:
    """Paused, taken over, handed back to the agent, which ran on; taken over again from the running agent: the page
    does not blame the old pause."""
    task = paused(make_task, agent_lease)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    takeover_submit(actor=ann, lease=own(task), based_on_version=version(task), decision="resume_agent")
    lease = agent_lease(task)
    send(task, lease, "switch")
    assert Task.objects.get(pk=task.pk).status == "running"
    assert not takeover_claim(actor=ann, task_id=task.pk).granted
    lease_release(lease=lease)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    taken = Task.objects.get(pk=task.pk)
    assert taken.status == "human"
    assert pause_before_takeover(taken) is None
    assert "Paused before" not in page(client, ann, taken)


def test_a_replan_pause_then_a_takeover_names_the_new_pause(client, make_task, agent_lease, ann) -> None:
    """The person's own re-plan decision pauses the task (needs a new plan); the next takeover names that pause,
    with the reason the person gave, not the first one."""
    task = paused(make_task, agent_lease)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    takeover_submit(
        actor=ann,
        lease=own(task),
        based_on_version=version(task),
        decision="replan",
        replan_reason="the reference moved to another bucket",
    )
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    pause = pause_before_takeover(Task.objects.get(pk=task.pk))
    assert pause is not None
    assert (pause.reason, pause.detail) == ("needs_replan", "the reference moved to another bucket")
    assert "Paused before it was taken over: needs a new plan." in page(client, ann, task)


def test_the_lease_panel_does_not_read_the_pause(client, make_task, agent_lease, ann) -> None:
    """The panel polls every few seconds: it costs no query for what only the page's head shows."""
    task = paused(make_task, agent_lease)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    client.force_login(ann.user)
    url = reverse("takeover-lease", args=[task.pk])
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url, HTTP_HX_REQUEST="true").status_code == 200
    assert not [q for q in queries.captured_queries if "tasks_event" in q["sql"]]
