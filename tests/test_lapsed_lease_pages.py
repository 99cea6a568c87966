"""A person's takeover lease that lapsed (past its expiry and its grace) while their pages were open: every page
says so at the moment it is read — the task page, the actions page, the takeover page — none offers to reconcile
or decide with it, and every write made with it (settle by hand, ask the remote, submit a result) is a named
refusal shown as a message, never a server error, and writes nothing."""

import html
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from console.errors import SENTENCES
from leases.clock import ControllableClock
from leases.services import lease_open
from tasks.models import Operation, Task
from tasks.people.takeover import takeover_claim
from tests.conftest import snapshot
from tests.kinds import kind_registered
from tests.test_console_reconcile import KIND, NOTE, Remote, operator_of, settle, taken_over, version

pytestmark = pytest.mark.django_db

EXPIRED_AGO = 44  # seconds past the lease's expiry: well past its grace


def text(response: Any) -> str:
    """What a person reads: the response without its tags, entities decoded, whitespace collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", response.content.decode())))


def markup(response: Any) -> str:
    page: str = response.content.decode()
    return page


@pytest.fixture
def remote() -> Iterator[Remote]:
    """The test kind's remote, which records every op key it is asked about."""
    held = Remote()
    with kind_registered(KIND, connector=lambda: held):
        yield held


@pytest.fixture
def lapsed(
    client: Client, make_task: Any, agent_lease: Any, clock: ControllableClock
) -> tuple[Client, Task, Operation]:
    """An unknown operation on a task that ann took over, her lease now lapsed; she is logged in."""
    assert timedelta(seconds=EXPIRED_AGO) > settings.RECKON_LEASE_GRACE
    task, ann, op = taken_over(make_task, agent_lease)
    lease = lease_open(task.pk)
    assert lease is not None
    clock.set(lease.expires_at + timedelta(seconds=EXPIRED_AGO))
    client.force_login(ann.user)
    return client, task, op


def test_a_lapsed_lease_shows_as_lapsed_on_the_task_page(lapsed) -> None:
    client, task, _op = lapsed
    page = text(client.get(reverse("task-detail", args=[task.pk])))
    assert f"Lapsed: operator ann's lease expired {EXPIRED_AGO} s ago" in page


def test_a_lapsed_lease_shows_as_lapsed_on_the_actions_page_with_nothing_to_reconcile(lapsed) -> None:
    client, task, op = lapsed
    response = client.get(reverse("task-actions", args=[task.pk]))
    page = text(response)
    assert response.status_code == 200
    assert "that is you" not in page and "you may reconcile" not in page
    assert f"Lapsed: operator ann's lease expired {EXPIRED_AGO} s ago" in page
    assert "Query the remote now" not in page
    assert reverse("operation-settle", args=[task.pk, op.op_key]) not in markup(response)


def test_a_lapsed_lease_shows_as_lapsed_on_the_takeover_page_with_no_decision_to_make(lapsed) -> None:
    client, task, _op = lapsed
    page = text(client.get(reverse("takeover", args=[task.pk])))
    assert "Your lease lapsed" in page and "Take over again" in page
    assert "You hold this task" not in page
    assert "Submit a result and decide" not in page


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_settling_by_hand_with_a_lapsed_lease_is_refused_by_name_and_writes_nothing(lapsed, htmx) -> None:
    client, task, op = lapsed
    before = snapshot()
    headers = {"HX-Request": "true"} if htmx else {}
    data = {"version": version(task), "confirm": str(task.pk), "reason": NOTE, "resolution": "done"}
    response = client.post(
        reverse("operation-settle", args=[task.pk, op.op_key]), data | {"remote_id": "batch-1"}, headers=headers
    )
    assert response.status_code == 409
    assert SENTENCES["lease_expired"] in text(response)
    assert snapshot() == before


def test_settling_as_not_done_with_a_lapsed_lease_is_refused_by_name_and_writes_nothing(lapsed) -> None:
    client, task, op = lapsed
    before = snapshot()
    response = settle(client, task, op, resolution="not_done", remote_id="")
    assert response.status_code == 409
    assert SENTENCES["lease_expired"] in text(response)
    assert snapshot() == before


def test_asking_the_remote_with_a_lapsed_lease_asks_nothing_and_writes_nothing(lapsed, remote: Remote) -> None:
    client, task, op = lapsed
    before = snapshot()
    response = client.post(reverse("operation-query", args=[task.pk, op.op_key]), {"version": version(task)})
    assert response.status_code == 409
    assert SENTENCES["lease_expired"] in text(response)
    assert remote.asked == []
    assert snapshot() == before


def test_submitting_a_result_with_a_lapsed_lease_is_refused_by_name_and_writes_nothing(
    client: Client, make_task: Any, clock: ControllableClock
) -> None:
    task = make_task(kind=KIND)
    ann = operator_of(task)
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert claim.granted and claim.lease is not None
    clock.set(claim.lease.expires_at + timedelta(seconds=EXPIRED_AGO))
    client.force_login(ann.user)
    before = snapshot()
    data = {"expected_version": version(task), "epoch": claim.lease.epoch, "decision": "resume_agent"}
    response = client.post(reverse("takeover-submit", args=[task.pk]), data | {"stage": "confirm"})
    assert response.status_code == 409
    assert SENTENCES["lease_expired"] in text(response)
    assert snapshot() == before
