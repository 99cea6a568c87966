"""The task page stays cheap whatever the plan's length (issue 26): it shows the current plan's nodes and the task's
operations a page at a time, by plain links (``?nodes=2``, ``?ops=3``), so a task of 10,000 nodes costs the same
queries as one of 10 and its HTML is bounded; the header and the state section say what the database counts, not
what the page shows; a page number that is not one is a 400, one past the last shows the last."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from leases import clock
from tasks.core.lifecycle import NodeStatus, OperationStatus, TaskStatus
from tasks.decide.receipts import receipt_summary
from tasks.models import Node, Operation, OperationPurpose, Receipt, Task
from tasks.reads import detail as reads
from tests.conftest import chain_plan, person

pytestmark = pytest.mark.django_db

LARGE, SMALL = 10_000, 10
# Many pages of nodes: what the pages show of a long plan (their cost and size are measured at LARGE).
LONG = 1_000
# A page of 50 nodes, 50 operations and 25 timeline entries, whatever the plan: measured ~58 KB at 10,000 nodes.
MAX_PAGE_BYTES = 200_000


@pytest.fixture
def admin(client: Client) -> Client:
    client.force_login(person("ada", "admin").user)
    return client


def grown(task: Task, nodes: int, *, succeeded: int) -> Task:
    """``task`` (made with the one-node plan ``n0``) with its current plan grown to ``nodes`` nodes in a chain,
    written straight into the tables (bulk_create), as the rows of a long plan stand: the first ``succeeded`` done,
    each with its committed effect operation and receipt. The log is not rewritten: the page reads rows."""
    first = Node.objects.get(task=task, plan_version=task.plan_version)
    rest = [
        Node(
            task=task,
            plan_version=first.plan_version,
            key=f"n{i}",
            position=first.position + i,
            action=first.action,
            depends_on=[f"n{i - 1}"],
            evidence=first.evidence,
            definition_digest=first.definition_digest,
            max_attempts=first.max_attempts,
        )
        for i in range(1, nodes)
    ]
    Node.objects.bulk_create(rest, batch_size=1000)
    done = list(Node.objects.filter(task=task, plan_version=first.plan_version).order_by("position")[:succeeded])
    now = clock.now()
    operations = Operation.objects.bulk_create(
        Operation(
            task=task,
            node=node,
            op_key=f"rk-{task.uid.hex}-p{node.plan_version}-{node.key}-0",
            action=node.action,
            request={"action": node.action, "input": {}},
            request_digest="sha256:" + "0" * 64,
            status=OperationStatus.COMMITTED.value,
            remote_id=f"r-{node.key}",
            dispatch_count=1,
            registered_at=now + timedelta(microseconds=node.position),
            settled_at=now,
            purpose=OperationPurpose.EFFECT,
        )
        for node in done
    )
    receipts = Receipt.objects.bulk_create(
        Receipt(operation=op, remote_id=op.remote_id, received_at=now) for op in operations
    )
    for node, receipt in zip(done, receipts, strict=True):
        node.status, node.output = NodeStatus.SUCCEEDED.value, receipt_summary(receipt)
    Node.objects.bulk_update(done, ["status", "output"], batch_size=1000)
    return Task.objects.get(pk=task.pk)


def task_of(make_task, nodes: int, *, succeeded: int = 5) -> Task:
    return grown(make_task(chain_plan("n0")), nodes, succeeded=succeeded)


def read(client: Client, task: Task, **params: str) -> tuple[int, str]:
    """The page's query count and its HTML."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("task-detail", args=[task.pk]), params)
    assert response.status_code == 200, response.content[:300]
    return len(queries), response.content.decode()


def pager(noun: str, first: int, last: int, total: int) -> str:
    """What the pager says of a page of 50 (first and last from 1)."""
    return f"{noun} {first}\u2013{last} of {total}, page {-(-last // 50)} of {-(-total // 50)}."


def node_keys(html: str) -> list[str]:
    return re.findall(r'<tr class="node-[a-z_]+" id="node-([^"]+)"', html)


def op_keys(html: str) -> list[str]:
    return re.findall(r'<tr class="op-[^"]+">\s*<th scope="row"><code>([^<]+)</code>', html)


# --- what it costs ------------------------------------------------------------------------------------------------


def test_the_page_costs_the_same_queries_for_10_nodes_as_for_10000(admin, make_task, clock, monkeypatch) -> None:
    # The hash-chain check costs a fixed number of queries whatever the log (tests/test_console_detail.py), and a
    # plan of 10,000 nodes is not checked on open (below): held off for both here, the page's own reads compared.
    monkeypatch.setattr(reads, "CHECK_ON_OPEN_MAX_EVENTS", 0)
    small = task_of(make_task, SMALL)
    large = task_of(make_task, LARGE, succeeded=120)
    small_queries, _ = read(admin, small)
    large_queries, _ = read(admin, large)
    assert large_queries == small_queries
    assert read(admin, large, nodes="2", ops="3")[0] == small_queries
    assert read(admin, large, nodes="200")[0] == small_queries


def test_the_10000_node_page_is_bounded_and_links_to_the_next_nodes(admin, make_task, clock) -> None:
    task = task_of(make_task, LARGE)
    _, html = read(admin, task)
    assert len(html.encode()) < MAX_PAGE_BYTES
    assert node_keys(html) == [f"n{i}" for i in range(reads.NODES_PAGE_SIZE)]
    assert pager("Nodes", 1, 50, 10_000) in html
    assert f'href="{reverse("task-detail", args=[task.pk])}?nodes=2#nodes" rel="next"' in html
    # The counts are the database's, not the page's.
    assert "<dt>Nodes done</dt><dd>5 / 10000</dd>" in html
    assert "5 of 10000 steps done" in html


def test_page_2_shows_the_next_nodes(admin, make_task, clock) -> None:
    task = task_of(make_task, LONG)
    _, html = read(admin, task, nodes="2")
    assert node_keys(html) == [f"n{i}" for i in range(50, 100)]
    assert pager("Nodes", 51, 100, LONG) in html
    assert f'href="{reverse("task-detail", args=[task.pk])}?nodes=1#nodes" rel="prev"' in html
    assert f"<dt>Nodes done</dt><dd>5 / {LONG}</dd>" in html


def test_a_node_on_a_later_page_shows_its_own_receipt(admin, make_task, clock) -> None:
    task = task_of(make_task, LONG, succeeded=60)
    _, html = read(admin, task, nodes="2")
    row = html[html.index('id="node-n59"') : html.index('id="node-n60"')]
    assert "r-n59" in row and "satisfies the evidence spec" in row
    assert "no receipt" in html[html.index('id="node-n60"') : html.index('id="node-n61"')]


def test_the_operations_page_too(admin, make_task, clock) -> None:
    task = task_of(make_task, LONG, succeeded=120)
    _, first = read(admin, task)
    assert len(op_keys(first)) == reads.OPERATIONS_PAGE_SIZE
    assert pager("Operations", 1, 50, 120) in first
    _, last = read(admin, task, ops="3")
    assert [key.rsplit("-", 2)[-2] for key in op_keys(last)] == [f"n{i}" for i in range(100, 120)]


def test_a_page_past_the_last_shows_the_last(admin, make_task, clock) -> None:
    task = task_of(make_task, LONG)
    for number in ("201", "9223372036854775807"):
        _, html = read(admin, task, nodes=number)
        assert node_keys(html) == [f"n{i}" for i in range(LONG - 50, LONG)]
        assert pager("Nodes", LONG - 49, LONG, LONG) in html
    _, html = read(admin, task, nodes="0")
    assert node_keys(html)[0] == "n0"


@pytest.mark.parametrize("number", ["abc", "-1", "1.5", "1e3", "9" * 30, "\uff12", " 2", "0x10"])
@pytest.mark.parametrize("param", ["nodes", "ops"])
def test_a_page_number_that_is_not_one_is_a_bad_request(admin, make_task, clock, param, number) -> None:
    task = task_of(make_task, SMALL)
    response = admin.get(reverse("task-detail", args=[task.pk]), {param: number})
    assert response.status_code == 400
    assert b"This link to a page of nodes or operations is not valid" in response.content


# --- what it says -------------------------------------------------------------------------------------------------


def test_a_plan_this_long_is_not_checked_on_open_and_the_page_says_so(admin, make_task, clock) -> None:
    _, html = read(admin, task_of(make_task, LARGE))
    assert "Hash chain not checked on open: this log has 2 events. Its plan has 10000 nodes." in html


def test_a_failed_task_names_its_first_failed_nodes_and_counts_them_all(admin, make_task, clock) -> None:
    task = task_of(make_task, LONG)
    failed = [f"n{i}" for i in range(100, 130)]
    Node.objects.filter(task=task, key__in=failed).update(status=NodeStatus.FAILED.value)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.FAILED.value)
    _, html = read(admin, task)
    state = html[html.index('id="state"') : html.index("</section>", html.index('id="state"'))]
    assert re.findall(r"<li>node (n\d+) failed", state) == failed[: reads.NAMED_NODES_MAX]
    assert "and 10 more failed nodes" in state
    assert f"Failed: ended without completing, 5 of {LONG} steps done." in state


def test_a_completed_task_checks_every_node_not_only_the_page(admin, make_task, clock) -> None:
    many = 1_000  # twenty pages of nodes: the check reads past the page (its cost at 10,000: the tests above)
    task = task_of(make_task, many, succeeded=many)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.COMPLETED.value)
    _, html = read(admin, task)
    assert f"All {many} nodes of plan 1 succeeded" in html
    Node.objects.filter(task=task, key=f"n{many - 1}").update(status=NodeStatus.PENDING.value)
    _, html = read(admin, task)
    assert f"1 node of plan 1 has no receipt meeting its evidence spec now: n{many - 1}." in html
