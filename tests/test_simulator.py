"""The object-store simulator, as a real process, and its connector: DESIGN §6 classes and §9 faults."""

import json
import time
from typing import Any

import pytest

from harness.ports import free_port
from leases.services import lease_acquire, lease_renew
from reference.demo import migration_plan
from reference.objectstore import ObjectStoreConnector
from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, TaskStatus
from tasks.core.outcomes import Committed, Failed, NotFound, Unprovable
from tasks.engine.connectors import Connector, SourceNotFound
from tasks.engine.plans import task_create
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.models import Node, Operation, Receipt, Task
from tests.simulator_fixture import REFUSALS, Simulator

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def prepare(project: str = "acme") -> dict[str, Any]:
    return {"action": "store.prepare_target", "input": {"project": project, "source": SOURCE}}


def copy(target: str, batch: int = 1, limit: int = 5) -> dict[str, Any]:
    return {"action": "store.copy_batch", "input": {"target": target, "source": SOURCE, "batch": batch, "limit": limit}}


def connect(sim: Simulator, timeout: float = 5.0) -> ObjectStoreConnector:
    return ObjectStoreConnector(sim.url, timeout=timeout)


def test_the_connector_satisfies_the_contract(simulator: Simulator) -> None:
    assert isinstance(connect(simulator), Connector)


def test_a_replayed_op_key_has_exactly_one_side_effect(simulator: Simulator) -> None:
    store = connect(simulator)
    target = store.submit("op-prepare", prepare())
    assert isinstance(target, Committed)
    first = store.submit("op-copy", copy(target.remote_id, limit=5))
    again = store.submit("op-copy", copy(target.remote_id, limit=5))
    assert isinstance(first, Committed) and first.count == 5 and first.digest.startswith("sha256:")
    assert again == first
    assert store.lookup("op-copy") == first
    stats = simulator.stats()
    assert stats["by_op_key"] == {"op-prepare": 1, "op-copy": 1}
    assert stats["by_action"] == {"prepare_target": 1, "copy_batch": 1}


def test_an_op_key_never_sent_is_not_found(simulator: Simulator) -> None:
    assert connect(simulator).lookup("op-never-sent") == NotFound()


def test_accept_then_drop_is_interrupted_and_a_lookup_recovers_the_receipt(simulator: Simulator) -> None:
    store = connect(simulator)
    simulator.fault("accept_then_drop")
    outcome = store.submit("op-prepare", prepare())
    assert isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED
    recovered = store.lookup("op-prepare")
    assert isinstance(recovered, Committed) and recovered.remote_id.startswith("tgt-acme-")
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1}, "the query did not create a second job"


def test_latency_beyond_the_timeout_is_interrupted_but_the_write_commits(simulator: Simulator) -> None:
    store = connect(simulator, timeout=0.2)
    simulator.fault("latency", ms=600)
    outcome = store.submit("op-slow", prepare())
    assert isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED
    for _ in range(50):  # the remote finishes the write after the client gave up
        if isinstance(recovered := store.lookup("op-slow"), Committed):
            break
        time.sleep(0.05)
    assert isinstance(recovered, Committed)
    assert simulator.stats()["by_op_key"] == {"op-slow": 1}


def test_latency_within_the_timeout_only_delays(simulator: Simulator) -> None:
    simulator.fault("latency", ms=50)
    assert isinstance(connect(simulator).submit("op-1", prepare()), Committed)


@pytest.mark.parametrize(("mode", "failure_class"), REFUSALS)
def test_each_refusal_maps_to_its_failure_class_and_writes_nothing(
    simulator: Simulator, mode: str, failure_class: FailureClass
) -> None:
    store = connect(simulator)
    simulator.fault(mode, times=2)
    for _ in range(2):
        outcome = store.submit("op-1", prepare())
        assert isinstance(outcome, Failed) and outcome.failure_class == failure_class
    assert simulator.stats()["side_effects"] == 0
    assert store.lookup("op-1") == NotFound()
    assert isinstance(store.submit("op-1", prepare()), Committed), "the fault lasted exactly two requests"


def test_real_refusals_map_to_their_classes(simulator: Simulator) -> None:
    store = connect(simulator)
    bad = store.submit("op-2", copy("tgt-nobody"))
    assert isinstance(bad, Failed) and bad.failure_class == FailureClass.INVALID_PARAMS
    unknown = store.submit("op-3", {"action": "mail.send", "input": {}})
    assert isinstance(unknown, Failed) and unknown.failure_class == FailureClass.INVALID_PARAMS
    simulator.set_source("projects/acme", "8")  # the source moved on since the plan read version 7
    conflict = store.submit("op-1", prepare())
    assert isinstance(conflict, Failed) and conflict.failure_class == FailureClass.CONFLICT
    assert "version 8" in conflict.detail
    assert simulator.stats()["side_effects"] == 0


def test_a_copy_larger_than_the_transaction_boundary_is_refused(simulator: Simulator) -> None:
    store = connect(simulator)
    target = store.submit("op-prepare", prepare())
    assert isinstance(target, Committed)
    too_big = store.submit("op-copy", copy(target.remote_id, limit=501))
    assert isinstance(too_big, Failed) and too_big.failure_class == FailureClass.INVALID_PARAMS


def test_an_unreachable_store_is_unavailable_not_unknown(simulator: Simulator) -> None:
    port = free_port()  # nothing listens on it
    store = ObjectStoreConnector(f"http://127.0.0.1:{port}", timeout=1)
    outcome = store.submit("op-1", prepare())
    assert isinstance(outcome, Failed) and outcome.failure_class == FailureClass.DEPENDENCY_UNAVAILABLE
    lookup = store.lookup("op-1")
    assert isinstance(lookup, Failed) and lookup.failure_class == FailureClass.CONNECTION_INTERRUPTED


def test_current_version_reads_the_source(simulator: Simulator) -> None:
    store = connect(simulator)
    simulator.set_source("projects/acme", "9", "sha256:cd")
    assert store.current_version("projects/acme") == "9"
    with pytest.raises(SourceNotFound):
        store.current_version("projects/nobody")


def test_state_survives_a_sigkill_and_restart(simulator: Simulator) -> None:
    store = connect(simulator)
    target = store.submit("op-prepare", prepare())
    assert isinstance(target, Committed)
    first = store.submit("op-copy", copy(target.remote_id))
    simulator.set_source("projects/acme", "7", SOURCE["digest"])
    simulator.kill()
    simulator.start()
    store = connect(simulator)
    assert store.lookup("op-copy") == first
    assert store.submit("op-copy", copy(target.remote_id)) == first
    assert store.current_version("projects/acme") == "7"
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1, "op-copy": 1}
    assert not list(simulator.state.parent.glob("*.tmp")), "no temp file left behind"


def test_without_idempotency_lookups_are_unprovable_and_replays_repeat(simulator: Simulator) -> None:
    store = connect(simulator)
    simulator.fault("no_idempotency")
    assert isinstance(store.submit("op-1", prepare()), Committed)
    assert isinstance(store.submit("op-1", prepare()), Committed)
    assert isinstance(store.lookup("op-1"), Unprovable)
    assert simulator.stats()["by_op_key"] == {"op-1": 2}


def test_cleanup_deletes_only_the_temporary_copies(simulator: Simulator) -> None:
    store = connect(simulator)
    target = store.submit("op-prepare", prepare())
    assert isinstance(target, Committed)
    for batch in (1, 2):
        assert isinstance(store.submit(f"op-copy-{batch}", copy(target.remote_id, batch=batch, limit=3)), Committed)
    request = {"action": "store.delete_objects", "input": {"target": target.remote_id, "prefix": "tmp/"}}
    deleted = store.submit("op-delete", request)
    assert isinstance(deleted, Committed) and deleted.count == 2
    verify = {"action": "store.verify_digests", "input": {"target": target.remote_id, "source": SOURCE}}
    verified = store.submit("op-verify", verify)
    assert isinstance(verified, Committed) and verified.count == 6 and verified.digest == SOURCE["digest"]


def test_switch_and_restore_move_the_reference(simulator: Simulator) -> None:
    store = connect(simulator)
    target = store.submit("op-prepare", prepare())
    assert isinstance(target, Committed)
    body = {"target": target.remote_id, "source": SOURCE}
    switched = store.submit("op-switch", {"action": "store.switch_reference", "input": body})
    assert isinstance(switched, Committed) and switched.remote_version == "7"
    assert simulator.control("/_state")["references"]["projects/acme"]["target"] == target.remote_id
    restored = store.submit("op-restore", {"action": "store.restore_reference", "input": body})
    assert isinstance(restored, Committed)
    assert simulator.control("/_state")["references"]["projects/acme"]["target"] == ""


@pytest.mark.parametrize("fault", [None, "accept_then_drop"])
def test_the_readme_agent_loop_runs_the_demo_plan_against_the_store(
    db: None, simulator: Simulator, fault: str | None
) -> None:
    store = connect(simulator)
    plan = migration_plan()
    simulator.set_source("projects/acme", "7", plan["nodes"][0]["input"]["source"]["ref"]["digest"])
    if fault:
        simulator.fault(fault)  # the first write (prepare-target) commits and its answer is lost
    task = task_create(kind="migrate_project", title="Migrate acme", plan=plan, created_by="agent:migrator")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="worker-7")
    reconciled = 0
    for _ in range(100):
        lease = lease_renew(lease=lease, expected_renewal_seq=lease.renewal_seq)
        d = next_directive(task_id=task.pk, lease=lease)
        if d.kind == "reconcile":
            reconciled += 1
            record_outcome(
                snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version),
                d.op_key,
                store.lookup(d.op_key),
                lease=lease,
            )
        elif d.kind == "execute":  # commit 1: the operation, registered as sent before the call
            op = operation_start(
                snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), d.node_key, lease=lease
            ).operation
            outcome = store.submit(op.op_key, op.request)
            record_outcome(
                snapshot_at(task_id=op.task_id, lease=lease, expected_version=d.task_version + 1),
                op.op_key,
                outcome,
                lease=lease,
            )
        else:
            break
    assert (d.kind, d.reason, d.node_key) == ("stop", "awaiting_approval", "approve-cleanup")
    assert reconciled == (1 if fault else 0)
    statuses = dict(Node.objects.filter(task=task).values_list("key", "status"))
    assert statuses.pop("approve-cleanup") == statuses.pop("delete-temp-copies") == NodeStatus.PENDING
    assert set(statuses.values()) == {NodeStatus.SUCCEEDED}
    ops = Operation.objects.filter(task=task)
    assert set(ops.values_list("status", flat=True)) == {OperationStatus.COMMITTED}
    receipts = {
        r.operation.node.key: r for r in Receipt.objects.filter(operation__task=task).select_related("operation__node")
    }
    assert receipts["copy-batch-1"].count == 50
    assert receipts["verify-digests"].count == 150
    assert receipts["verify-digests"].digest == SOURCE["digest"]
    assert receipts["switch-reference"].remote_version == "7"
    stats = simulator.stats()
    assert stats["by_op_key"] == {op_key: 1 for op_key in ops.values_list("op_key", flat=True)}
    assert stats["side_effects"] == 6
    target = receipts["prepare-target"].remote_id
    assert Node.objects.get(task=task, key="copy-batch-1").operations.get().request["input"]["target"] == target
    assert simulator.control("/_state")["references"]["projects/acme"]["target"] == target
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING


def test_every_committed_write_is_journalled_by_its_op_key_tag(simulator: Simulator) -> None:
    assert simulator.call("GET", "/ops-by-tag/op-1") == (404, {"state": "not_found"})
    receipt = connect(simulator).submit("op-1", prepare())
    assert isinstance(receipt, Committed)
    status, answer = simulator.call("GET", "/ops-by-tag/op-1")
    assert (status, answer["state"], answer["count"]) == (200, "committed", 1)
    assert answer["receipt"]["remote_id"] == receipt.remote_id
    assert simulator.stats()["by_op_key"] == {"op-1": 1}, "a query is not a side effect"


def test_no_idempotency_no_query_holds_for_the_run_until_cleared(simulator: Simulator) -> None:
    store = connect(simulator)
    simulator.fault("no_idempotency_no_query")
    for op_key in ("op-1", "op-1", "op-2"):
        assert isinstance(store.submit(op_key, prepare()), Committed)
    for _ in range(3):
        assert simulator.call("GET", "/ops/op-1")[0] == 501
        assert simulator.call("GET", "/ops-by-tag/op-1")[0] == 501
    assert simulator.stats()["by_op_key"] == {"op-1": 2, "op-2": 1}, "no dedupe"
    simulator.control("/_faults", {"mode": "clear"})
    assert simulator.call("GET", "/ops-by-tag/op-1")[1]["count"] == 2, "the journal kept every write"
    simulator.fault("no_idempotency_no_query")
    simulator.control("/_reset", {})
    assert simulator.call("GET", "/ops-by-tag/op-1") == (404, {"state": "not_found"})


def test_accept_then_drop_waits_for_a_write(simulator: Simulator) -> None:
    store = connect(simulator)
    simulator.fault("accept_then_drop")
    assert store.lookup("op-1") == NotFound(), "a query has nothing to accept: it is answered"
    assert simulator.call("GET", "/ops-by-tag/op-1")[0] == 404
    outcome = store.submit("op-1", prepare())
    assert isinstance(outcome, Failed) and outcome.failure_class == FailureClass.CONNECTION_INTERRUPTED
    assert isinstance(store.lookup("op-1"), Committed)


def test_a_state_file_from_before_the_tag_journal_still_loads(simulator: Simulator) -> None:
    store = connect(simulator)
    assert isinstance(first := store.submit("op-1", prepare()), Committed)
    state = simulator.call("GET", "/_state")[1]
    simulator.kill()
    del state["tags"], state["running"]  # a file of then: the whole state in one file, no journal beside it
    simulator.state.write_text(json.dumps(state))
    journal(simulator).unlink()
    simulator.start()
    store = connect(simulator)
    assert store.lookup("op-1") == first
    assert simulator.call("GET", "/ops-by-tag/op-1") == (404, {"state": "not_found"})
    assert isinstance(store.submit("op-2", prepare()), Committed)
    assert simulator.call("GET", "/ops-by-tag/op-2")[1]["count"] == 1


@pytest.mark.parametrize("locator", ["", "..", "tgt-acme-job-1/tmp/../objects/1/0"])
def test_the_store_refuses_a_malformed_delete_by_name(simulator: Simulator, locator: str) -> None:
    assert isinstance(connect(simulator).submit("op-1", prepare()), Committed)
    before = simulator.snapshot()
    status, answer = simulator.call("POST", "/ops/op-delete", {"action": "delete", "params": {"locator": locator}})
    assert (status, answer["error"]) == (400, "invalid_locator")
    status, answer = simulator.call("POST", "/ops/op-delete", {"action": "delete", "params": {}})
    assert (status, answer["error"]) == (400, "invalid_locator")
    assert simulator.snapshot() == before


def test_a_fault_can_be_limited_to_one_action_and_to_every_nth_request(simulator) -> None:
    store = simulator
    store.fault("dependency_unavailable", times=2, action="prepare_target", every=2)
    statuses = []
    for n in range(5):
        status, _ = store.call("POST", f"/ops/k{n}", {"action": "prepare_target", "params": {"project": f"p{n}"}})
        statuses.append(status)
    # Only the 2nd and 4th prepare_target writes fail; a query or another action never consumes the fault.
    assert statuses == [200, 503, 200, 503, 200]
    store.fault("dependency_unavailable", times=1, action="copy_batch")
    assert store.call("GET", "/ops/k0")[0] == 200
    assert store.call("POST", "/ops/k9", {"action": "prepare_target", "params": {"project": "q"}})[0] == 200
    assert store.stats()["side_effects"] == 4
    for bad in ({"every": 0}, {"every": "2"}, {"action": 3}):
        assert store.call("POST", "/_faults", {"mode": "latency", **bad})[0] == 400


def journal(sim: Simulator) -> Any:
    return sim.state.with_name(sim.state.name + ".journal")


def test_a_write_journals_what_it_changed_not_the_store(simulator: Simulator) -> None:
    """Persisting a write costs its own size: the journal line of a small write after a large one is small, and the
    store restarted after a SIGKILL holds both (replayed over the snapshot)."""
    store = connect(simulator)
    target = store.submit("op-1", prepare())
    assert isinstance(target, Committed)
    assert isinstance(store.submit("op-2", copy(target.remote_id, batch=1, limit=500)), Committed)
    big = journal(simulator).read_text().splitlines()[-1]
    assert isinstance(store.submit("op-3", copy(target.remote_id, batch=2, limit=1)), Committed)
    small = journal(simulator).read_text().splitlines()[-1]
    assert len(small) * 20 < len(big), (len(small), len(big))
    before = simulator.call("GET", "/_state")[1]
    simulator.kill()
    simulator.start()
    assert simulator.call("GET", "/_state")[1] == before
    assert journal(simulator).read_text() == "", "start-up compacts: the snapshot holds every write"


def test_a_torn_last_journal_line_is_a_write_never_answered(simulator: Simulator) -> None:
    store = connect(simulator)
    assert isinstance(store.submit("op-1", prepare()), Committed)
    before = simulator.call("GET", "/_state")[1]
    simulator.kill()
    with journal(simulator).open("a") as torn:
        torn.write('{"collections": {"ops": [{"op-2": ')
    simulator.start()
    assert simulator.call("GET", "/_state")[1] == before
    assert connect(simulator).lookup("op-2") == NotFound()
