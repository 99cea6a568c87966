"""The task actions page and reconciliation: every endpoint refuses whoever may not act, a
stale page or a missing token writes nothing, asking the remote by op key records what it said, settling by hand
writes one event and one audit row, and a stuck temp resource can be made deletable again."""

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from guardian.shortcuts import assign_perm

from audit.models import AuditEvent
from audit.principals import Principal
from leases.services import lease_open, lease_release
from tasks.access.permits import permits
from tasks.core.lifecycle import PERMITS, Actor, ChangeKind, FailureClass, TaskStatus, TempResourceStatus, permitted
from tasks.core.outcomes import Committed, Failed, NotFound, Outcome
from tasks.engine.cleanup import cleanup_temp_resources
from tasks.models import Event, Operation, Task, TempResource
from tasks.people.takeover import takeover_claim
from tests.conftest import chain_plan, effect_node, person, snapshot
from tests.kinds import kind_registered
from tests.steps import past_deadline, record, send
from tests.test_permits import set_status

pytestmark = pytest.mark.django_db

KIND = "reconcile-test"
OPERATE = "tasks.operate_task"
NOTE = "checked the store's console: batch 1 is there"


class Remote:
    """An in-process remote for the test kind: it answers lookups by op key from what it holds."""

    def __init__(self) -> None:
        self.holds: dict[str, Outcome] = {}
        self.asked: list[str] = []

    def lookup(self, op_key: str) -> Outcome:
        self.asked.append(op_key)
        return self.holds.get(op_key, NotFound())

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        raise AssertionError("the console never sends")

    def current_version(self, locator: str) -> str:
        raise AssertionError("not asked")

    def delete(self, op_key: str, locator: str) -> Outcome:
        return self.deletes

    deletes: Outcome = Failed(FailureClass.PERMISSION_REVOKED, "delete is not allowed")

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        raise AssertionError("not asked")


@pytest.fixture
def remote() -> Iterator[Remote]:
    held = Remote()
    with kind_registered(KIND, connector=lambda: held):
        yield held


def operator_of(task: Task, name: str = "ann") -> Principal:
    """An operator granted this one task."""
    who = person(name, "operator")
    assign_perm(OPERATE, who.user, task)
    return who


def unknown_task(make_task: Callable[..., Task], agent_lease: Callable[..., Any], plan: Any = None) -> Task:
    """A task whose first operation's outcome is unknown, its agent gone."""
    task = make_task(plan or chain_plan("a", "b"), kind=KIND)
    lease = agent_lease(task)
    record(send(task, lease, "a"), Failed(FailureClass.CONNECTION_INTERRUPTED), lease)
    lease_release(lease=lease)
    return Task.objects.get(pk=task.pk)


def taken_over(make_task: Callable[..., Task], agent_lease: Callable[..., Any]) -> tuple[Task, Principal, Operation]:
    """An unknown operation, and an operator holding the takeover lease."""
    task = unknown_task(make_task, agent_lease)
    ann = operator_of(task)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    return Task.objects.get(pk=task.pk), ann, Operation.objects.get(task=task, status="unknown")


def stuck_temp(
    make_task: Callable[..., Task], agent_lease: Callable[..., Any], remote: "Remote"
) -> tuple[Task, TempResource]:
    """A completed task whose one temp resource the remote refused to delete MAX_CLEANUP_ATTEMPTS times."""
    task = make_task(chain_plan("a"), kind=KIND)
    lease = agent_lease(task)
    record(send(task, lease, "a"), Committed(remote_id="r-a", data={"temp": ["staging/a"]}), lease)
    report = cleanup_temp_resources(task_id=task.pk, lease=lease, connector=remote)
    assert report.stopped_by == "needs_person"
    lease_release(lease=lease)
    temp = TempResource.objects.get(task=task)
    assert temp.status == TempResourceStatus.STUCK
    return Task.objects.get(pk=task.pk), temp


def version(task: Task) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task.pk)


def endpoints(task: Task, op: Operation, temp_id: int) -> list[tuple[str, str]]:
    """Every endpoint of this screen group but force release (tests/test_console_force_release.py), with its
    method."""
    return [
        ("get", reverse("task-actions", args=[task.pk])),
        ("get", reverse("task-actions-status", args=[task.pk])),
        ("get", reverse("task-cancel", args=[task.pk])),
        ("post", reverse("task-cancel", args=[task.pk])),
        ("get", reverse("operation-settle", args=[task.pk, op.op_key])),
        ("post", reverse("operation-settle", args=[task.pk, op.op_key])),
        ("post", reverse("operation-query", args=[task.pk, op.op_key])),
        ("get", reverse("temp-reset", args=[task.pk, temp_id])),
        ("post", reverse("temp-reset", args=[task.pk, temp_id])),
    ]


def full_post(task: Task) -> dict[str, Any]:
    """A form that would pass every check: only the access check can refuse it."""
    return {
        "version": version(task),
        "confirm": str(task.pk),
        "reason": NOTE,
        "resolution": "not_done",
    }


@pytest.fixture
def scene(make_task, agent_lease, clock) -> tuple[Task, Operation, int]:
    task = unknown_task(make_task, agent_lease)
    op = Operation.objects.get(task=task, status="unknown")
    return task, op, 999_999


@pytest.mark.parametrize("who", ["logged_out", "outsider", "unseen", "auditor"])
def test_every_endpoint_refuses_whoever_may_not_act_and_writes_nothing(client, scene, who) -> None:
    task, op, temp_id = scene
    expected = {"logged_out": 302, "outsider": 403, "unseen": 404, "auditor": 403}[who]
    if who == "outsider":
        client.force_login(person("olga").user)
    elif who == "unseen":
        client.force_login(person("uma", "operator").user)  # an operator, not granted this task
    elif who == "auditor":
        client.force_login(person("audrey", "auditor").user)
    before = snapshot()
    for method, url in endpoints(task, op, temp_id):
        response = getattr(client, method)(url, full_post(task) if method == "post" else None)
        assert response.status_code == expected, (method, url, response.status_code)
        if who == "logged_out":
            assert response["Location"].startswith(reverse("login")), url
    assert snapshot() == before


def test_a_post_without_the_csrf_token_is_refused_and_writes_nothing(scene) -> None:
    task, op, temp_id = scene
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator_of(task).user)
    before = snapshot()
    for method, url in endpoints(task, op, temp_id):
        if method == "post":
            assert browser.post(url, full_post(task)).status_code == 403, url
    assert snapshot() == before


def test_the_page_lists_unprovable_and_unknown_operations_first_and_stuck_temps(
    client, make_task, agent_lease, clock
) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    html = client.get(reverse("task-actions", args=[task.pk])).content.decode()
    assert op.op_key in html
    assert "Query the remote now" in html
    assert "Taken over" in html
    assert "that is you" in html


def test_without_the_takeover_lease_the_page_says_take_over_first(client, make_task, agent_lease, clock) -> None:
    task = unknown_task(make_task, agent_lease)
    client.force_login(operator_of(task).user)
    html = client.get(reverse("task-actions", args=[task.pk])).content.decode()
    assert "take the task over first" in html
    assert "Query the remote now" not in html


# -- query the remote now ----------------------------------------------------------------------------------------


def test_query_the_remote_shows_the_receipt_it_found_and_records_it(
    client, make_task, agent_lease, clock, remote
) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    remote.holds[op.op_key] = Committed(remote_id="batch-1", remote_version="v9", count=100)
    client.force_login(ann.user)
    audits, events = AuditEvent.objects.count(), Event.objects.filter(task=task).count()
    response = client.post(reverse("operation-query", args=[task.pk, op.op_key]), {"version": version(task)})
    html = response.content.decode()
    assert response.status_code == 200
    assert "Receipt found: committed" in html and "batch-1" in html and "v9" in html
    assert remote.asked == [op.op_key]
    assert Operation.objects.get(pk=op.pk).status == "committed"
    assert Event.objects.filter(task=task).count() == events + 1
    audit = AuditEvent.objects.order_by("pk").last()
    assert AuditEvent.objects.count() == audits + 1
    assert audit is not None and audit.action == "operation_queried_by_person" and audit.actor_id == ann.id


def test_query_the_remote_shows_none_for_an_op_key_it_never_saw(client, make_task, agent_lease, clock, remote) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    response = client.post(reverse("operation-query", args=[task.pk, op.op_key]), {"version": version(task)})
    html = response.content.decode()
    assert response.status_code == 200
    assert "None: the remote has no record of this op key" in html
    assert Operation.objects.get(pk=op.pk).status == "intent"  # never took effect: the same key may be sent again


def test_query_the_remote_against_the_simulator(client, make_task, agent_lease, clock, simulator) -> None:
    """The real store process: an op key it never saw is none."""
    from reference.objectstore import ObjectStoreConnector

    with kind_registered(KIND, connector=lambda: ObjectStoreConnector(simulator.url)):
        task, ann, op = taken_over(make_task, agent_lease)
        client.force_login(ann.user)
        response = client.post(reverse("operation-query", args=[task.pk, op.op_key]), {"version": version(task)})
        assert "None: the remote has no record of this op key" in response.content.decode()


def test_query_the_remote_on_a_stale_page_asks_nothing_and_writes_nothing(
    client, make_task, agent_lease, clock, remote
) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    remote.holds[op.op_key] = Committed(remote_id="batch-1")
    client.force_login(ann.user)
    before = snapshot()
    response = client.post(reverse("operation-query", args=[task.pk, op.op_key]), {"version": version(task) - 1})
    assert response.status_code == 409
    assert "changed since" in response.content.decode()
    assert remote.asked == []
    assert snapshot() == before


def test_query_the_remote_needs_the_takeover_lease(client, make_task, agent_lease, clock, remote) -> None:
    task = unknown_task(make_task, agent_lease)
    op = Operation.objects.get(task=task, status="unknown")
    client.force_login(operator_of(task).user)
    before = snapshot()
    response = client.post(reverse("operation-query", args=[task.pk, op.op_key]), {"version": version(task)})
    assert response.status_code == 409  # takeover_required: a rule refused (console/errors.py: STATUS_OF)
    assert re.search(r"take (the )?task( \d+)? over", response.content.decode(), re.IGNORECASE)
    assert remote.asked == [] and snapshot() == before


# -- settle by hand ----------------------------------------------------------------------------------------------


def settle(client: Client, task: Task, op: Operation, **fields: Any) -> Any:
    data = {"version": version(task), "confirm": str(task.pk), "reason": NOTE, "resolution": "done"}
    data |= {"remote_id": "batch-1"} | fields
    return client.post(reverse("operation-settle", args=[task.pk, op.op_key]), data)


def test_the_settle_dialog_states_the_consequences(client, make_task, agent_lease, clock) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    url = reverse("operation-settle", args=[task.pk, op.op_key]) + "?resolution=not_done"
    html = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<div id="dialog"' in html and "<html" not in html  # the partial alone
    assert "never having taken effect" in html and "happens twice" in html
    assert f"Type {task.pk} to confirm" in html


def test_settle_by_hand_writes_one_event_and_one_audit_row(client, make_task, agent_lease, clock) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    audits, events = AuditEvent.objects.count(), Event.objects.filter(task=task).count()
    response = settle(client, task, op)
    assert response.status_code == 303, response.content.decode()[:2000]
    assert Operation.objects.get(pk=op.pk).status == "committed"
    assert Event.objects.filter(task=task).count() == events + 1
    assert AuditEvent.objects.count() == audits + 1
    audit = AuditEvent.objects.order_by("pk").last()
    assert audit is not None and audit.action == "operation_resolved_by_person" and audit.reason == NOTE


def test_settle_as_not_done_needs_no_receipt_and_lets_the_node_run_again(client, make_task, agent_lease, clock) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    page = client.get(reverse("operation-settle", args=[task.pk, op.op_key]) + "?resolution=not_done").content
    assert b'aria-current="true"><span aria-hidden="true">\xe2\x97\x8f</span> Not done' in page
    assert b"compensate" not in page.lower().split(b"<main")[1]  # the node declares no compensation
    past_deadline(clock, op)
    response = settle(client, task, op, resolution="not_done", remote_id="")
    assert response.status_code == 303
    settled = Operation.objects.get(pk=op.pk)
    assert (settled.status, settled.failure_class) == ("rejected", "not_done")
    assert task.nodes.get(key="a").status == "pending"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"confirm": "12345678"}, "Type exactly"),
        ({"confirm": ""}, "This field is required"),
        ({"reason": ""}, "This field is required"),
        ({"reason": "ok"}, "at least 10 characters"),
        ({"remote_id": ""}, "give the remote id"),
        ({"resolution": "not_done"}, "clear the receipt fields"),
    ],
)
def test_a_wrong_confirmation_or_missing_evidence_writes_nothing(
    client, make_task, agent_lease, clock, fields, says
) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    before = snapshot()
    response = settle(client, task, op, **fields)
    assert response.status_code == 400
    assert says in response.content.decode()
    assert snapshot() == before


def test_settle_by_hand_on_a_stale_page_writes_nothing(client, make_task, agent_lease, clock) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    client.force_login(ann.user)
    before = snapshot()
    response = settle(client, task, op, version=version(task) - 1)
    assert response.status_code == 409
    assert "changed since" in response.content.decode()
    assert snapshot() == before


# -- reset a stuck temp resource ---------------------------------------------------------------------------------


def test_reset_makes_a_stuck_temp_resource_deletable_again_audited(
    client, make_task, agent_lease, clock, remote
) -> None:
    task, temp = stuck_temp(make_task, agent_lease, remote)
    client.force_login(operator_of(task).user)
    page = client.get(reverse("temp-reset", args=[task.pk, temp.pk])).content.decode()
    assert "staging/a was refused deletion 3 times" in page
    audits = AuditEvent.objects.count()
    response = client.post(
        reverse("temp-reset", args=[task.pk, temp.pk]),
        {"version": version(task), "confirm": str(task.pk), "reason": "the delete permission is granted back"},
    )
    assert response.status_code == 303, response.content.decode()[:3000]
    assert TempResource.objects.get(pk=temp.pk).status == TempResourceStatus.ACTIVE
    assert Event.objects.filter(task=task).order_by("seq").last().type == "temp_resource_reset"  # type: ignore[union-attr]
    assert AuditEvent.objects.count() == audits + 1
    # The next run deletes it, under a new op key; the refused ones stay as they were.
    remote.deletes = Committed(remote_id="staging/a", count=1)
    lease = agent_lease(task)
    assert cleanup_temp_resources(task_id=task.pk, lease=lease, connector=remote).deleted == 1
    assert TempResource.objects.get(pk=temp.pk).status == TempResourceStatus.DELETED


@pytest.mark.parametrize(
    "fields", [{"confirm": "0"}, {"reason": ""}, {"version": 1}], ids=["wrong-confirm", "no-reason", "stale"]
)
def test_reset_refusals_write_nothing(client, make_task, agent_lease, clock, remote, fields) -> None:
    task, temp = stuck_temp(make_task, agent_lease, remote)
    client.force_login(operator_of(task).user)
    before = snapshot()
    data = {"version": version(task), "confirm": str(task.pk), "reason": "the delete permission is granted back"}
    response = client.post(reverse("temp-reset", args=[task.pk, temp.pk]), data | fields)
    assert response.status_code in (400, 409)
    assert snapshot() == before


# -- what the pages cost -----------------------------------------------------------------------------------------

ACTIONS_QUERIES = 10  # with the current plan's nodes, for the state sentence (tasks/reads/state.py)


@pytest.mark.parametrize("rows", [1, 12])
def test_the_actions_page_costs_the_same_queries_for_1_row_as_for_12(
    client, make_task, agent_lease, clock, rows
) -> None:
    from tests.test_consequences import in_flight

    task, ann, _op = taken_over(make_task, agent_lease)
    in_flight(task, rows, status="unknown")
    node = task.nodes.first()
    for index in range(rows):
        TempResource.objects.create(
            task=task,
            node=node,
            locator=f"staging/{index}",
            created_at=task.created_at,
            retention_until=task.created_at,
        )
    client.force_login(ann.user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("task-actions", args=[task.pk]))
    assert response.status_code == 200
    assert response.content.decode().count("Query the remote now") == rows + 1
    assert len(queries) == ACTIONS_QUERIES, [q["sql"][:100] for q in queries.captured_queries]


SETTLE_QUERIES = 7  # session, user, roles, task, 2 object-permission reads (access), the operation with its node
RESET_QUERIES = 9  # the same access (6), the temp resource, its task (for the op key prefix), its cleanup tries


@pytest.mark.parametrize("others", [0, 10])
def test_the_settle_and_reset_dialogs_cost_a_fixed_number_of_queries(
    client, make_task, agent_lease, clock, remote, others
) -> None:
    from tests.test_consequences import in_flight

    task, ann, op = taken_over(make_task, agent_lease)
    in_flight(task, others, status="unknown")
    client.force_login(ann.user)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse("operation-settle", args=[task.pk, op.op_key])).status_code == 200
    assert len(queries) == SETTLE_QUERIES, [q["sql"][:100] for q in queries.captured_queries]
    stuck, temp = stuck_temp(make_task, agent_lease, remote)
    client.force_login(operator_of(stuck, "bea").user)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse("temp-reset", args=[stuck.pk, temp.pk])).status_code == 200
    assert len(queries) == RESET_QUERIES, [q["sql"][:100] for q in queries.captured_queries]


def test_an_op_key_of_another_task_is_not_found_through_this_one(client, make_task, agent_lease, clock) -> None:
    task, ann, _op = taken_over(make_task, agent_lease)
    other = unknown_task(make_task, agent_lease)
    foreign = Operation.objects.get(task=other, status="unknown")
    client.force_login(ann.user)
    before = snapshot()
    assert client.get(reverse("operation-settle", args=[task.pk, foreign.op_key])).status_code == 404
    assert client.post(reverse("operation-query", args=[task.pk, foreign.op_key]), {"version": 1}).status_code == 404
    assert settle(client, task, foreign).status_code == 404
    assert snapshot() == before


def test_settle_as_compensate_commits_the_effect_and_registers_its_compensation(
    client, make_task, agent_lease, clock
) -> None:
    plan = {"nodes": [effect_node("a", compensation="store.restore_reference"), effect_node("b")]}
    task = unknown_task(make_task, agent_lease, plan)
    ann = operator_of(task)
    assert takeover_claim(actor=ann, task_id=task.pk).granted
    op = Operation.objects.get(task=task, status="unknown")
    client.force_login(ann.user)
    page = client.get(reverse("operation-settle", args=[task.pk, op.op_key]) + "?resolution=compensate").content
    assert b"2</strong> operations written" in page and f"{op.op_key}-compensation".encode() in page
    audits = AuditEvent.objects.count()
    response = settle(client, Task.objects.get(pk=task.pk), op, resolution="compensate", remote_id="r-a")
    assert response.status_code == 303, response.content.decode()[-2000:]
    assert Operation.objects.get(pk=op.pk).status == "committed"
    compensation = Operation.objects.get(compensates=op)
    assert (compensation.op_key, compensation.status) == (f"{op.op_key}-compensation", "intent")
    assert AuditEvent.objects.count() == audits + 1


# -- the actions offered are the permit table's -------------------------------------------------------------------

PERSONAS = ("operator", "holder", "admin")


def offered_scene(make_task: Callable[..., Task], agent_lease: Callable[..., Any], persona: str, status: str):
    """A task with an unknown operation and a stuck temp resource, in ``status``, and who looks at it: an operator
    granted it, an operator holding its takeover lease, or an admin."""
    task = unknown_task(make_task, agent_lease)
    temp = TempResource.objects.create(
        task=task,
        node=task.nodes.first(),
        locator="staging/left",
        created_at=task.created_at,
        retention_until=task.created_at,
        status=TempResourceStatus.STUCK.value,
    )
    who = person("ada", "admin") if persona == "admin" else operator_of(task)
    if persona == "holder":
        assert takeover_claim(actor=who, task_id=task.pk).granted
    set_status(task, status)
    return Task.objects.get(pk=task.pk), temp, who


def offered_on_pages(client: Client, task: Task, temp: TempResource) -> dict[str, bool]:
    """What the actions page and the detail page offer, read from the HTML."""
    html = client.get(reverse("task-actions", args=[task.pk])).content.decode()
    detail = client.get(reverse("task-detail", args=[task.pk])).content.decode()
    return {
        "cancel": reverse("task-cancel", args=[task.pk]) in html,
        "force_release": reverse("force-release", args=[task.pk]) in html,
        "settle": "Query the remote now" in html and "?resolution=not_done" in html,
        "reset": reverse("temp-reset", args=[task.pk, temp.pk]) in html,
        "take_over": "Take over…" in detail,
    }


def allowed_by_permits(who: Principal, task: Task) -> dict[str, bool]:
    """What tasks.access.permits allows ``who`` on ``task`` now (with their takeover lease, when they hold it)."""
    lease = lease_open(task.pk)
    mine = lease if lease is not None and (lease.holder_kind, lease.holder_id) == ("operator", who.id) else None
    return {
        "cancel": task.cancel_requested_at is None and permits(who, ChangeKind.CANCEL, task) is None,
        "force_release": permits(who, ChangeKind.FORCE_RELEASE, task) is None,
        "settle": mine is not None and permits(who, ChangeKind.SETTLE, task, lease=mine) is None,
        "reset": permits(who, ChangeKind.CLEANUP, task) is None,
        "take_over": permits(who, ChangeKind.TAKEOVER, task) is None,
    }


@pytest.mark.parametrize("status", [s.value for s in TaskStatus])
@pytest.mark.parametrize("persona", PERSONAS)
def test_the_pages_offer_exactly_the_actions_the_permit_table_allows(
    client, make_task, agent_lease, clock, persona, status
) -> None:
    task, temp, who = offered_scene(make_task, agent_lease, persona, status)
    client.force_login(who.user)
    assert offered_on_pages(client, task, temp) == allowed_by_permits(who, task)


def test_the_pages_follow_the_permit_table_when_it_changes(client, make_task, agent_lease, clock, monkeypatch) -> None:
    task, temp, ann = offered_scene(make_task, agent_lease, "operator", "paused")
    client.force_login(ann.user)
    before = offered_on_pages(client, task, temp)
    assert before["cancel"] and before["take_over"] and not before["reset"]
    changed = {
        (ChangeKind.CANCEL, Actor.PERSON): permitted(ChangeKind.CANCEL, Actor.PERSON) - {TaskStatus.PAUSED},
        (ChangeKind.TAKEOVER, Actor.PERSON): permitted(ChangeKind.TAKEOVER, Actor.PERSON) - {TaskStatus.PAUSED},
        (ChangeKind.CLEANUP, Actor.PERSON): permitted(ChangeKind.CLEANUP, Actor.PERSON) | {TaskStatus.PAUSED},
    }
    for key, statuses in changed.items():
        monkeypatch.setitem(PERMITS, key, statuses)
    after = offered_on_pages(client, task, temp)
    assert (after["cancel"], after["take_over"], after["reset"]) == (False, False, True)
    assert after == allowed_by_permits(ann, task)


def test_the_settle_form_is_pre_filled_with_the_staging_objects_the_remote_names_and_records_them(
    client, make_task, agent_lease, clock, remote
) -> None:
    task, ann, op = taken_over(make_task, agent_lease)
    remote.holds[op.op_key] = Committed(remote_id="batch-1", data={"temp": ["tgt-ginkgo-1/tmp/batch-2"]})
    client.force_login(ann.user)
    before = snapshot()
    page = client.get(reverse("operation-settle", args=[task.pk, op.op_key])).content.decode()
    assert snapshot() == before  # asking the remote to pre-fill the form records nothing
    assert re.search(r"<textarea[^>]*temp_locators[^>]*>\s*tgt-ginkgo-1/tmp/batch-2</textarea>", page), page
    # A "not done" with staging objects is refused by the form, writing nothing.
    refused = settle(client, task, op, resolution="not_done", remote_id="", temp_locators="tgt-ginkgo-1/tmp/batch-2")
    assert refused.status_code == 400 and "Not done left nothing behind" in refused.content.decode()
    assert snapshot() == before
    response = settle(client, task, op, temp_locators="tgt-ginkgo-1/tmp/batch-2\n\n  tgt-ginkgo-1/tmp/extra  \n")
    assert response.status_code == 303, response.content.decode()[:2000]
    temps = TempResource.objects.filter(task=task).order_by("pk")
    assert [(t.locator, t.node_id, t.status) for t in temps] == [
        ("tgt-ginkgo-1/tmp/batch-2", op.node_id, TempResourceStatus.ACTIVE),
        ("tgt-ginkgo-1/tmp/extra", op.node_id, TempResourceStatus.ACTIVE),
    ]
    logged = Event.objects.filter(task=task, type="node_succeeded").latest("seq")
    assert logged.payload["data"]["temp"] == ["tgt-ginkgo-1/tmp/batch-2", "tgt-ginkgo-1/tmp/extra"]


def test_the_settle_form_is_empty_when_the_remote_cannot_be_asked(client, make_task, agent_lease, clock) -> None:
    task, ann, op = taken_over(make_task, agent_lease)  # KIND has no connector registered here
    client.force_login(ann.user)
    page = client.get(reverse("operation-settle", args=[task.pk, op.op_key])).content.decode()
    assert re.search(r"<textarea[^>]*temp_locators[^>]*>\s*</textarea>", page), page
