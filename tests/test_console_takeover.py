"""The takeover screen, tried as someone who should not get through would: every page and every
HTMX endpoint refuses the logged-out, the role-less, the user who may not see the task, the auditor and a POST
without a CSRF token; a stale form or a stale renewal writes nothing; the staged review writes nothing until it is
confirmed; a resume wakes the agent only once the decision is committed; the page costs a fixed number of queries."""

import html
import importlib
import json
import pkgutil
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import tasks.jobs
from audit.models import AuditEvent
from audit.principals import Principal
from console.errors import SENTENCES, message_for
from leases.errors import LeaseError
from leases.models import Lease
from leases.services import lease_open, lease_release
from tasks.access.permissions import permission_grant
from tasks.core.errors import TaskError, VersionConflict
from tasks.core.lifecycle import NodeStatus, PauseReason, TaskStatus
from tasks.engine.protocol import inputs_confirm, snapshot_at
from tasks.models import Event, Node, PlanRevision, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import takeover_claim, takeover_submit
from tests.conftest import SOURCE_REF, chain_plan, copy_node, effect_node, person, snapshot
from tests.steps import asked, version

pytestmark = pytest.mark.django_db


def approval(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "action": "approval", "evidence": {"remote_id": True}, **extra}


@pytest.fixture
def root() -> Principal:
    return person("root", "admin")


@pytest.fixture
def task(make_task: Callable[..., Task], clock: Any) -> Task:
    return make_task({"nodes": [approval("ok"), copy_node(depends_on=["ok"]), effect_node("b", depends_on=["copy"])]})


@pytest.fixture
def ann(root: Principal, task: Task) -> Principal:
    operator = person("ann", "operator")
    permission_grant(actor=root, user=operator.user, task=task)
    return operator


@pytest.fixture
def browser(client: Client, ann: Principal) -> Client:
    client.force_login(ann.user)
    return client


def text(response: Any) -> str:
    """The response's HTML with entities decoded (what a person reads)."""
    return html.unescape(response.content.decode())


def url(name: str, task: Task) -> str:
    return reverse(name, args=[task.pk])


def held(ann: Principal, task: Task) -> Lease:
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert claim.granted and claim.lease is not None
    return claim.lease


def counts() -> tuple[int, int]:
    return Event.objects.count(), AuditEvent.objects.count()


def fresh(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def result_data(task: Task, lease: Lease, stage: str, **extra: Any) -> dict[str, Any]:
    data = {
        "expected_version": version(task),
        "epoch": lease.epoch,
        "stage": stage,
        "decision": "resume_agent",
        "n-copy-remote_id": "batch-1",
        "n-copy-remote_version": SOURCE_REF["version"],
        "n-copy-digest": SOURCE_REF["digest"],
        "n-copy-count": "100",
        "n-copy-evidence": "console_url: https://store.example/batches/1",
    }
    data.update(extra)
    return data


# --- access: every endpoint, every persona that must not get through --------------------------------------------

ENDPOINTS = [
    ("get", "takeover"),
    ("get", "takeover-lease"),
    ("get", "takeover-replan"),
    ("post", "takeover-claim"),
    ("post", "takeover-withdraw"),
    ("post", "takeover-renew"),
    ("post", "takeover-release"),
    ("post", "takeover-submit"),
    ("post", "takeover-approve"),
    ("post", "takeover-replan"),
    ("post", "takeover-replan-accept"),
]


def _post_data(task: Task) -> dict[str, Any]:
    return {
        "epoch": 1,
        "renewal_seq": 0,
        "expected_version": version(task),
        "node_key": "ok",
        "stage": "confirm",
        "decision": "resume_agent",
        "revision_id": 1,
        "plan": '{"nodes": []}',
        "reason": "a reason long enough",
    }


@pytest.mark.parametrize(("method", "name"), ENDPOINTS)
def test_a_logged_out_visitor_is_sent_to_log_in(client, task, method, name) -> None:
    before = snapshot()
    response = getattr(client, method)(url(name, task), _post_data(task) if method == "post" else None)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert snapshot() == before


@pytest.mark.parametrize(("method", "name"), ENDPOINTS)
@pytest.mark.parametrize(("who", "status"), [("outsider", 403), ("stranger-operator", 404), ("auditor", 403)])
def test_who_may_not_operate_the_task_is_refused_and_nothing_is_written(
    client, task, root, ann, method, name, who, status
) -> None:
    held(ann, task)  # the task is in use: a refusal must not disturb it
    user = {
        "outsider": lambda: person("eve"),
        "stranger-operator": lambda: person("olga", "operator"),
        "auditor": lambda: person("aud", "auditor"),
    }[who]()
    client.force_login(user.user)
    before = snapshot()
    response = getattr(client, method)(url(name, task), _post_data(task) if method == "post" else None)
    assert response.status_code == status
    assert snapshot() == before


@pytest.mark.parametrize(("method", "name"), [e for e in ENDPOINTS if e[0] == "post"])
def test_a_post_without_a_csrf_token_is_refused(task, ann, method, name) -> None:
    held(ann, task)
    client = Client(enforce_csrf_checks=True)
    client.force_login(ann.user)
    before = snapshot()
    response = client.post(url(name, task), _post_data(task))
    assert response.status_code == 403
    assert snapshot() == before


def test_the_lease_panel_link_opens_the_whole_page(browser, task, ann, clock) -> None:
    held(ann, task)
    response = browser.get(url("takeover-lease", task))
    assert response.status_code == 302 and response["Location"] == url("takeover", task)
    panel = browser.get(url("takeover-lease", task), HTTP_HX_REQUEST="true")
    assert 'id="lease-panel"' in text(panel) and "<html" not in text(panel)


def test_a_missing_task_is_404(browser) -> None:
    assert browser.get(reverse("takeover", args=[999999])).status_code == 404


def test_a_free_task_awaiting_approval_says_so(browser, task, clock) -> None:
    html = text(browser.get(url("takeover", task)))
    assert "Waiting for a person's approval: ok. Take the task over to approve." in html
    assert "Approve ok" not in html, "approving needs the takeover lease"


# --- claim, wait, renew, release --------------------------------------------------------------------------------


def test_a_claim_on_a_free_task_takes_it_and_the_page_keeps_the_lease(browser, task, clock) -> None:
    response = browser.post(url("takeover-claim", task))
    assert response.status_code == 303
    lease = lease_open(task.pk)
    assert lease is not None and (lease.holder_kind, lease.holder_id) == ("operator", "ann")
    assert fresh(task).status == TaskStatus.HUMAN
    html = text(browser.get(url("takeover", task)))
    assert "You hold this task" in html
    assert f'name="renewal_seq" value="{lease.renewal_seq}"' in html
    assert "load delay:40s" in html, "renewed every third of the 120 s operator ttl"
    assert 'data-seconds="120"' in html and "Expires in" in html
    assert response["Vary"] and "HX-Request" in response["Vary"]


def test_a_claim_on_an_agent_held_task_shows_the_wait_and_polls_until_granted(
    browser, task, agent_lease, clock
) -> None:
    agent = agent_lease(task)
    browser.post(url("takeover-claim", task))
    html = text(browser.get(url("takeover", task)))
    assert "Takeover requested" in html and "agent:agent-1 holds the task until" in html
    assert 'hx-post="{}"'.format(url("takeover-claim", task)) in html and "load delay:3s" in html
    assert lease_open(task.pk) == agent, "the agent keeps its lease until it lets go"

    polled = browser.post(url("takeover-claim", task), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="lease-panel")
    assert polled.status_code == 200 and "Takeover requested" in text(polled)
    assert 'id="lease-panel"' in text(polled) and "<html" not in text(polled)

    lease_release(lease=agent)
    granted = browser.post(url("takeover-claim", task), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="lease-panel")
    assert granted["HX-Refresh"] == "true"
    lease = lease_open(task.pk)
    assert lease is not None and lease.holder_id == "ann"


def test_a_task_another_person_holds_offers_no_claim(browser, task, root, clock) -> None:
    bob = person("bob", "operator")
    permission_grant(actor=root, user=bob.user, task=task)
    held(bob, task)
    html = text(browser.get(url("takeover", task)))
    assert "Held by operator:bob" in html and "Another person holds it" in html
    assert ">Take over<" not in html and "Submit a result" not in html
    before = snapshot()
    refused = browser.post(url("takeover-claim", task))  # the endpoint refuses, whatever the page shows
    assert refused.status_code == 303 and snapshot() == before
    assert SENTENCES["takeover_held"] in text(browser.get(url("takeover", task)))


def test_a_waiting_request_can_be_withdrawn_and_the_agent_goes_on(browser, task, agent_lease, clock) -> None:
    agent_lease(task)
    browser.post(url("takeover-claim", task))
    assert "Withdraw the request" in text(browser.get(url("takeover", task)))
    response = browser.post(url("takeover-withdraw", task))
    assert response.status_code == 303
    from leases.services import lease_reservation

    assert lease_reservation(task.pk) is None
    row = AuditEvent.objects.order_by("-seq").first()
    assert row is not None and (row.action, row.actor_id) == ("takeover_withdrawn", "ann")


def test_the_renewal_carries_the_seq_and_a_stale_one_is_refused(browser, task, ann, clock) -> None:
    lease = held(ann, task)
    ok = browser.post(
        url("takeover-renew", task),
        {"epoch": lease.epoch, "renewal_seq": 0},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="lease-panel",
    )
    assert ok.status_code == 200 and 'name="renewal_seq" value="1"' in text(ok)
    before = snapshot()
    stale = browser.post(
        url("takeover-renew", task),
        {"epoch": lease.epoch, "renewal_seq": 0},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="lease-panel",
    )
    assert stale.status_code == 409
    assert SENTENCES["renewal_out_of_order"] in text(stale)
    assert snapshot() == before


def test_a_renewal_from_an_older_grant_is_refused(browser, task, ann, clock) -> None:
    lease = held(ann, task)
    before = snapshot()
    response = browser.post(url("takeover-renew", task), {"epoch": lease.epoch + 1, "renewal_seq": 0})
    assert response.status_code == 409 and "no longer hold" in text(response)
    assert snapshot() == before


def test_the_page_warns_before_the_lease_expires(browser, task, ann, clock) -> None:
    held(ann, task)
    clock.advance(timedelta(seconds=100))
    html = text(browser.get(url("takeover", task)))
    assert 'data-seconds="20"' in html
    warning = re.search(r"<p class=\"warning\"[^>]*data-expiry-warning[^>]*>", html)
    assert warning is not None and "hidden" not in warning.group(0)
    assert "load delay:10s" in html, "a page opened late in the lease renews before it lapses"


def test_a_lease_in_its_grace_says_so_and_a_lapsed_one_offers_to_take_over_again(browser, task, ann, clock) -> None:
    lease = held(ann, task)
    clock.advance(timedelta(seconds=125))
    html = text(browser.get(url("takeover", task)))
    assert "Expired 5 s ago, in its grace" in html
    renewed = browser.post(url("takeover-renew", task), {"epoch": lease.epoch, "renewal_seq": 0})
    assert renewed.status_code == 200, "a renewal is accepted inside the grace"
    clock.advance(timedelta(seconds=140))
    html = text(browser.get(url("takeover", task)))
    assert "lapsed" in html and "Take over again" in html and "load delay" not in html
    before = snapshot()
    refused = browser.post(url("takeover-renew", task), {"epoch": lease.epoch, "renewal_seq": 1})
    assert refused.status_code == 409 and SENTENCES["lease_expired"] in text(refused)
    assert snapshot() == before


def test_release_with_a_reason_is_audited(browser, task, ann, clock) -> None:
    lease = held(ann, task)
    response = browser.post(url("takeover-release", task), {"epoch": lease.epoch, "reason": "lunch"})
    assert response.status_code == 303
    assert lease_open(task.pk) is None
    row = AuditEvent.objects.order_by("-seq").first()
    assert row is not None and (row.action, row.reason) == ("takeover_released", "lunch")


def test_the_lease_panel_stops_polling_once_the_task_has_ended(browser, task, ann, clock, root) -> None:
    lease = held(ann, task)
    takeover_submit(actor=ann, lease=lease, based_on_version=version(task), decision="end_task", end_status="failed")
    response = browser.get(url("takeover-lease", task), HTTP_HX_REQUEST="true")
    assert response.status_code == 286


# --- submit: staged review, confirm, stale, wake-up on commit ------------------------------------------------------


def _approved(ann: Principal, task: Task) -> Lease:
    from tasks.people.approvals import node_approve

    lease = held(ann, task)
    node_approve(actor=ann, task_id=task.pk, node_key="ok", expected_version=version(task), approving=asked(task, "ok"))
    return lease


def test_the_form_is_built_from_the_evidence_spec(browser, task, ann, clock) -> None:
    _approved(ann, task)
    html = text(browser.get(url("takeover", task)))
    for name in ("n-copy-remote_id", "n-copy-remote_version", "n-copy-digest", "n-copy-count", "n-copy-file"):
        assert f'name="{name}"' in html
    assert 'name="n-copy-count" min="0"' in html or 'type="number" name="n-copy-count"' in html
    assert "Must be 100" in html and "Must be '7'" in html
    assert 'name="n-b-count"' not in html, "b's spec asks only for the remote id"
    assert 'name="n-ok-remote_id"' not in html, "an approval node is approved, never given a typed receipt"


def test_the_review_writes_nothing_and_says_what_will_change(browser, task, ann, clock) -> None:
    lease = _approved(ann, task)
    before = snapshot()
    response = browser.post(url("takeover-submit", task), result_data(task, lease, "review"))
    assert response.status_code == 200, text(response)[:2000]
    assert snapshot() == before, "the staged review writes nothing"
    html = text(response)
    assert "Step <strong>copy</strong>: pending → succeeded" in html
    assert "Task: human → pending" in html and "re-reads its inputs" in html
    assert "<code>takeover_result_submitted</code>" in html
    assert "the agent is woken once this is committed" in html
    assert 'name="stage" value="confirm"' in html


def test_confirm_applies_it_and_wakes_the_agent_only_after_commit(
    browser, task, ann, clock, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    lease = _approved(ann, task)
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.jobs.drive_task, "delay", lambda *args: sent.append(args))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = browser.post(url("takeover-submit", task), result_data(task, lease, "confirm"))
        assert sent == [], "nothing is enqueued inside the transaction"
    assert response.status_code == 303
    after = fresh(task)
    assert after.status == TaskStatus.PENDING and after.inputs_recheck_required
    assert Node.objects.get(task=task, key="copy", plan_version=after.plan_version).status == NodeStatus.SUCCEEDED
    assert Event.objects.get(task=task, seq=after.version).type == "takeover_result_submitted"
    assert lease_open(task.pk) is None
    assert len(callbacks) == 1
    callbacks[0]()
    assert sent == [(task.pk,)]


def test_a_stale_result_is_refused_with_what_changed_and_nothing_is_written(browser, task, ann, root, clock) -> None:
    lease = _approved(ann, task)
    data = result_data(task, lease, "confirm")
    task_request_cancel(actor=root, task_id=task.pk, reason="the customer withdrew", expected_version=version(task))
    before, rows = snapshot(), counts()
    response = browser.post(url("takeover-submit", task), data)
    assert response.status_code == 409
    html = text(response)
    assert "The task changed since you opened this page" in html and "cancel requested" in html
    assert snapshot() == before and counts() == rows
    assert f'name="expected_version" value="{version(task)}"' in html, "the form is rebased for a new review"
    assert 'value="confirm"' not in html and 'value="batch-1"' in html, "entries kept; review again first"


def test_a_result_short_of_its_evidence_is_refused_by_name(browser, task, ann, clock) -> None:
    lease = _approved(ann, task)
    before = snapshot()
    response = browser.post(url("takeover-submit", task), result_data(task, lease, "review", **{"n-copy-count": "99"}))
    assert response.status_code == 409
    assert SENTENCES["evidence_insufficient"] in text(response)
    assert snapshot() == before


def test_an_invalid_form_is_400_and_writes_nothing(browser, task, ann, clock) -> None:
    lease = _approved(ann, task)
    before = snapshot()
    data = result_data(task, lease, "confirm", **{"n-copy-remote_id": "", "decision": "nope"})
    response = browser.post(url("takeover-submit", task), data)
    assert response.status_code == 400
    assert "A result for this step needs the remote id" in text(response)
    assert snapshot() == before


def test_an_attachment_is_stored_by_digest_at_review_and_recorded_at_confirm(
    browser, task, ann, clock, settings, tmp_path
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tasks.models import Attachment

    settings.DATA_DIR = tmp_path
    lease = _approved(ann, task)
    upload = SimpleUploadedFile("proof.txt", b"the batch is there")
    review = browser.post(url("takeover-submit", task), {**result_data(task, lease, "review"), "n-copy-file": upload})
    assert review.status_code == 200 and Attachment.objects.count() == 0
    stored = re.search(r'name="n-copy-stored" value="([0-9a-f]{64}) proof.txt"', text(review))
    assert stored is not None
    data = {**result_data(task, lease, "confirm"), "n-copy-stored": f"{stored.group(1)} proof.txt"}
    assert browser.post(url("takeover-submit", task), data).status_code == 303
    attachment = Attachment.objects.get()
    assert (attachment.name, attachment.sha256, attachment.node_key) == ("proof.txt", stored.group(1), "copy")


def test_an_attachment_past_the_cap_is_refused_by_its_size_before_it_is_read_or_stored(
    browser, task, ann, clock, settings, tmp_path
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tasks.people.attachments import ATTACHMENT_CAP_BYTES

    settings.DATA_DIR = tmp_path
    lease = _approved(ann, task)
    before = snapshot()
    upload = SimpleUploadedFile("dump.bin", b"x" * (ATTACHMENT_CAP_BYTES + 1))
    response = browser.post(url("takeover-submit", task), {**result_data(task, lease, "review"), "n-copy-file": upload})
    assert response.status_code == 400
    assert f"The file is {ATTACHMENT_CAP_BYTES + 1} bytes, over the 10 MiB cap" in text(response)
    assert snapshot() == before
    assert not (tmp_path / "attachments").exists()  # nothing stored, not even by digest


# --- approve ------------------------------------------------------------------------------------------------------


def test_an_approval_from_the_page_is_audited_and_in_the_log(browser, task, ann, clock) -> None:
    held(ann, task)
    html = text(browser.get(url("takeover", task)))
    assert "Approve ok" in html
    v = version(task)
    form = {"node_key": "ok", "expected_version": v, "approving": asked(task, "ok"), "note": "fine"}
    response = browser.post(url("takeover-approve", task), form)
    assert response.status_code == 303
    # What it permits is recorded first (nobody asked yet: the person took the task before the agent reached it).
    assert [e.type for e in Event.objects.filter(task=task, seq__gt=v).order_by("seq")] == [
        "approval_proposed",
        "node_approved",
    ]
    row = AuditEvent.objects.order_by("-seq").first()
    assert row is not None and (row.action, row.actor_id, row.reason) == ("node_approved", "ann", "fine")


def test_approve_and_hand_back_from_the_page_leaves_the_task_to_the_agent(
    browser, task, ann, clock, django_capture_on_commit_callbacks
) -> None:
    held(ann, task)
    assert "Approve ok and hand back to the agent" in text(browser.get(url("takeover", task)))
    v = version(task)
    with django_capture_on_commit_callbacks() as wakeups:
        response = browser.post(
            url("takeover-approve", task),
            {"node_key": "ok", "expected_version": v, "approving": asked(task, "ok"), "note": "fine", "resume": "on"},
        )
    assert response.status_code == 303
    assert [e.type for e in Event.objects.filter(task=task, seq__gt=v).order_by("seq")] == [
        "approval_proposed",
        "node_approved",
        "takeover_result_submitted",
    ]
    assert fresh(task).status == TaskStatus.PENDING and lease_open(task.pk) is None
    assert len(wakeups) == 1


def test_a_stale_approval_writes_nothing(browser, task, ann, clock) -> None:
    seen = version(task)
    held(ann, task)
    before, rows = snapshot(), counts()
    response = browser.post(
        url("takeover-approve", task), {"node_key": "ok", "expected_version": seen, "approving": asked(task, "ok")}
    )
    assert response.status_code == 409 and "takeover granted" in text(response)
    assert snapshot() == before and counts() == rows


def test_an_approval_without_the_lease_is_refused(browser, task, clock) -> None:
    before = snapshot()
    response = browser.post(
        url("takeover-approve", task),
        {"node_key": "ok", "expected_version": version(task), "approving": asked(task, "ok")},
    )
    assert response.status_code == 403 and "take the task over first" in text(response)
    assert snapshot() == before


# --- re-plan as a person ----------------------------------------------------------------------------------------


def _input_changed(make_task: Callable[..., Task], agent_lease: Callable[..., Lease], root: Principal) -> Task:
    """A task whose source moved to version 8 while a person had it: paused input_changed."""
    task = make_task({"nodes": [effect_node("prep"), copy_node(depends_on=["prep"])]})
    operator = person("ann", "operator")
    permission_grant(actor=root, user=operator.user, task=task)
    lease = held(operator, task)
    takeover_submit(actor=operator, lease=lease, based_on_version=version(task), decision="resume_agent")
    agent = agent_lease(task)
    inputs_confirm(
        snapshot_at(task_id=task.pk, lease=agent, expected_version=version(task)), {"copy.source": "8"}, lease=agent
    )
    lease_release(lease=agent)
    assert (fresh(task).status, fresh(task).status_reason) == (TaskStatus.PAUSED, PauseReason.INPUT_CHANGED)
    return task


def test_after_input_changed_the_replan_keeps_the_unchanged_part_and_is_proposed_and_accepted_as_the_person(
    client, make_task, agent_lease, root, clock, django_capture_on_commit_callbacks
) -> None:
    task = _input_changed(make_task, agent_lease, root)
    ann = Principal.of_user(task_user("ann"))
    client.force_login(ann.user)
    held(ann, task)
    page = text(client.get(url("takeover-replan", task)))
    assert "copy.source: version 7 → 8" in page
    assert "keeps the unchanged part (prep)" in page
    assert '"version": "8"' in page
    moved = copy_node(depends_on=["prep"])
    moved["input"]["source"]["ref"] = {**SOURCE_REF, "version": "8"}
    plan = {"nodes": [effect_node("prep"), moved]}

    proposed = client.post(
        url("takeover-replan", task),
        {"expected_version": version(task), "plan": json.dumps(plan), "reason": "the source moved to version 8"},
    )
    assert proposed.status_code == 303
    revision = PlanRevision.objects.get(task=task, status="proposed")
    assert revision.proposed_by == "user:ann"
    audit = AuditEvent.objects.order_by("-seq").first()
    assert audit is not None and (audit.action, audit.actor_id) == ("plan_proposed", "ann")
    page = text(client.get(url("takeover-replan", task)))
    assert "Kept, with their receipts: none" in page or "Run (again)" in page
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        accepted = client.post(
            url("takeover-replan-accept", task), {"expected_version": version(task), "revision_id": revision.pk}
        )
    assert accepted.status_code == 303
    after = fresh(task)
    assert (after.status, after.plan_version, after.inputs_recheck_required) == (TaskStatus.PENDING, 2, True)
    assert lease_open(task.pk) is None and len(callbacks) == 1
    audit = AuditEvent.objects.order_by("-seq").first()
    assert audit is not None and (audit.action, audit.actor_id) == ("plan_accepted_after_replan", "ann")


def task_user(name: str) -> Any:
    from django.contrib.auth.models import User

    return User.objects.get(username=name)


def test_a_stale_replan_writes_nothing(browser, task, ann, clock) -> None:
    seen = version(task)
    held(ann, task)
    before = snapshot()
    response = browser.post(
        url("takeover-replan", task),
        {
            "expected_version": seen,
            "plan": '{"nodes": [{"key": "a", "action": "store.copy_batch", "evidence": {"remote_id": true}}]}',
            "reason": "a reason long enough",
        },
    )
    assert response.status_code == 409 and "changed since" in text(response)
    assert snapshot() == before


def test_a_replan_without_the_lease_is_refused(browser, task, clock) -> None:
    before = snapshot()
    response = browser.post(
        url("takeover-replan", task),
        {
            "expected_version": version(task),
            "plan": '{"nodes": [{"key": "a", "action": "store.copy_batch", "evidence": {"remote_id": true}}]}',
            "reason": "a reason long enough",
        },
    )
    assert response.status_code == 403
    assert snapshot() == before


def test_an_invalid_plan_is_refused_with_its_problems(browser, task, ann, clock) -> None:
    held(ann, task)
    before = snapshot()
    response = browser.post(
        url("takeover-replan", task),
        {"expected_version": version(task), "plan": '{"nodes": [{"key": "a"}]}', "reason": "a reason long enough"},
    )
    assert response.status_code == 409 and SENTENCES["plan_invalid"] in text(response)
    assert snapshot() == before


# --- queries: a fixed number, whatever the plan's size ------------------------------------------------------------


@pytest.mark.parametrize("size", [3, 30])
def test_the_page_costs_the_same_queries_for_3_nodes_as_for_30(client, make_task, root, clock, size) -> None:
    task = make_task(chain_plan(*[f"n{i}" for i in range(size)]))
    ann = person("ann", "operator")
    permission_grant(actor=root, user=ann.user, task=task)
    held(ann, task)
    client.force_login(ann.user)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url("takeover", task)).status_code == 200
    assert len(queries) == TAKEOVER_PAGE_QUERIES, [q["sql"][:90] for q in queries.captured_queries]


# session, user, roles, the task, 2 guardian permission reads (user and group permissions: one can_operate), the open
# lease, the reservation, the proposals, (a task taken over) the event that had paused it, the open operations for the
# state sentence (tasks/reads/state.py; the newest lease is the open one here), the plan's counts, the plan whole only
# if it holds an approval node (none here), the result form's first steps, and the takeover package (its first
# succeeded and not-done nodes, the operations' counts, the first open operations, the newest receipts: 5). Nothing
# per node (tests/test_takeover_package_size.py: the same at 10,000 nodes). (The database clock is the controllable
# one here; on the real one, one more: SELECT its time.)
TAKEOVER_PAGE_QUERIES = 19


@pytest.mark.parametrize("size", [3, 30])
# The replan page: access (6, as the takeover page), the takeover state (3: its plan's nodes are read only by the
# pages that show them), the draft (task, plan revision, the last acceptance, the rechecks since), the proposal's
# effect (task, nodes) and its document (deferred on the takeover page): 16 with one proposal; each further proposal
# shown (3 at most) adds its document and effect. The lease panel: access and the takeover state (9).
@pytest.mark.parametrize(("name", "budget"), [("takeover-lease", 9), ("takeover-replan", 16)])
def test_the_lease_panel_and_the_replan_page_cost_a_fixed_number_of_queries(
    client, make_task, root, clock, size, name, budget
) -> None:
    from tasks.people.replan import plan_propose_by_person

    task = make_task(chain_plan(*[f"n{i}" for i in range(size)]))
    ann = person("ann", "operator")
    permission_grant(actor=root, user=ann.user, task=task)
    held(ann, task)
    plan_propose_by_person(
        actor=ann,
        task_id=task.pk,
        plan=chain_plan(*[f"n{i}" for i in range(size)]),
        expected_version=version(task),
        reason="the same plan, proposed again",
    )
    client.force_login(ann.user)
    headers = {"HTTP_HX_REQUEST": "true"} if name == "takeover-lease" else {}
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url(name, task), **headers).status_code == 200
    assert len(queries) == budget, [q["sql"][:90] for q in queries.captured_queries]


def test_a_stale_plan_acceptance_writes_nothing(browser, task, ann, clock) -> None:
    from tasks.people.replan import plan_propose_by_person

    held(ann, task)
    plan = {"nodes": [effect_node("a")]}
    seen = version(task)
    revision = plan_propose_by_person(
        actor=ann, task_id=task.pk, plan=plan, expected_version=seen, reason="a smaller plan for this task"
    )
    before, rows = snapshot(), counts()
    response = browser.post(url("takeover-replan-accept", task), {"expected_version": seen, "revision_id": revision.pk})
    assert response.status_code == 303
    assert snapshot() == before and counts() == rows
    page = text(browser.get(url("takeover", task)))
    assert "The task changed since you opened this page" in page and "plan proposed" in page


# --- refusals as sentences --------------------------------------------------------------------------------------


def _subclasses(base: type) -> set[type]:
    found: set[type] = set()
    sub: type
    for sub in base.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_every_named_refusal_has_a_sentence() -> None:
    for package in ("tasks", "leases", "retention", "audit"):  # every module that may name a refusal is loaded
        for found in pkgutil.iter_modules(importlib.import_module(package).__path__):
            if not found.ispkg and not found.name.startswith("test"):
                importlib.import_module(f"{package}.{found.name}")
    refusals = _subclasses(TaskError) | _subclasses(LeaseError) | {TaskError, LeaseError}
    codes = {getattr(cls, "code", "") for cls in refusals}
    assert codes - set(SENTENCES) == set()


def test_a_stale_form_message_lists_the_events_since() -> None:
    error = VersionConflict(
        "x", expected=3, actual=5, changes=[{"seq": 4, "type": "takeover_granted"}, {"seq": 5, "type": "node_approved"}]
    )
    assert message_for(error).endswith("Version 3 → 5: #4 takeover granted, #5 node approved.")
