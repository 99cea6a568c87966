"""End to end over HTTP: the reference agent (examples/migrate_agent.py, on reckon_client) as its own process, Reckon
as its own process (gunicorn, on the test database), the object store as its own process (harness/simulator.py).

Nothing here calls a service to move a task: the agents only speak HTTP. The simulator counts every side effect per
op key, so "no duplicate" is the store's own count, not Reckon's opinion of it.
"""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from reckon_client import ApiError, AsyncReckon, Failed, NodeReceipt, NotFound, Outcome, Reckon, RunResult

from api.tokens import api_token_issue
from examples.bench_http import bench
from examples.migrate_agent import KIND, ObjectStore, _outcome, plan
from harness.killmatrix import database_url
from harness.simulator import STAGING_PREFIX
from leases.models import Lease
from tasks.core.lifecycle import NodeStatus, OperationStatus, TaskStatus, TempResourceStatus
from tasks.engine.verification import find_problems
from tasks.models import Node, Operation, Receipt, Task, TempResource
from tasks.people.takeover import takeover_claim, takeover_submit
from tests.conftest import person
from tests.simulator_fixture import ROOT, Simulator

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = ROOT / "examples" / "migrate_agent.py"
LEASE_TTL = 5  # seconds: the API's least; a killed agent's lease lapses after it plus the grace below
OBJECTS = 1200  # three batches of the store's 500: prepare, 3 copies, verify, switch
NODES = 6


@dataclass(frozen=True)
class Live:
    url: str
    token: str
    log: Path
    web: int  # the gunicorn master's pid: its workers are its children


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture(scope="session")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    """Reckon's web process (gunicorn, 2 workers of 4 threads) on the test database, one for the session (this
    module and tests/test_api_walkthrough.py): each test's data is its own (transactional tests empty the tables
    after each), the process is shared."""
    port, log = _free_port(), tmp_path_factory.mktemp("web") / "web.log"
    env = os.environ | {"DATABASE_URL": database_url(), "RECKON_LEASE_GRACE_SECONDS": "1"}
    env["RECKON_LOG_LEVEL"] = "WARNING"
    command = [sys.executable, "-m", "gunicorn", "console.wsgi:application", "-b", f"127.0.0.1:{port}"]
    command += ["-k", "gthread", "-w", "2", "--threads", "4", "--log-level", "warning"]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/api/v1/tasks", timeout=2)  # any answer (401) means it serves
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Reckon did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield url, log, process.pid
    finally:
        _stop(process)


@pytest.fixture
def live(server: tuple[str, Path, int]) -> Live:
    """The server, and a token for the agent ``migrator`` scoped to the API kind."""
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="migrator", kinds=[KIND], projects=[])
    return Live(server[0], token, server[1], server[2])


def agent(live: Live, store: Simulator, *extra: str, objects: int = OBJECTS) -> subprocess.Popen[str]:
    """The reference agent's process, exactly as the README's agent quick start runs it."""
    command = [sys.executable, str(AGENT), "--url", live.url, "--token", live.token, "--store", store.url]
    command += ["--project", "acme", "--objects", str(objects), "--lease-ttl", str(LEASE_TTL), *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603


def finished(process: subprocess.Popen[str], seconds: float = 90) -> str:
    try:
        output, _ = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the agent did not finish in {seconds}s:\n{output}") from None
    assert process.returncode == 0, output
    return output


def the_task() -> Task:
    tasks = list(Task.objects.filter(kind=KIND))
    assert len(tasks) == 1, f"one task, not {len(tasks)}"
    return tasks[0]


def assert_migrated_once(task: Task, store: Simulator) -> None:
    """The task completed, every node on a receipt, and the store wrote each op key exactly once."""
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, (task.status, task.status_reason)
    assert set(Node.objects.filter(task=task).values_list("status", flat=True)) == {NodeStatus.SUCCEEDED}
    ops = list(Operation.objects.filter(task=task, purpose="effect"))
    assert len(ops) == NODES and {op.status for op in ops} == {OperationStatus.COMMITTED}
    stats = store.stats()
    effects = {key: n for key, n in stats["by_op_key"].items() if key in {op.op_key for op in ops}}
    assert effects == {op.op_key: 1 for op in ops}, stats["by_op_key"]
    assert stats["by_action"]["copy_batch"] == 3 and stats["by_action"]["switch_reference"] == 1
    reference = store.snapshot()["references"]["projects/acme"]
    assert reference["version"] == "7" and reference["target"].startswith("tgt-acme-")
    assert_cleaned_up(task, store)


def staging(store: Simulator) -> list[str]:
    """The staging objects the store holds (``<target>/tmp/…``): what a task's copies left behind."""
    return sorted(key for key in store.snapshot()["objects"] if f"/{STAGING_PREFIX}" in key)


def assert_cleaned_up(task: Task, store: Simulator) -> None:
    """Every temp resource the task's receipts named is deleted, each by one delete under its own op key with its
    receipt, and the store holds no staging object any more."""
    temps = list(TempResource.objects.filter(task=task))
    assert temps and {t.status for t in temps} == {TempResourceStatus.DELETED}, [(t.locator, t.status) for t in temps]
    assert all(t.cleanup_receipt_id for t in temps)
    deletes = Operation.objects.filter(task=task, purpose="cleanup", status=OperationStatus.COMMITTED)
    assert {store.stats()["by_op_key"][op.op_key] for op in deletes} == {1}
    assert staging(store) == []


def test_the_reference_agent_runs_its_task_to_completion_over_http(live: Live, store: Simulator) -> None:
    output = finished(agent(live, store))
    task = the_task()
    assert f"task {task.pk}: done" in output
    assert_migrated_once(task, store)
    assert task.created_by == "agent:migrator"
    # Started again with the same arguments: the create is replayed (same task), which is done; nothing is written.
    effects = store.stats()["side_effects"]
    again = finished(agent(live, store))
    assert f"task {task.pk}: done" in again
    assert the_task().pk == task.pk and store.stats()["side_effects"] == effects


def test_an_agent_killed_mid_copy_is_finished_by_another_with_no_duplicate_side_effect(
    live: Live, store: Simulator
) -> None:
    # The second copy hangs in the store for 4 s before it commits: the agent is SIGKILLed while it waits, after
    # Reckon recorded the intent as sent and before any answer: the outcome is unknown to Reckon.
    store.fault("latency", ms=4000, action="copy_batch", every=2)
    first = agent(live, store)
    deadline = time.monotonic() + 60
    while not Operation.objects.filter(node__key="copy-batch-2", status=OperationStatus.DISPATCHED).exists():
        assert first.poll() is None, first.communicate()[0]
        assert time.monotonic() < deadline, "the agent never sent the second copy"
        time.sleep(0.05)
    time.sleep(0.5)  # the request is in the store's hands now
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)
    task = the_task()
    assert task.status == TaskStatus.RUNNING
    in_flight = Operation.objects.get(task=task, node__key="copy-batch-2", purpose="effect")
    assert in_flight.status == OperationStatus.DISPATCHED  # nobody settled it: the killed agent never answered

    # A second agent process, the same command: it waits for the dead agent's lease to lapse, reconciles the copy
    # in flight by its op key (the store committed it meanwhile, or never got it), then finishes the plan.
    output = finished(agent(live, store, "--lease-wait", "60"))
    assert f"task {task.pk}: done" in output
    assert_migrated_once(task, store)
    in_flight.refresh_from_db()
    assert in_flight.status == OperationStatus.COMMITTED
    assert store.stats()["by_op_key"][in_flight.op_key] == 1


def test_agents_killed_as_the_store_commits_are_finished_by_the_next_with_no_duplicate(
    live: Live, store: Simulator
) -> None:
    """Kill the agent the moment the store has committed its 1st write, kill the next one at the 3rd: each time the
    answer is on its way back (or the outcome half-posted). The third process reconciles and finishes; the store
    still holds each op key once."""
    for kill_at in (1, 3):
        process = agent(live, store, "--lease-wait", "60")
        deadline = time.monotonic() + 60
        while store.stats()["side_effects"] < kill_at:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, f"the store never saw {kill_at} writes"
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
    output = finished(agent(live, store, "--lease-wait", "60"))
    task = the_task()
    assert f"task {task.pk}: done" in output
    assert_migrated_once(task, store)
    assert Lease.objects.filter(task=task).count() == 3  # three processes, three grants, in turn


class AsyncStore:
    """The object-store connector, async (httpx.AsyncClient): what an asyncio agent writes."""

    def __init__(self, url: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=10)

    async def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        body = {"action": str(request["action"]).removeprefix("store."), "params": request.get("input", {})}
        try:
            response = await self.http.post(f"/ops/{quote(op_key, safe='')}", json=body)
        except httpx.TransportError as exc:
            return Failed("connection_interrupted", str(exc))
        if response.status_code != 200:
            return Failed("invalid_params", response.text[:200])
        return _outcome(response.json())

    async def lookup(self, op_key: str) -> Outcome:
        response = await self.http.get(f"/ops/{quote(op_key, safe='')}")
        return _outcome(response.json()) if response.status_code == 200 else NotFound()

    async def current_version(self, locator: str) -> str:
        response = await self.http.get(f"/versions/{quote(locator, safe='')}")
        return str(response.raise_for_status().json()["version"])

    async def delete(self, op_key: str, locator: str) -> Outcome:
        return await self.submit(op_key, {"action": "delete", "input": {"locator": locator}})


def test_an_asyncio_agent_runs_a_task_to_completion(live: Live, store: Simulator) -> None:
    source = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}

    async def main() -> tuple[int, str, NodeReceipt]:
        connector = AsyncStore(store.url)
        async with AsyncReckon(live.url, live.token) as reckon:
            task = await reckon.create_task(KIND, "Migrate acme", plan("acme", 600, source, 500), project="acme")
            result = await reckon.run(task.id, connector, ttl_seconds=LEASE_TTL)
            switched = await reckon.node_receipt(task.id, "switch-reference")
        await connector.http.aclose()
        return task.id, result.status, switched

    task_id, status, switched = asyncio.run(main())
    assert status == "done"
    # What the agent reads back of a step is the receipt row Reckon holds, under the op key that carried it.
    row = Receipt.objects.get(operation__task_id=task_id, operation__node__key="switch-reference")
    assert (switched.op_key, switched.receipt.remote_id, switched.receipt.data) == (
        row.operation.op_key,
        row.remote_id,
        row.data,
    )
    with Reckon(live.url, live.token) as reckon:
        assert reckon.node_receipt(task_id, "switch-reference") == switched
        with pytest.raises(ApiError) as missing:
            reckon.node_receipt(task_id, "no-such-node")
        assert (missing.value.status, missing.value.code) == (404, "node_not_found")
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.COMPLETED
    ops = Operation.objects.filter(task=task)
    assert ops.filter(purpose="effect").count() == 5  # prepare, 2 copies, verify, switch
    assert {store.stats()["by_op_key"][op.op_key] for op in ops} == {1}
    assert_cleaned_up(task, store)  # and the 2 copies' staging objects, deleted


def test_an_agent_killed_mid_cleanup_is_finished_by_the_next_with_each_delete_sent_once(
    live: Live, store: Simulator
) -> None:
    """The task has completed and its agent is deleting the staging objects: the second delete hangs in the store
    and the agent is SIGKILLed. The next agent process (the same command) looks that delete up by its op key before
    anything else, finishes the cleanup, and the store ends with no staging object, each delete applied once."""
    store.fault("latency", ms=4000, action="delete", every=2)
    first = agent(live, store)
    deadline = time.monotonic() + 60
    while Operation.objects.filter(purpose="cleanup", status=OperationStatus.COMMITTED).count() < 1 or not (
        Operation.objects.filter(purpose="cleanup", status=OperationStatus.DISPATCHED).exists()
    ):
        assert first.poll() is None, first.communicate()[0]
        assert time.monotonic() < deadline, "the agent never sent the second delete"
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)
    task = the_task()
    assert task.status == TaskStatus.COMPLETED and staging(store) != []
    in_flight = Operation.objects.get(task=task, purpose="cleanup", status=OperationStatus.DISPATCHED)
    output = finished(agent(live, store, "--lease-wait", "60"))
    assert f"task {task.pk}: done" in output
    assert_migrated_once(task, store)
    in_flight.refresh_from_db()
    assert in_flight.status == OperationStatus.COMMITTED and in_flight.dispatch_count == 1  # looked up, not re-sent


def web_workers(master: int) -> list[int]:
    """The gunicorn master's children (its web workers), read from /proc."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we read
            continue
        if int(fields[1]) == master:
            children.append(int(stat.parent.name))
    return children


def test_web_workers_sigkilled_during_the_cleanup_leave_no_staging_object_and_no_delete_twice(
    live: Live, store: Simulator
) -> None:
    """The issue's crash run: over the API, with agents and web workers SIGKILLed, every temp resource stayed
    active. Here each time the cleanup moves (a delete registered by the directive's read, or committed by its
    report) a gunicorn worker is SIGKILLed — an answer in flight is lost, a request half-read — and the master starts
    another; an agent that gives up is started again, as a supervisor would. The task ends completed, every staging
    object deleted by one delete applied once, nothing left at the store."""
    store.fault("latency", times=10, ms=600, action="delete")  # each delete waits at the store: the kill lands
    kills, restarts, seen = 0, 0, (0, 0)
    process = agent(live, store, "--lease-wait", "60")
    deadline = time.monotonic() + 120
    while True:
        cleanup = Operation.objects.filter(purpose="cleanup")
        now = (cleanup.count(), cleanup.filter(status=OperationStatus.COMMITTED).count())
        if now != seen and kills < 6 and (workers := web_workers(live.web)):
            os.kill(workers[kills % len(workers)], signal.SIGKILL)
            kills, seen = kills + 1, now
        if process.poll() is not None:
            if process.returncode == 0:
                break
            restarts += 1
            assert restarts <= 6, process.communicate()[0]
            process = agent(live, store, "--lease-wait", "60")
        assert time.monotonic() < deadline, "the agents never finished"
        time.sleep(0.02)
    output = process.communicate()[0]
    task = the_task()
    assert f"task {task.pk}: done" in output
    assert kills >= 3, f"only {kills} web workers were killed during the cleanup"
    print(f"\n[web workers killed in the cleanup] kills={kills} agent restarts={restarts}")
    assert_migrated_once(task, store)  # its staging objects included: deleted, each by one delete applied once
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def source_ref() -> dict[str, Any]:
    return {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def test_a_call_longer_than_the_lease_is_covered_by_the_background_renewal(live: Live, store: Simulator) -> None:
    """The store takes 8 s over one copy (the connector waits 10), more than the 5 s lease: the renewer keeps the
    lease, so the receipt is accepted under the same lease (no lease_expired, no second grant, no reconcile)."""
    store.fault("latency", ms=8000, action="copy_batch")
    with Reckon(live.url, live.token) as reckon:
        task = reckon.create_task(KIND, "Migrate acme", plan("acme", 500, source_ref(), 500), project="acme")
        result = reckon.run(task.id, ObjectStore(store.url), ttl_seconds=LEASE_TTL)
    assert result.done, result
    leases = list(Lease.objects.filter(task_id=task.id))
    assert len(leases) == 1 and leases[0].renewal_seq >= 2 and leases[0].released_at is not None
    assert {n for n in store.stats()["by_op_key"].values()} == {1}
    ops = Operation.objects.filter(task_id=task.id)
    assert {(op.status, op.dispatch_count) for op in ops} == {(OperationStatus.COMMITTED, 1)}  # sent once, settled


def test_a_cancel_during_a_call_lets_it_settle_and_starts_nothing_after(live: Live, store: Simulator) -> None:
    """The creator cancels while the first copy is in the store's hands: the copy's receipt is recorded, the run
    stops (cancel_requested) and no later node is ever sent."""
    store.fault("latency", ms=3000, action="copy_batch")
    with Reckon(live.url, live.token) as reckon:
        task = reckon.create_task(KIND, "Migrate acme", plan("acme", 1000, source_ref(), 500), project="acme")
        results: list[RunResult] = []
        runner = threading.Thread(target=lambda: results.append(reckon.run(task.id, ObjectStore(store.url))))
        runner.start()
        deadline = time.monotonic() + 30
        while not Operation.objects.filter(node__key="copy-batch-1", status=OperationStatus.DISPATCHED).exists():
            assert time.monotonic() < deadline and runner.is_alive(), results
            time.sleep(0.05)
        reckon.cancel(task.id, "the migration was called off")
        runner.join(60)
    # Nothing in flight once the copy settled: the cancel ended the task (its directive: stop, "stopped").
    assert results and results[0].status == "stopped", results
    assert results[0].reason in ("cancel_requested", TaskStatus.STOPPED), results
    assert Task.objects.get(pk=task.id).status == TaskStatus.STOPPED
    actions = store.stats()["by_action"]
    assert actions == {"prepare_target": 1, "copy_batch": 1, "delete": 1}  # the copy's staging object, once stopped
    copy = Operation.objects.get(task_id=task.id, node__key="copy-batch-1", purpose="effect")
    assert copy.status == OperationStatus.COMMITTED  # settled as it truly ended
    assert_cleaned_up(Task.objects.get(pk=task.id), store)
    assert not Operation.objects.filter(task_id=task.id, node__key="copy-batch-2").exists()


@pytest.mark.parametrize(("version_at_hand_back", "ends"), [("7", "done"), ("8", "input_changed")])
def test_a_person_takes_over_mid_run_and_hands_back_after_which_the_agent_rechecks_its_inputs(
    live: Live, store: Simulator, version_at_hand_back: str, ends: str
) -> None:
    """An operator claims the task while the agent's copy is in the store: the renewal tells the agent, which lets
    the copy settle and stops (takeover_requested). The operator hands it back; the agent's next run first reads the
    source's version now and reports it — unchanged, it finishes; changed, the task pauses input_changed and
    nothing more is sent."""
    ann = person("ann", "admin")
    store.fault("latency", ms=3000, action="copy_batch")
    with Reckon(live.url, live.token) as reckon:
        task = reckon.create_task(KIND, "Migrate acme", plan("acme", 1000, source_ref(), 500), project="acme")
        results: list[RunResult] = []
        runner = threading.Thread(target=lambda: results.append(reckon.run(task.id, ObjectStore(store.url))))
        runner.start()
        deadline = time.monotonic() + 30
        while not Operation.objects.filter(node__key="copy-batch-1", status=OperationStatus.DISPATCHED).exists():
            assert time.monotonic() < deadline and runner.is_alive(), results
            time.sleep(0.05)
        assert not takeover_claim(actor=ann, task_id=task.id).granted  # reserved: the agent holds the lease
        runner.join(60)
        assert results and (results[0].status, results[0].reason) == ("stopped", "takeover_requested"), results
        assert store.stats()["by_action"] == {"prepare_target": 1, "copy_batch": 1}  # the copy settled, no more

        claim = takeover_claim(actor=ann, task_id=task.id)
        assert claim.granted and claim.lease is not None
        version = Task.objects.get(pk=task.id).version
        store.set_source("projects/acme", version_at_hand_back, "sha256:" + "ab" * 32)
        takeover_submit(actor=ann, lease=claim.lease, based_on_version=version, decision="resume_agent")

        result = reckon.run(task.id, ObjectStore(store.url))
    after = Task.objects.get(pk=task.id)
    assert not after.inputs_recheck_required  # the agent reported the source's version
    if ends == "done":
        assert result.done, result
        assert after.status == TaskStatus.COMPLETED
        assert set(store.stats()["by_op_key"].values()) == {1}
    else:
        assert (result.status, result.reason) == ("stopped", "input_changed"), result
        assert (after.status, after.status_reason) == (TaskStatus.PAUSED, "input_changed")
        assert store.stats()["by_action"] == {"prepare_target": 1, "copy_batch": 1}


def test_the_http_benchmark_runs_its_tasks_to_completion(live: Live) -> None:
    figures = bench(live.url, live.token, tasks=3, nodes=4, agents=2)
    assert figures.done == 3 and figures.steps_per_second > 0
    tasks = Task.objects.filter(kind=KIND)
    assert tasks.count() == 3 and {t.status for t in tasks} == {TaskStatus.COMPLETED}
    assert Operation.objects.filter(task__in=tasks, status=OperationStatus.COMMITTED).count() == 12


def test_an_operation_the_store_still_runs_is_observed_within_the_same_run(live: Live, store: Simulator) -> None:
    """The store accepts the copy and runs it 3 s more: the run polls it by op key, holding its lease, and goes on
    once it is committed — one run, one lease, the copy sent once."""
    store.fault("run_async", ms=3000, action="copy_batch")
    with Reckon(live.url, live.token) as reckon:
        task = reckon.create_task(KIND, "Migrate acme", plan("acme", 500, source_ref(), 500), project="acme")
        result = reckon.run(task.id, ObjectStore(store.url), ttl_seconds=LEASE_TTL)
    assert result.done, result
    assert Lease.objects.filter(task_id=task.id).count() == 1
    copy = Operation.objects.get(task_id=task.id, node__key="copy-batch-1", purpose="effect")
    assert copy.status == OperationStatus.COMMITTED and copy.dispatch_count == 1
    assert store.stats()["by_op_key"][copy.op_key] == 1


def test_the_reference_agent_says_so_when_the_source_is_not_in_the_store(
    simulator: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """A project never registered in the store: a sentence and exit status 2, no traceback, nothing sent to Reckon
    (its URL here answers nothing)."""
    from examples.migrate_agent import main

    args = ["--url", "http://127.0.0.1:9", "--token", "rk_x", "--store", simulator.url, "--project", "nope"]
    assert main([*args, "--objects", "10"]) == 2
    assert "the store has no source 'projects/nope'" in capsys.readouterr().err


def test_the_reference_agent_migrates_a_project_once_too_large_for_one_plan(live: Live, store: Simulator) -> None:
    """45,000 and 60,000 objects were refused (the plan_accepted event listed every node; 100 nodes at most): one
    fan-out node now stands for every batch, and the task runs to its end — here 101 batches of 100, past both old
    limits (104 nodes), with a fifth of the objects to copy."""
    output = finished(agent(live, store, "--batch", "100", objects=10_100), seconds=240)
    assert output.rstrip().endswith("done"), output
    task = Task.objects.get(kind=KIND)
    assert task.status == TaskStatus.COMPLETED and task.nodes.count() == 3 + 101
    copies = Operation.objects.filter(task=task, purpose="effect", node__key__startswith="copy-batch-")
    assert copies.count() == 101 and store.stats()["by_action"]["copy_batch"] == 101


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--objects", "20001", "--batch", "1"), "Reckon refused the task: 422 plan_invalid"),
        (("--objects", "10", "--batch", "501"), "--batch 501: the store copies 1 to 500 objects in one transaction"),
    ],
    ids=["past-the-node-cap", "past-the-store-batch"],
)
def test_the_reference_agent_says_what_was_refused_and_how_to_get_round_it(
    live: Live, store: Simulator, extra: tuple[str, ...], said: str
) -> None:
    """A project past the node cap (20,004 nodes), or a batch past the store's transaction: a sentence naming the
    limit and the way around it, exit status 2, no traceback — and no task."""
    process = agent(live, store, *extra)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2, output
    assert said in output, output
    if "plan_invalid" in said:
        assert "at most 20000 nodes, this one has 20004: give each node more to do" in output, output
    assert "Traceback" not in output
    assert not Task.objects.filter(kind=KIND).exists()
