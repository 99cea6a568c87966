"""The connector contract beyond submit: delete, compensate, temp objects and the two ways to be idempotent.

Every test runs against the simulator as its own process and counts the side effects the store itself recorded.
"""

from typing import Any

import pytest

from harness.simulator import STAGING_PREFIX
from reference.objectstore import Idempotency, ObjectStoreConnector
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed, NotFound, Outcome, Unprovable
from tasks.engine.connectors import Connector
from tests.simulator_fixture import REFUSALS, Simulator

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def connect(sim: Simulator, idempotency: Idempotency = "remote") -> ObjectStoreConnector:
    return ObjectStoreConnector(sim.url, timeout=5.0, idempotency=idempotency)


def prepare(project: str = "acme") -> dict[str, Any]:
    return {"action": "store.prepare_target", "input": {"project": project, "source": SOURCE}}


def copy(target: str, batch: int = 1, limit: int = 3) -> dict[str, Any]:
    return {"action": "store.copy_batch", "input": {"target": target, "source": SOURCE, "batch": batch, "limit": limit}}


def staging(target: str, name: str = "batch-1") -> str:
    """The key of a temporary object under ``target`` (copy_batch stages ``batch-<n>`` there)."""
    return f"{target}/{STAGING_PREFIX}{name}"


def committed(outcome: Outcome) -> Committed:
    assert isinstance(outcome, Committed), outcome
    return outcome


def failed(outcome: Outcome, failure_class: FailureClass) -> Failed:
    assert isinstance(outcome, Failed) and outcome.failure_class == failure_class, outcome
    return outcome


def target_with_batches(store: ObjectStoreConnector, *batches: int, project: str = "acme") -> str:
    target = committed(store.submit(f"op-prepare-{project}", prepare(project))).remote_id
    for batch in batches:
        committed(store.submit(f"op-copy-{project}-{batch}", copy(target, batch=batch)))
    return target


@pytest.mark.parametrize("idempotency", ["remote", "tag"])
def test_both_idempotency_modes_satisfy_the_contract(simulator: Simulator, idempotency: Idempotency) -> None:
    assert isinstance(connect(simulator, idempotency), Connector)


def test_an_unknown_idempotency_mode_is_refused(simulator: Simulator) -> None:
    with pytest.raises(ValueError, match="'remote' or 'tag'"):
        ObjectStoreConnector(simulator.url, idempotency="hope")  # type: ignore[arg-type]


# delete


def test_delete_removes_one_object_exactly_once_per_op_key(simulator: Simulator) -> None:
    store = connect(simulator)
    target = target_with_batches(store, 1)
    temp = staging(target)
    first = store.delete("op-delete", temp)
    assert first == Committed(remote_id=temp, count=1)
    assert store.delete("op-delete", temp) == first, "a replay answers the first receipt"
    assert store.lookup("op-delete") == first
    assert temp not in simulator.snapshot()["objects"]
    stats = simulator.stats()
    assert stats["by_op_key"]["op-delete"] == 1
    assert stats["by_action"]["delete"] == 1


def test_deleting_an_absent_object_is_committed_with_nothing_removed(simulator: Simulator) -> None:
    store = connect(simulator)
    target = target_with_batches(store, 1)
    temp = staging(target)
    committed(store.delete("op-delete-1", temp))
    objects = simulator.snapshot()["objects"]
    assert store.delete("op-delete-2", temp) == Committed(remote_id=temp, count=0)
    assert store.delete("op-delete-3", staging("tgt-nobody")) == Committed(remote_id=staging("tgt-nobody"), count=0)
    assert simulator.snapshot()["objects"] == objects
    stats = simulator.stats()
    assert {key: stats["by_op_key"][key] for key in ("op-delete-1", "op-delete-2", "op-delete-3")} == {
        "op-delete-1": 1,
        "op-delete-2": 1,
        "op-delete-3": 1,
    }
    assert stats["by_action"]["delete"] == 3


def test_delete_never_removes_another_key(simulator: Simulator) -> None:
    store = connect(simulator)
    acme = target_with_batches(store, 1, 10)
    beta = target_with_batches(store, 1, project="beta")
    before = simulator.snapshot()["objects"]
    assert {staging(acme), staging(acme, "batch-10"), staging(beta)} <= set(before)

    assert committed(store.delete("op-delete-prefix", staging(acme, "batch"))).count == 0, "never a prefix match"
    assert committed(store.delete("op-delete-dir", staging(acme, ""))).count == 0
    assert simulator.snapshot()["objects"] == before

    assert committed(store.delete("op-delete", staging(acme))).count == 1
    after = simulator.snapshot()["objects"]
    assert after == {key: obj for key, obj in before.items() if key != staging(acme)}


@pytest.mark.parametrize("locator", ["", "   ", "..", staging("tgt-acme-job-1/../tgt-beta-job-2"), "a/.."])
def test_a_malformed_locator_is_refused_by_name_and_changes_nothing(simulator: Simulator, locator: str) -> None:
    store = connect(simulator)
    target_with_batches(store, 1)
    before = simulator.snapshot()
    status, answer = simulator.call("POST", "/ops/op-raw", {"action": "delete", "params": {"locator": locator}})
    assert (status, answer["error"]) == (400, "invalid_locator")
    refused = failed(store.delete("op-delete", locator), FailureClass.INVALID_PARAMS)
    assert refused.detail.startswith("HTTP 400: ")
    assert simulator.snapshot() == before
    assert store.lookup("op-delete") == NotFound()


@pytest.mark.parametrize(("mode", "failure_class"), REFUSALS)
def test_delete_refusals_map_to_their_failure_classes(
    simulator: Simulator, mode: str, failure_class: FailureClass
) -> None:
    store = connect(simulator)
    temp = staging(target_with_batches(store, 1))
    before = simulator.snapshot()
    simulator.fault(mode)
    failed(store.delete("op-delete", temp), failure_class)
    assert simulator.snapshot() == before, "a refusal writes nothing"
    assert store.lookup("op-delete") == NotFound()
    assert committed(store.delete("op-delete", temp)).count == 1, "the fault lasted one request"
    assert simulator.stats()["by_op_key"]["op-delete"] == 1


def test_a_dropped_delete_is_settled_by_lookup_not_by_sending_again(simulator: Simulator) -> None:
    store = connect(simulator)
    temp = staging(target_with_batches(store, 1))
    simulator.fault("accept_then_drop")
    failed(store.delete("op-delete", temp), FailureClass.CONNECTION_INTERRUPTED)
    assert store.lookup("op-delete") == Committed(remote_id=temp, count=1)
    assert simulator.stats()["by_op_key"]["op-delete"] == 1


# temporary objects


def test_copy_batch_lists_its_temp_object_and_the_connector_surfaces_it(simulator: Simulator) -> None:
    store = connect(simulator)
    target = committed(store.submit("op-prepare", prepare())).remote_id
    copied = committed(store.submit("op-copy", copy(target, batch=1, limit=3)))
    temp = staging(target)
    assert temp == target + "/" + "tmp/batch-1", "the full object key"
    assert copied.data == {"temp": [temp]}
    assert (copied.remote_id, copied.count) == (f"{target}/batch-1", 3), "the receipt keeps its fields"
    assert store.lookup("op-copy") == copied
    receipt = simulator.snapshot()["ops"]["op-copy"]
    assert receipt["temp"] == [temp] and temp in simulator.snapshot()["objects"]
    assert committed(store.submit("op-prepare", prepare())).data == {}, "a write without temp objects has none"

    committed(store.delete("op-cleanup", temp))
    verify = {"action": "store.verify_digests", "input": {"target": target, "source": SOURCE}}
    assert committed(store.submit("op-verify", verify)).count == 3, "the copied objects stay"
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1, "op-copy": 1, "op-cleanup": 1, "op-verify": 1}


# the tag journal: idempotency for a store that does not dedupe


def test_in_tag_mode_a_dropped_write_is_found_by_its_tag(simulator: Simulator) -> None:
    simulator.fault("no_idempotency")
    tagged = connect(simulator, "tag")
    simulator.fault("accept_then_drop")
    failed(tagged.submit("op-prepare", prepare()), FailureClass.CONNECTION_INTERRUPTED)
    found = committed(tagged.lookup("op-prepare"))
    assert found.remote_id.startswith("tgt-acme-")
    assert isinstance(connect(simulator).lookup("op-prepare"), Unprovable), "the store has no lookup by op key"
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1}


def test_a_resend_in_tag_mode_after_a_commit_does_not_write_twice(simulator: Simulator) -> None:
    simulator.fault("no_idempotency")
    tagged = connect(simulator, "tag")
    target = committed(tagged.submit("op-prepare", prepare())).remote_id
    first = committed(tagged.submit("op-copy", copy(target)))
    assert tagged.submit("op-copy", copy(target)) == first
    assert committed(tagged.delete("op-delete", staging(target))).count == 1
    assert tagged.delete("op-delete", staging(target)) == Committed(remote_id=staging(target), count=1)
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1, "op-copy": 1, "op-delete": 1}
    assert simulator.call("GET", "/ops-by-tag/op-copy")[1]["count"] == 1


def test_without_dedupe_the_remote_mode_resends_and_the_journal_counts_both(simulator: Simulator) -> None:
    simulator.fault("no_idempotency")
    remote = connect(simulator)
    committed(remote.submit("op-prepare", prepare()))
    second = committed(remote.submit("op-prepare", prepare()))
    status, answer = simulator.call("GET", "/ops-by-tag/op-prepare")
    assert (status, answer["count"], answer["receipt"]["remote_id"]) == (200, 2, second.remote_id)
    assert simulator.stats()["by_op_key"] == {"op-prepare": 2}


def test_a_failed_tag_query_sends_nothing(simulator: Simulator) -> None:
    simulator.fault("no_idempotency")
    tagged = connect(simulator, "tag")
    simulator.fault("dependency_unavailable")  # answers the query that precedes the write
    refused = failed(tagged.submit("op-prepare", prepare()), FailureClass.CONNECTION_INTERRUPTED)
    assert refused.detail.startswith("not sent: ")
    assert simulator.stats()["side_effects"] == 0
    assert tagged.lookup("op-prepare") == NotFound()
    committed(tagged.submit("op-prepare", prepare()))
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1}


def test_the_tag_journal_survives_a_sigkill_and_restart(simulator: Simulator) -> None:
    simulator.fault("no_idempotency")
    tagged = connect(simulator, "tag")
    target = committed(tagged.submit("op-prepare", prepare())).remote_id
    first = committed(tagged.submit("op-copy", copy(target)))
    simulator.kill()
    simulator.start()
    simulator.fault("no_idempotency")  # a fault mode lasts one run; the journal is state
    tagged = connect(simulator, "tag")
    assert tagged.lookup("op-copy") == first
    assert tagged.submit("op-copy", copy(target)) == first
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1, "op-copy": 1}
    assert not list(simulator.state.parent.glob("*.tmp")), "no temp file left behind"


def test_a_store_that_neither_dedupes_nor_answers_queries_makes_an_unknown_write_unprovable(
    simulator: Simulator,
) -> None:
    tagged = connect(simulator, "tag")
    simulator.fault("accept_then_drop")
    failed(tagged.submit("op-prepare", prepare()), FailureClass.CONNECTION_INTERRUPTED)
    simulator.fault("no_idempotency_no_query")
    assert isinstance(tagged.lookup("op-prepare"), Unprovable)
    assert isinstance(connect(simulator).lookup("op-prepare"), Unprovable)
    assert isinstance(tagged.submit("op-prepare", prepare()), Unprovable), "never resent blindly"
    assert isinstance(tagged.delete("op-delete", staging("tgt-acme-job-1")), Unprovable)
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1}

    simulator.control("/_faults", {"mode": "clear"})
    assert committed(tagged.lookup("op-prepare")).remote_id == "tgt-acme-job-1"


# compensation


def switched(store: ObjectStoreConnector) -> dict[str, Any]:
    target = committed(store.submit("op-prepare", prepare())).remote_id
    body = {"target": target, "source": SOURCE}
    committed(store.submit("op-switch", {"action": "store.switch_reference", "input": body}))
    return body


def test_compensating_a_switch_restores_the_reference_exactly_once(simulator: Simulator) -> None:
    store = connect(simulator)
    body = switched(store)
    restore = {"action": "store.restore_reference", "input": body}
    first = committed(store.compensate("op-restore", restore))
    assert store.compensate("op-restore", restore) == first
    assert store.lookup("op-restore") == first
    assert simulator.snapshot()["references"]["projects/acme"] == {"target": "", "version": "", "history": []}
    stats = simulator.stats()
    assert stats["by_op_key"] == {"op-prepare": 1, "op-switch": 1, "op-restore": 1}
    assert stats["by_action"]["restore_reference"] == 1


def test_a_dropped_compensation_in_tag_mode_is_not_sent_twice(simulator: Simulator) -> None:
    simulator.fault("no_idempotency")
    tagged = connect(simulator, "tag")
    restore = {"action": "store.restore_reference", "input": switched(tagged)}
    simulator.fault("accept_then_drop")
    failed(tagged.compensate("op-restore", restore), FailureClass.CONNECTION_INTERRUPTED)
    assert committed(tagged.compensate("op-restore", restore)).remote_id == "ref:projects/acme"
    assert simulator.snapshot()["references"]["projects/acme"]["target"] == ""
    assert simulator.stats()["by_op_key"]["op-restore"] == 1


def test_a_compensation_outside_the_store_is_refused_and_not_sent(simulator: Simulator) -> None:
    store = connect(simulator)
    body = switched(store)
    failed(store.compensate("op-undo", {"action": "mail.recall", "input": body}), FailureClass.INVALID_PARAMS)
    failed(store.compensate("op-undo", {"input": body}), FailureClass.INVALID_PARAMS)
    assert store.lookup("op-undo") == NotFound()
    assert simulator.stats()["side_effects"] == 2, "only the prepare and the switch"


def test_a_compensation_with_nothing_to_undo_is_invalid_params(simulator: Simulator) -> None:
    store = connect(simulator)
    target = committed(store.submit("op-prepare", prepare())).remote_id
    restore = {"action": "store.restore_reference", "input": {"target": target, "source": SOURCE}}
    failed(store.compensate("op-restore", restore), FailureClass.INVALID_PARAMS)
    assert simulator.stats()["by_op_key"] == {"op-prepare": 1}
