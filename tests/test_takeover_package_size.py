"""The takeover package stays bounded whatever the plan's length (issue 26): a task of 10,000 nodes costs the takeover
page the same queries as one of 10, and its HTML stays small. The page names what a person needs to decide — the
operations to settle, the steps not done (failed first), the input refs — at most a few of each, with the whole
counts from the database; the result form shows the first steps that can take a result, and any other is opened by
its key: a result for a step past the first listing is still submitted, validated by the service on its own. The task
page's temp resources are listed up to a cap and counted in the database."""

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.principals import Principal
from leases import clock as db_clock
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import NodeStatus, OperationStatus, TaskStatus, TempResourceStatus
from tasks.engine.plans import task_create
from tasks.models import Node, Operation, OperationPurpose, Receipt, Task, TempResource
from tasks.people.takeover import takeover_claim
from tasks.reads import detail as detail_reads
from tasks.reads import takeover as reads
from tests.conftest import EFFECT, person, snapshot

pytestmark = pytest.mark.django_db

LARGE, SMALL = 10_000, 10
# Past every listing's cap: what the page says of a long plan (the query costs above are measured at LARGE).
LONG = 1_000
MAX_PAGE_BYTES = 200_000


def fan_out(total: int) -> dict[str, Any]:
    return {
        "nodes": [
            {"key": "n", "action": EFFECT, "fan_out": {"total": total, "batch": 1}, "evidence": {"remote_id": True}}
        ]
    }


def shaped(total: int, *, succeeded: int, failed: int, unknown: int, receipts: int, temps: int = 0) -> Task:
    """A fan-out task of ``total`` nodes ``n-1`` … ``n-<total>``, its rows written straight into the tables (a read-size
    test: the log is not rewritten): the first ``succeeded`` succeeded, the first ``receipts`` of them with a committed
    operation and its receipt; the next ``failed`` failed; the next ``unknown`` running with an operation of unknown
    outcome; the rest pending; and ``temps`` temp resources still to delete."""
    task = task_create(kind="test", title="a long task", created_by="agent:tester", plan=fan_out(total))
    plan = Node.objects.filter(task=task, plan_version=task.plan_version)
    nodes = list(plan.order_by("position"))
    done, bad, open_ = nodes[:succeeded], nodes[succeeded : succeeded + failed], nodes[succeeded + failed :][:unknown]
    plan.filter(pk__in=[n.pk for n in done]).update(status=NodeStatus.SUCCEEDED.value)
    plan.filter(pk__in=[n.pk for n in bad]).update(status=NodeStatus.FAILED.value, last_error_class="permanent")
    plan.filter(pk__in=[n.pk for n in open_]).update(status=NodeStatus.RUNNING.value)
    now = db_clock.now()

    def operation(node: Node, status: str) -> Operation:
        return Operation(
            task=task,
            node=node,
            op_key=f"rk-{task.uid.hex}-p{node.plan_version}-{node.key}-0",
            action=node.action,
            request={"action": node.action, "input": {}},
            request_digest="sha256:" + "0" * 64,
            status=status,
            remote_id=f"r-{node.key}" if status == OperationStatus.COMMITTED.value else "",
            dispatch_count=1,
            registered_at=now + timedelta(microseconds=node.position),
            settled_at=now if status == OperationStatus.COMMITTED.value else None,
            purpose=OperationPurpose.EFFECT,
        )

    committed = Operation.objects.bulk_create(operation(n, OperationStatus.COMMITTED.value) for n in done[:receipts])
    Receipt.objects.bulk_create(Receipt(operation=op, remote_id=op.remote_id, received_at=now) for op in committed)
    Operation.objects.bulk_create(operation(n, OperationStatus.UNKNOWN.value) for n in open_)
    TempResource.objects.bulk_create(
        TempResource(task=task, node=nodes[i], locator=f"staging/{i}", created_at=now, retention_until=now)
        for i in range(temps)
    )
    return Task.objects.get(pk=task.pk)


def taken_over(*tasks: Task, client: Client) -> Principal:
    """Each of ``tasks`` taken over by operator ann, logged in on ``client``."""
    root = person("root", "admin")
    ann = person("ann", "operator")
    for task in tasks:
        permission_grant(actor=root, user=ann.user, task=task)
        assert takeover_claim(actor=ann, task_id=task.pk).granted
    client.force_login(ann.user)
    return ann


def small(**extra: int) -> Task:
    return shaped(SMALL, succeeded=4, failed=1, unknown=1, receipts=2, **extra)


def large(**extra: int) -> Task:
    return shaped(LARGE, succeeded=LARGE - 50, failed=30, unknown=5, receipts=100, **extra)


def long_task() -> Task:
    return shaped(LONG, succeeded=LONG - 50, failed=30, unknown=5, receipts=100)


def read(client: Client, name: str, task: Task, **params: Any) -> tuple[int, str]:
    """A page's query count and its HTML (entities decoded)."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(name, args=[task.pk]), params)
    assert response.status_code == 200, response.content[:500]
    return len(queries), html.unescape(response.content.decode())


def section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</section>", start)]


def fieldsets(page: str) -> list[str]:
    """The steps the result form shows fields for."""
    return re.findall(r'name="n-([a-z0-9_.-]+)-remote_id"', page)


def version(task: Task) -> int:
    return Task.objects.get(pk=task.pk).version


def epoch(task: Task) -> int:
    from leases.services import lease_open

    lease = lease_open(task.pk)
    assert lease is not None
    return lease.epoch


# --- what it costs ------------------------------------------------------------------------------------------------


def test_the_takeover_page_costs_the_same_queries_at_10_and_10000_nodes_and_stays_small(client, clock) -> None:
    few, many = small(), large()
    taken_over(few, many, client=client)
    few_queries, few_html = read(client, "takeover", few)
    many_queries, many_html = read(client, "takeover", many)
    assert many_queries == few_queries
    assert len(few_html.encode()) < len(many_html.encode()) < MAX_PAGE_BYTES
    # A step opened by key costs one query more, at either size.
    assert read(client, "takeover", few, step="n-10")[0] == few_queries + 1
    assert read(client, "takeover", many, step="n-10000")[0] == few_queries + 1
    assert len(read(client, "takeover", many, step="n-10000")[1].encode()) < MAX_PAGE_BYTES


def test_the_task_page_with_the_package_costs_the_same_at_10_and_10000_nodes(client, clock, monkeypatch) -> None:
    # The hash-chain check is held off for both (a plan of 10,000 nodes is not checked on open): the reads compared.
    monkeypatch.setattr(detail_reads, "CHECK_ON_OPEN_MAX_EVENTS", 0)
    few, many = small(temps=SMALL), large(temps=LARGE)
    taken_over(few, many, client=client)  # a task taken over shows the takeover package
    client.force_login(person("ada", "admin").user)
    few_queries, _ = read(client, "task-detail", few)
    many_queries, page = read(client, "task-detail", many)
    assert many_queries == few_queries
    assert len(page.encode()) < MAX_PAGE_BYTES


def test_the_package_reads_a_fixed_number_of_queries(django_assert_num_queries, clock) -> None:
    for task in (small(), large()):
        with django_assert_num_queries(7):
            reads.takeover_package(task.pk)


# --- what it says -------------------------------------------------------------------------------------------------


def test_the_package_names_a_few_of_each_kind_and_counts_the_rest_in_the_database(clock) -> None:
    task = long_task()
    package = reads.takeover_package(task.pk)
    assert package["counts"] == {
        "nodes": LONG,
        "succeeded": LONG - 50,
        "not_succeeded": 50,
        "failed": 30,
        "operations_to_settle": 5,
        "receipts": 100,
        "input_refs": 0,
    }
    named = reads.NAMED_MAX
    assert [p["node"] for p in package["pending"]] == [f"n-{i}" for i in range(LONG - 49, LONG - 49 + named)]
    assert all(p["status"] == "failed" for p in package["pending"]), "failed first"
    assert len(package["completed"]) == named and len(package["receipts"]) == named
    assert len(package["operations_to_settle"]) == 5
    assert package["not_named"] == {
        "input_refs": 0,
        "completed": LONG - 50 - named,
        "pending": 50 - named,
        "operations_to_settle": 0,
        "receipts": 100 - named,
    }


def test_the_takeover_page_says_what_the_database_counts(client, clock) -> None:
    task = long_task()
    taken_over(task, client=client)
    _, page = read(client, "takeover", task)
    package = section(page, "package")
    assert f"{LONG} nodes in plan 1: {LONG - 50} succeeded (their outputs and receipts are not listed here" in package
    assert "50 not (30 failed). 100 receipts recorded; 5 operations to settle." in package
    assert "and 30 more not succeeded (failed first, then in plan order)" in package
    for op in Operation.objects.filter(task=task, status=OperationStatus.UNKNOWN.value):
        assert f"<code>{op.op_key}</code>" in package and f"query the remote for op key {op.op_key}" in package
    result = section(page, "result")
    assert "50 steps can take a result (failed first, then in plan order): the fields of the first 10 are below, " in (
        result
    )
    assert "the other 40 are opened by key" in result
    assert fieldsets(page) == [f"n-{i}" for i in range(LONG - 49, LONG - 39)], "the first 10, failed first"


def test_a_step_past_the_first_listing_is_opened_by_its_key(client, clock) -> None:
    task = long_task()
    taken_over(task, client=client)
    _, page = read(client, "takeover", task, step=f"n-{LONG}")
    assert fieldsets(page)[-1] == f"n-{LONG}" and len(fieldsets(page)) == reads.RESULT_STEPS_SHOWN + 1
    # The form to open another keeps the one opened.
    assert f'<input type="hidden" name="step" value="n-{LONG}">' in page


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("n-1", "step n-1 succeeded already"),
        ("n-99999", "plan 1 has no step n-99999"),
        ("Not A Key", "'Not A Key' is not a step's key"),
        ("x" * 500, "is not a step's key"),
        ("n-1\x00", "is not a step's key"),
    ],
)
def test_a_key_that_names_no_step_that_can_take_a_result_is_said_so(client, clock, key, why) -> None:
    task = small()
    taken_over(task, client=client)
    _, page = read(client, "takeover", task, step=key)
    assert why in page and "Not opened:" in page


def test_many_keys_are_read_up_to_a_cap(client, clock) -> None:
    task = long_task()
    taken_over(task, client=client)
    keys = [f"n-{i}" for i in range(LONG - 49, LONG + 1)] + ["bad key"] * 3 + [f"y{i}" for i in range(500)]
    _, page = read(client, "takeover", task, step=keys)
    assert len(fieldsets(page)) == reads.STEPS_POSTED_MAX
    assert f"at most {reads.STEPS_POSTED_MAX} steps are read at once" in page
    assert len(page.encode()) < MAX_PAGE_BYTES


# --- a result for a step the first listing does not name ------------------------------------------------------------


def result(task: Task, stage: str, key: str, **extra: Any) -> dict[str, Any]:
    return {
        "expected_version": version(task),
        "epoch": epoch(task),
        "stage": stage,
        "decision": "resume_agent",
        f"n-{key}-remote_id": f"by-hand-{key}",
        f"n-{key}-evidence": "console_url: https://store.example/batches/last",
        **extra,
    }


def test_a_result_for_a_step_past_the_first_listing_is_reviewed_and_confirmed(client, clock) -> None:
    task = long_task()
    taken_over(task, client=client)
    key = f"n-{LONG}"
    assert key not in fieldsets(read(client, "takeover", task)[1])
    before = snapshot()
    review = client.post(reverse("takeover-submit", args=[task.pk]), result(task, "review", key))
    assert review.status_code == 200, review.content[:2000]
    assert snapshot() == before, "the review writes nothing"
    reviewed = html.unescape(review.content.decode())
    assert f"Step <strong>{key}</strong>: pending → succeeded" in reviewed
    assert f'name="n-{key}-remote_id"' in reviewed and 'value="confirm"' in reviewed
    confirm = client.post(reverse("takeover-submit", args=[task.pk]), result(task, "confirm", key))
    assert confirm.status_code == 303, confirm.content[:2000]
    node = Node.objects.get(task=task, key=key)
    assert (node.status, node.output["remote_id"]) == (NodeStatus.SUCCEEDED, f"by-hand-{key}")
    op = Operation.objects.get(node=node)
    assert op.status == OperationStatus.COMMITTED and op.settled_by == "user:ann"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.PENDING


def test_the_service_refuses_a_step_by_name_whatever_the_page_listed(client, clock) -> None:
    task = long_task()
    taken_over(task, client=client)
    open_step = Operation.objects.filter(task=task, status=OperationStatus.UNKNOWN.value).first()
    assert open_step is not None
    before = snapshot()
    response = client.post(reverse("takeover-submit", args=[task.pk]), result(task, "review", open_step.node.key))
    assert response.status_code == 409
    assert "operation" in html.unescape(response.content.decode())
    assert snapshot() == before


@pytest.mark.parametrize(
    ("key", "why"), [("n-1", "step n-1 succeeded already"), ("zz", "plan 1 has no step zz"), ("A\x00", "not a step")]
)
def test_a_result_for_a_step_that_cannot_take_one_is_a_400_and_writes_nothing(client, clock, key, why) -> None:
    task = small()
    taken_over(task, client=client)
    before = snapshot()
    response = client.post(reverse("takeover-submit", args=[task.pk]), result(task, "confirm", key))
    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert "No result can be recorded here" in page and why in page
    assert snapshot() == before


# --- the task page's temp resources -------------------------------------------------------------------------------


def test_the_task_page_lists_the_first_temp_resources_and_counts_them_all(client, clock) -> None:
    many = 1_000  # far past the listing: the count is the database's (the page's cost at 10,000: the tests above)
    task = shaped(many, succeeded=many, failed=0, unknown=0, receipts=0, temps=many)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.FAILED.value)
    TempResource.objects.filter(task=task, locator=f"staging/{many - 1}").update(status=TempResourceStatus.STUCK.value)
    client.force_login(person("ada", "admin").user)
    _, page = read(client, "task-detail", task)
    temps = section(page, "temp")
    listed = re.findall(r'<li class="temp-[a-z]+"><code>([^<]+)</code>', temps)
    assert len(listed) == detail_reads.TEMP_NAMED_MAX and listed[0] == f"staging/{many - 1}", "stuck first"
    assert f"and {many - detail_reads.TEMP_NAMED_MAX} more temp resources" in temps
    sentence = f"Temp resource cleanup is still pending: {many} temp resources to delete (1 stuck"
    assert sentence in temps and sentence in section(page, "state")
    assert len(page.encode()) < MAX_PAGE_BYTES
