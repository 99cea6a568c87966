"""The task detail page: who may open it, what each state says it waits for — from live rows —,
the order of the operations, a timeline that pages without repeating or skipping, a lease panel on the database
clock that stops polling once the task has ended, and a query count that does not grow with the rows."""

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse

from audit.principals import Principal
from console.views import detail as views
from leases.services import lease_reserve
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed, NotFound
from tasks.engine.verification import task_quarantine
from tasks.models import Node, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import takeover_claim
from tasks.reads import detail as reads
from tests.conftest import chain_plan, effect_node, person, snapshot
from tests.steps import record, send, version

pytestmark = pytest.mark.django_db

CREATOR = Principal.agent("tester")  # make_task's tasks are created by agent:tester: it may cancel them


@pytest.fixture
def admin(client: Client) -> Client:
    client.force_login(person("ada", "admin").user)
    return client


def page(client: Client, task: Task, **params: str) -> str:
    response = client.get(reverse("task-detail", args=[task.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, section_id: str) -> str:
    start = html.index(f'id="{section_id}"')
    return html[start : html.index("</section>", start)]


def interrupted() -> Failed:
    return Failed(FailureClass.CONNECTION_INTERRUPTED, "read timeout after sending")


def parallel(*keys: str) -> dict[str, list[dict[str, object]]]:
    return {"nodes": [effect_node(key) for key in keys]}


HEADLINES = {
    "stopping": "Stopping — waiting for operations already sent",
    "stopped_pending": "Stopped, reconciliation pending",
    "completed": "Completed — every node's receipt satisfied its evidence",
}


# --- who may open it -----------------------------------------------------------------------------------------------

URLS = [("get", "task-detail"), ("get", "task-lease-panel"), ("post", "task-chain-check")]


@pytest.mark.parametrize(("method", "name"), URLS)
def test_a_logged_out_visitor_is_sent_to_the_login_page(client, make_task, method, name) -> None:
    task = make_task()
    response = getattr(client, method)(reverse(name, args=[task.pk]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse(settings.LOGIN_URL) + "?next=")


@pytest.mark.parametrize(("method", "name"), URLS)
def test_a_user_without_a_reckon_role_is_refused(client, make_task, method, name) -> None:
    task = make_task()
    client.force_login(person("olive").user)
    assert getattr(client, method)(reverse(name, args=[task.pk])).status_code == 403


@pytest.mark.parametrize(("method", "name"), URLS)
def test_an_operator_not_granted_the_task_gets_the_same_404_as_for_a_missing_task(
    client, make_task, method, name
) -> None:
    task = make_task()
    client.force_login(person("otto", "operator").user)
    hidden = getattr(client, method)(reverse(name, args=[task.pk]))
    missing = getattr(client, method)(reverse(name, args=[task.pk + 1000]))
    assert hidden.status_code == missing.status_code == 404
    assert without_tokens(hidden.content) == without_tokens(missing.content)


def without_tokens(html: bytes) -> str:
    return re.sub(r"[A-Za-z0-9]{64}", "<token>", html.decode())


def test_an_operator_granted_the_task_sees_it_and_its_action_links(client, make_task) -> None:
    task = make_task(title="migrate acme")
    otto = person("otto", "operator")
    permission_grant(actor=person("ada", "admin"), user=otto.user, task=task)
    client.force_login(otto.user)
    html = page(client, task)
    assert "migrate acme" in html
    assert "Take over…" in html and "Cancel, reconcile…" in html


@pytest.mark.parametrize("ended", ["completed", "quarantined"])
def test_an_ended_or_quarantined_task_offers_no_takeover(admin, make_task, agent_lease, clock, ended) -> None:
    task = make_task(chain_plan("a"))
    if ended == "completed":
        lease = agent_lease(task)
        record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    else:
        task_quarantine(task_id=task.pk, expected_version=version(task), reason="broken chain")
    assert Task.objects.get(pk=task.pk).status == ended
    html = page(admin, task)
    assert "Take over…" not in html and "Cancel, reconcile…" in html


def test_an_auditor_sees_the_task_but_no_action_link(client, make_task) -> None:
    task = make_task(title="migrate acme")
    client.force_login(person("aud", "auditor").user)
    html = page(client, task)
    assert "migrate acme" in html
    assert "Take over…" not in html and "Cancel, reconcile…" not in html


def test_the_chain_check_refuses_a_post_without_a_csrf_token(make_task) -> None:
    task = make_task()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person("ada", "admin").user)
    before = snapshot()
    assert browser.post(reverse("task-chain-check", args=[task.pk])).status_code == 403
    assert snapshot() == before


def test_the_chain_check_reports_a_problem_and_writes_nothing(admin, make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    Task.objects.filter(pk=task.pk).update(attempts_used=0)  # the row no longer matches its log
    before = snapshot()
    response = admin.post(reverse("task-chain-check", args=[task.pk]), headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "The record does not verify" in html and "attempts_used" in html
    assert snapshot() == before  # a page reads: the verify_log job quarantines, not this button
    assert Task.objects.get(pk=task.pk).status != "quarantined"


@pytest.mark.parametrize("role", ["auditor", "operator"])
def test_whoever_may_see_the_task_may_check_its_chain_and_nothing_is_written(client, make_task, role) -> None:
    """Checking reads: it is no action, so an auditor may ask too (an operator only for a task granted to them)."""
    task = make_task()
    reader = person("rita", role)
    if role == "operator":
        permission_grant(actor=person("ada", "admin"), user=reader.user, task=task)
    client.force_login(reader.user)
    before = snapshot()
    response = client.post(reverse("task-chain-check", args=[task.pk]), headers={"HX-Request": "true"})
    assert response.status_code == 200 and "Hash chain verified" in response.content.decode()
    assert snapshot() == before


def test_the_chain_check_without_htmx_renders_the_whole_page_with_the_result(admin, make_task) -> None:
    task = make_task()
    response = admin.post(reverse("task-chain-check", args=[task.pk]))
    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html and "Hash chain verified" in html


def test_a_forged_timeline_cursor_is_a_bad_request(admin, make_task) -> None:
    task = make_task()
    assert admin.get(reverse("task-detail", args=[task.pk]), {"before": "nope"}).status_code == 400


# --- each state says what it waits for ------------------------------------------------------------------------------


def test_stopping_names_the_operations_in_flight_it_waits_for(admin, make_task, agent_lease, clock) -> None:
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    task_request_cancel(actor=CREATOR, task_id=task.pk, reason="wrong target")
    assert Task.objects.get(pk=task.pk).status == "stopping"
    state = section(page(admin, task), "state")
    assert HEADLINES["stopping"] in state
    assert "It waits for 1 operation in flight" in state
    assert f"<code>{op.op_key}</code> (node a): <strong>dispatched</strong>" in state
    assert "wrong target" in state and "No new operation can start" in state
    assert HEADLINES["stopped_pending"] not in state and HEADLINES["completed"] not in state


def test_stopped_pending_names_the_unknown_operations_and_who_must_settle_them(
    admin, make_task, agent_lease, clock
) -> None:
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    done = record(send(task, lease, "b"), Committed(remote_id="r-b"), lease)
    unknown = record(send(task, lease, "a"), interrupted(), lease)
    task_request_cancel(actor=CREATOR, task_id=task.pk, reason="stop")
    assert Task.objects.get(pk=task.pk).status == "stopped_pending"
    state = section(page(admin, task), "state")
    assert HEADLINES["stopped_pending"] in state
    assert "1 operation has an unknown outcome" in state
    assert "the reconciler (asking the remote by op key) or a person (settling by hand)" in state
    assert f"<code>{unknown.op_key}</code> (node a): <strong>unknown" in state
    assert done.op_key not in state
    assert HEADLINES["stopping"] not in state and HEADLINES["completed"] not in state


def test_completed_says_every_receipt_satisfied_its_evidence_and_what_cleanup_is_left(
    admin, make_task, agent_lease, clock
) -> None:
    task = make_task(chain_plan("a", "b"))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/acme-1"]}), lease)
    record(send(task, lease, "b"), Committed(remote_id="r-b"), lease)
    assert Task.objects.get(pk=task.pk).status == "completed"
    html = page(admin, task)
    state = section(html, "state")
    assert HEADLINES["completed"] in state
    assert "All 2 nodes of plan 1 succeeded, each with a receipt that meets its evidence spec" in state
    assert "Temp resource cleanup is still pending: 1 temp resource to delete" in state
    assert HEADLINES["stopping"] not in state and HEADLINES["stopped_pending"] not in state
    nodes = section(html, "nodes")
    assert nodes.count("satisfies the evidence spec") == 2
    assert "<code>r-a</code>" in nodes and "<code>r-b</code>" in nodes
    assert "staging/acme-1" in section(html, "temp")


def test_the_three_states_carry_distinct_icons(admin, make_task, agent_lease, clock) -> None:
    """Text and icon, never colour alone: each headline has its own glyph."""
    icons = set()
    for status in ("stopping", "stopped_pending", "completed"):
        task = make_task()
        Task.objects.filter(pk=task.pk).update(status=status)  # presentation only: the icon per status
        found = re.search(r'<h2 id="state-title"><span aria-hidden="true">(.+?)</span>', page(admin, task))
        assert found is not None
        icons.add(found.group(1))
    assert len(icons) == 3


def test_quarantined_says_why_and_that_nobody_may_act(admin, make_task, clock) -> None:
    task = make_task()
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="broken chain at seq 3")
    state = section(page(admin, task), "state")
    assert "Quarantined" in state and "Why: broken chain at seq 3" in state
    assert "Nobody may act on this task until an admin resolves it." in state


def test_paused_says_its_reason(admin, make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", max_attempts=1))
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.INVALID_PARAMS, "bad bucket"), lease)
    html = page(admin, task)
    assert Task.objects.get(pk=task.pk).status == "paused"
    assert "Paused: needs a new plan" in section(html, "state")
    assert 'id="package"' in html  # a paused task waits for a person: the takeover package is shown


def test_a_task_held_by_a_person_shows_the_takeover_package(admin, make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), interrupted(), lease)
    from leases.services import lease_release

    lease_release(lease=lease)
    takeover_claim(actor=person("ann", "admin"), task_id=task.pk)
    html = page(admin, task)
    package = section(html, "package")
    assert f"<code>{op.op_key}</code>" in package and "query the remote for op key" in package
    assert "Held by operator <strong>ann</strong>" in section(html, "lease-panel")


# --- nodes and operations -----------------------------------------------------------------------------------------


def test_unknown_operations_come_first(admin, make_task, agent_lease, clock) -> None:
    task = make_task(parallel("a", "b", "c"))
    lease = agent_lease(task)
    committed = record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    clock.advance(timedelta(seconds=1))
    never = record(send(task, lease, "b"), NotFound(), lease)  # back to intent
    clock.advance(timedelta(seconds=1))
    unknown = record(send(task, lease, "b"), interrupted(), lease)
    ops = section(page(admin, task), "operations")
    keys = re.findall(r'<th scope="row"><code>([^<]+)</code></th>', ops)
    assert never.op_key == unknown.op_key  # the same intent keeps its key
    assert keys == [unknown.op_key, committed.op_key]
    assert '<span aria-hidden="true">?</span> unknown' in ops


def test_the_nodes_show_their_inputs_versions_evidence_and_failure_destinations(admin, make_task) -> None:
    from tests.conftest import copy_node

    task = make_task({"nodes": [copy_node(on_failure={"invalid_params": "fail_task"})]})
    nodes = section(page(admin, task), "nodes")
    assert "store:projects/acme at version 7" in nodes
    assert "count = 100" in nodes and "digest equals the input source digest" in nodes
    assert "invalid_params → fail_task" in nodes
    node = Node.objects.get(task=task)
    assert f"attempts</span> 0 / {node.max_attempts}" in nodes


# --- the timeline -------------------------------------------------------------------------------------------------


def timeline_keys(html: str) -> list[str]:
    return re.findall(r"(event #\d+|audit #\d+)</span>", html)


def older_link(html: str) -> str | None:
    found = re.search(r'<li class="older"><a href="([^"#]*)', html)
    return found.group(1).replace("&amp;", "&") if found else None


@pytest.mark.parametrize("htmx", [True, False])
def test_the_timeline_pages_never_repeat_or_skip(admin, make_task, agent_lease, clock, monkeypatch, htmx) -> None:
    """Many entries share one instant (the test clock stands still): the cursor's (time, source, seq) still names
    one place. Entries written while someone pages are newer than every cursor: no later page shows them."""
    monkeypatch.setattr(views, "TIMELINE_PAGE_SIZE", 4)
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    for _ in range(4):
        record(send(task, lease, "a"), NotFound(), lease)
    send(task, lease, "a")
    task_request_cancel(actor=person("ada2", "admin"), task_id=task.pk, reason="audited")  # an audit row too
    with monkeypatch.context() as m:
        m.setattr(views, "TIMELINE_PAGE_SIZE", 1000)
        everything = timeline_keys(page(admin, task))
    assert len(everything) == version(task) + 1 and "audit #1" in everything
    seen: list[str] = []
    html = page(admin, task)
    seen += timeline_keys(html)
    clock.advance(timedelta(seconds=5))
    takeover_claim(actor=person("ann", "admin"), task_id=task.pk)  # newer than every cursor handed out
    link = older_link(html)
    while link is not None:
        headers = {"HX-Request": "true"} if htmx else {}
        response = admin.get(link, headers=headers)
        assert response.status_code == 200
        html = response.content.decode()
        assert ("<html" in html) is not htmx
        seen += timeline_keys(html)
        link = older_link(html)
    assert seen == everything
    assert len(seen) == len(set(seen))


# --- the lease panel ----------------------------------------------------------------------------------------------


HTMX = {"HX-Request": "true"}


def test_the_lease_panel_without_htmx_is_the_page_at_the_panel(admin, make_task, clock) -> None:
    task = make_task()
    response = admin.get(reverse("task-lease-panel", args=[task.pk]))
    assert response.status_code == 302
    assert response["Location"] == reverse("task-detail", args=[task.pk]) + "#lease-panel"


def lease_panel(client: Client, task: Task, **headers: str) -> "_MonkeyPatchedWSGIResponse":
    return client.get(reverse("task-lease-panel", args=[task.pk]), headers=headers)


def test_expires_in_follows_the_database_clock(admin, make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task, ttl=timedelta(seconds=30))
    panel = lease_panel(admin, task, **HTMX).content.decode()
    assert "Held by agent <strong>agent-1</strong>" in panel
    assert ">30 s</strong>" in panel and f"<dd>{lease.epoch}</dd>" in panel
    clock.advance(timedelta(seconds=12))
    assert ">18 s</strong>" in lease_panel(admin, task, **HTMX).content.decode()
    clock.advance(timedelta(seconds=20))
    grace = int(settings.RECKON_LEASE_GRACE.total_seconds())
    panel = lease_panel(admin, task, **HTMX).content.decode()
    assert "Expired 2 s ago, in its grace" in panel and f"for {grace - 2} s more" in panel
    clock.advance(settings.RECKON_LEASE_GRACE)
    assert "Lapsed" in lease_panel(admin, task, **HTMX).content.decode()
    assert "Lapsed" in section(page(admin, task), "lease-panel")  # the page shows the same panel


def test_the_panel_says_no_one_holds_the_task_and_who_waits(admin, make_task, clock) -> None:
    task = make_task()
    lease_reserve(task_id=task.pk, operator_id="ann")
    panel = lease_panel(admin, task, **HTMX).content.decode()
    assert "No one holds this task." in panel
    assert "Operator <strong>ann</strong> waits to take over" in panel


@pytest.mark.parametrize("ended_as", ["completed", "quarantined"])
def test_the_panel_polls_while_the_task_runs_and_stops_once_it_has_ended(
    admin, make_task, agent_lease, clock, ended_as
) -> None:
    """Ended is one definition (tasks.core.lifecycle.task_ended): a quarantined task changes no more than a completed
    one, so its page stops asking too."""
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    running = lease_panel(admin, task, **{"HX-Request": "true"})
    assert running.status_code == 200
    assert "every 5s [document.visibilityState === 'visible']" in running.content.decode()
    assert 'hx-trigger="every' in section(page(admin, task), "lease-panel")
    if ended_as == "completed":
        record(send(task, lease, "a"), Committed(remote_id="r-a"), lease)
    else:
        task_quarantine(task_id=task.pk, expected_version=version(task), reason="broken chain at seq 2")
    assert Task.objects.get(pk=task.pk).status == ended_as
    ended = lease_panel(admin, task, **{"HX-Request": "true"})
    assert ended.status_code == 286  # htmx: stop polling
    assert 'hx-trigger="every' not in ended.content.decode()
    assert 'hx-trigger="every' not in section(page(admin, task), "lease-panel")
    assert "HX-Request" in ended["Vary"]


# --- what it costs ------------------------------------------------------------------------------------------------

# session, user, roles (3); the task (1); events and audit rows of the timeline (2); the plan's counts, a page of
# nodes, their receipts, the operations' count, a page of operations, the open operations, the failed nodes, the plan
# whole if it holds an approval node, temp resources (9: tasks.reads.detail.task_detail); the newest lease with its
# forced release, the reservation (2); the chain check (tasks.engine.verification.task_verify_log: 18, whatever the
# log's length; one more per extra accepted plan revision); retained objects (1); the task's wake-up row, for a remote
# that stays down (1, by primary key; none once the task has ended). The test clock is no query; on the database
# clock, one more.
PAGE_QUERIES = 37


def page_queries(client: Client, task: Task) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("task-detail", args=[task.pk]))
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize("nodes", [3, 30])
def test_the_page_costs_the_same_for_3_nodes_as_for_30(admin, make_task, agent_lease, clock, nodes) -> None:
    keys = [f"n{i}" for i in range(nodes)]
    task = make_task(chain_plan(*keys))
    lease = agent_lease(task)
    for key in keys[:-1]:
        record(send(task, lease, key), Committed(remote_id=f"r-{key}", data={"temp": [f"tmp/{key}"]}), lease)
    assert page_queries(admin, task) == PAGE_QUERIES


@pytest.mark.parametrize("rounds", [4, 49])
def test_the_page_costs_the_same_for_10_events_as_for_100(admin, make_task, agent_lease, clock, rounds) -> None:
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    for _ in range(rounds):
        record(send(task, lease, "a"), NotFound(), lease)
    assert version(task) in (10, 100)
    assert page_queries(admin, task) == PAGE_QUERIES


def test_on_the_database_clock_the_page_reads_the_clock_once_more(admin, make_task) -> None:
    task = make_task()  # no test clock: leases.clock reads the database server's
    assert page_queries(admin, task) == PAGE_QUERIES + 1


# takeover_package (tasks/reads/takeover.py): the task, its plan's counts, its first succeeded and not-done nodes, its
# operations' counts, its first open operations, its newest receipts — each list capped, whatever the rows.
PACKAGE_QUERIES = 7


@pytest.mark.parametrize("nodes", [3, 30])
def test_a_page_with_the_takeover_package_costs_the_same_for_3_nodes_as_for_30(
    admin, make_task, agent_lease, clock, nodes
) -> None:
    keys = [f"n{i}" for i in range(nodes)]
    task = make_task(chain_plan(*keys))
    lease = agent_lease(task)
    for key in keys[:-1]:
        record(send(task, lease, key), Committed(remote_id=f"r-{key}"), lease)
    record(send(task, lease, keys[-1]), interrupted(), lease)
    lease_reserve(task_id=task.pk, operator_id="ann")  # a person waits: the package is shown
    assert page_queries(admin, task) == PAGE_QUERIES + PACKAGE_QUERIES


def test_a_long_log_is_not_verified_on_open_and_costs_fewer_queries(
    admin, make_task, agent_lease, clock, monkeypatch
) -> None:
    monkeypatch.setattr(reads, "CHECK_ON_OPEN_MAX_EVENTS", 5)
    task = make_task(parallel("a", "b"))
    lease = agent_lease(task)
    for _ in range(4):
        record(send(task, lease, "a"), NotFound(), lease)
    html = page(admin, task)
    assert "Hash chain not checked on open: this log has 10 events." in html
    assert page_queries(admin, task) < PAGE_QUERIES


def test_a_receipt_short_of_the_evidence_says_what_it_lacks(admin, make_task, agent_lease, clock) -> None:
    from tests.conftest import copy_node

    task = make_task({"nodes": [copy_node()]})
    lease = agent_lease(task)
    record(
        send(task, lease, "copy"),
        Committed(remote_id="r-1", count=99, digest="sha256:" + "ab" * 32, remote_version="7"),
        lease,
    )
    nodes = section(page(admin, task), "nodes")
    assert "does not satisfy it: receipt count is 99, the node expects 100" in nodes
    assert "<dt>count</dt><dd><code>99</code></dd>" in nodes
    assert "satisfies the evidence spec" not in nodes


def test_the_cleanup_sentence_is_derived_from_the_temp_resource_rows(make_task, clock) -> None:
    from datetime import timedelta

    from tasks.core.lifecycle import TempResourceStatus as S
    from tasks.models import TempResource
    from tasks.reads.detail import cleanup_sentence

    task, now = make_task(chain_plan("a")), clock.now()

    def temp(locator: str, status: str, **extra: Any) -> TempResource:
        return TempResource(task=task, locator=locator, status=status, created_at=now, retention_until=now, **extra)

    assert cleanup_sentence([]) == "This task recorded no temp resource: nothing to clean up."
    gone = [temp("t/1", S.DELETED), temp("t/2", S.DELETED)]
    assert cleanup_sentence(gone) == "No temp resource is left to clean up: 2 deleted, each with its cleanup receipt."
    later = now + timedelta(seconds=3)
    mixed = [*gone, temp("t/3", S.ACTIVE), temp("t/4", S.CLEANING, not_before=later), temp("t/5", S.STUCK)]
    assert cleanup_sentence(mixed) == (
        "Temp resource cleanup is still pending: 3 temp resources to delete (1 being deleted; the remote refused for "
        f"now; asked again from {later:%Y-%m-%d %H:%M:%S %Z}; 1 stuck: every delete was refused, a person must "
        "decide; 2 deleted, each with its cleanup receipt)."
    )
    # A deleted row's stale backoff says nothing: only the undone ones wait.
    assert "refused for now" not in cleanup_sentence([temp("t/6", S.DELETED, not_before=later), temp("t/7", S.ACTIVE)])
