"""A final "not found" (docs/design.md): a request still in flight when its caller gave up must not land after the
record says it never happened — a cancel or a person's "not done" closes an operation only once the remote fenced its
op key, or once the request's deadline (plus the clock skew) has passed and the remote refuses it.

Against the simulator as its own process; the late request is real: the store holds it (a latency fault) while the
caller times out, and it reaches the store's perform after the cancel. The store counts every effect and refusal.
"""

import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from pytest_django.fixtures import Settings as SettingsWrapper

from audit.models import AuditEvent
from audit.principals import Principal
from leases import clock
from leases.services import lease_release
from observability.tracing import TracedConnector
from reference.objectstore import ObjectStoreConnector
from tasks.core.errors import InvalidTransition
from tasks.core.lifecycle import FailureClass, OperationStatus, TaskStatus
from tasks.core.outcomes import Committed, Failed, Fenced, NotFound, Outcome
from tasks.decide.decisions import not_found_final_at
from tasks.engine.connectors import Connector, Fencing, send_view
from tasks.engine.events import find_log_problem
from tasks.engine.runner import run_steps
from tasks.models import Event, Operation, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.settlement import operation_settle_by_hand
from tasks.people.takeover import takeover_claim
from tests.conftest import effect_node, person, snapshot
from tests.kinds import kind_registered
from tests.simulator_fixture import Simulator
from tests.steps import record, send, version

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "final-not-found-test"
CREATOR = Principal.agent("tester")
LATE_MS = 1500  # how long the store holds the late request before its perform
CALLER_TIMEOUT = 0.3  # the caller gives up long before


def plan() -> dict[str, Any]:
    node = effect_node("prepare", action="store.prepare_target", input={"project": "acme"})
    return {"nodes": [node]}


class LookupOnly:
    """A connector to the same store that cannot fence: a cancel relies on the request's deadline."""

    def __init__(self, store: ObjectStoreConnector) -> None:
        self.store = store

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self.store.submit(op_key, request)

    def lookup(self, op_key: str) -> Outcome:
        return self.store.lookup(op_key)

    def current_version(self, locator: str) -> str:
        return self.store.current_version(locator)

    def delete(self, op_key: str, locator: str) -> Outcome:
        return self.store.delete(op_key, locator)

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self.store.compensate(op_key, request)


def wait_for(simulator: Simulator, stat: str, value: int, seconds: float = 10.0) -> dict[str, Any]:
    """The store's counters once ``stat`` reached ``value`` (the late request has reached its perform)."""
    deadline = time.monotonic() + seconds
    while True:
        stats = simulator.stats()
        if stats[stat] >= value or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def in_flight(simulator: Simulator, connector: Connector, make_task: Any, agent_lease: Any) -> tuple[Task, Any, Any]:
    """A task whose one node was sent and whose answer never came: the store still holds the request."""
    task = make_task(plan(), kind=KIND)
    lease = agent_lease(task)
    op = send(task, lease, "prepare")
    simulator.fault("latency", ms=LATE_MS)
    answer = connector.submit(op.op_key, send_view(op.request, op.not_after))
    assert isinstance(answer, Failed) and answer.failure_class == FailureClass.CONNECTION_INTERRUPTED, answer
    op = record(op, answer, lease)
    assert op.status == OperationStatus.UNKNOWN
    assert isinstance(connector.lookup(op.op_key), NotFound)  # not yet: the store still holds it
    return task, lease, op


def effects_of(simulator: Simulator, op_key: str) -> int:
    return int(simulator.stats()["by_op_key"].get(op_key, 0))


# --- the store: a fence and a deadline, each checked in the perform's own step ---------------------------------


def test_a_fenced_op_key_refuses_the_request_still_in_flight(simulator: Simulator) -> None:
    store = ObjectStoreConnector(simulator.url, timeout=CALLER_TIMEOUT)
    simulator.fault("latency", ms=LATE_MS)
    request = {"action": "store.prepare_target", "input": {"project": "acme"}}
    lost = store.submit("op-late", request)
    assert isinstance(lost, Failed) and lost.failure_class == FailureClass.CONNECTION_INTERRUPTED
    assert isinstance(store.lookup("op-late"), NotFound)

    assert store.fence("op-late") == Fenced()

    stats = wait_for(simulator, "refused_fenced", 1)
    assert (stats["refused_fenced"], stats["by_op_key"].get("op-late", 0)) == (1, 0)
    assert isinstance(store.lookup("op-late"), NotFound)
    assert store.submit("op-late", request) == Fenced()  # refused for ever, under that op key
    assert store.fence("op-late") == Fenced()  # asking again changes nothing
    assert effects_of(simulator, "op-late") == 0


def test_a_fence_after_the_effect_answers_its_receipt_and_fences_nothing(simulator: Simulator) -> None:
    store = ObjectStoreConnector(simulator.url)
    request = {"action": "store.prepare_target", "input": {"project": "acme"}}
    first = store.submit("op-done", request)
    assert isinstance(first, Committed)
    assert store.fence("op-done") == first
    assert store.submit("op-done", request) == first  # deduplicated, not refused
    assert effects_of(simulator, "op-done") == 1 and simulator.stats()["refused_fenced"] == 0


def test_a_request_that_reaches_the_store_after_its_deadline_takes_no_effect(simulator: Simulator) -> None:
    store = ObjectStoreConnector(simulator.url)
    request = {"action": "store.prepare_target", "input": {"project": "acme"}}
    past = "2020-01-01T00:00:00+00:00"
    late = store.submit("op-past", request | {"not_after": past})
    # No effect, and not a free re-send: a refusal retried on the budget (see the test below).
    assert isinstance(late, Failed) and late.failure_class == FailureClass.DEPENDENCY_UNAVAILABLE, late
    assert "deadline_passed" in late.detail
    assert (simulator.stats()["refused_late"], effects_of(simulator, "op-past")) == (1, 0)
    # The same op key sent again with a deadline ahead takes effect once.
    assert isinstance(store.submit("op-past", request | {"not_after": "2999-01-01T00:00:00+00:00"}), Committed)
    assert effects_of(simulator, "op-past") == 1
    # A deadline the store cannot read is a malformed request, not a silent pass.
    bad = store.submit("op-bad", request | {"not_after": "next tuesday"})
    assert isinstance(bad, Failed) and bad.failure_class == FailureClass.INVALID_PARAMS
    assert effects_of(simulator, "op-bad") == 0


# --- a cancel: closed only on a final not found ------------------------------------------------------------------


def test_a_cancel_fences_the_op_key_and_the_late_request_lands_nowhere(
    simulator: Simulator, make_task: Any, agent_lease: Any
) -> None:
    store = ObjectStoreConnector(simulator.url, timeout=CALLER_TIMEOUT)
    assert isinstance(store, Fencing)
    with kind_registered(KIND, connector=lambda: store):
        task, lease, op = in_flight(simulator, store, make_task, agent_lease)
        task_request_cancel(task_id=task.pk, actor=CREATOR, reason="the customer withdrew")

        report = run_steps(task_id=task.pk, lease=lease, connector=store)

    assert report.directive is not None and report.directive.kind == "stop"
    settled = Operation.objects.get(pk=op.pk)
    assert (settled.status, settled.failure_class) == (OperationStatus.REJECTED, "cancelled")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.STOPPED
    stats = wait_for(simulator, "refused_fenced", 1)
    assert stats["refused_fenced"] == 1 and effects_of(simulator, op.op_key) == 0  # the log and the store agree
    assert find_log_problem(Task.objects.get(pk=task.pk)) is None


def test_without_a_fence_a_cancel_waits_for_the_deadline_and_the_late_request_is_refused(
    simulator: Simulator, make_task: Any, agent_lease: Any, settings: SettingsWrapper
) -> None:
    settings.RECKON_REQUEST_DEADLINE = timedelta(milliseconds=800)  # shorter than the store holds the request
    settings.RECKON_REMOTE_CLOCK_SKEW = timedelta(milliseconds=200)
    lookup_only = LookupOnly(ObjectStoreConnector(simulator.url, timeout=CALLER_TIMEOUT))
    assert not isinstance(lookup_only, Fencing)
    with kind_registered(KIND, connector=lambda: lookup_only):
        task, lease, op = in_flight(simulator, lookup_only, make_task, agent_lease)
        task_request_cancel(task_id=task.pk, actor=CREATOR, reason="the customer withdrew")

        first = run_steps(task_id=task.pk, lease=lease, connector=lookup_only)
        pending = Operation.objects.get(pk=op.pk)
        # Not found, not final: still unknown, the task stopped with a reconciliation pending, woken when final.
        assert (pending.status, pending.failure_class) == (OperationStatus.UNKNOWN, "not_found_not_final")
        assert Task.objects.get(pk=task.pk).status == TaskStatus.STOPPED_PENDING
        assert first.directive is not None and first.directive.kind == "wait"
        assert first.wake_at == not_found_final_at(pending)
        assert Event.objects.filter(task=task, type="operation_not_found_yet").count() == 1

        time.sleep(max(0.0, (not_found_final_at(pending) - clock.now()).total_seconds()) + 0.05)
        second = run_steps(task_id=task.pk, lease=lease, connector=lookup_only)

    assert second.directive is not None and second.directive.kind == "stop"
    settled = Operation.objects.get(pk=op.pk)
    assert (settled.status, settled.failure_class) == (OperationStatus.REJECTED, "cancelled")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.STOPPED
    stats = wait_for(simulator, "refused_late", 1)
    assert stats["refused_late"] == 1 and effects_of(simulator, op.op_key) == 0
    assert find_log_problem(Task.objects.get(pk=task.pk)) is None


def test_a_store_whose_clock_runs_past_every_deadline_ends_the_task_on_its_budget_not_in_a_loop(
    simulator: Simulator, make_task: Any, agent_lease: Any, settings: SettingsWrapper
) -> None:
    """A remote whose clock runs ahead of the database's by more than the deadline refuses every send as late (here
    the deadline is set in the past, the same to the store). Each refusal took no effect, but it must not count as
    "not found, send again for free": that loops for ever. Each is a dependency_unavailable retry on the budget, so
    the task stops, saying so, after as many sends as its budget allows — and the store counts no effect."""
    settings.RECKON_REQUEST_DEADLINE = timedelta(seconds=-60)
    settings.RECKON_BACKOFF_BASE = timedelta(0)
    store = ObjectStoreConnector(simulator.url)
    with kind_registered(KIND, connector=lambda: store):
        task = make_task(plan(), kind=KIND)
        lease = agent_lease(task)
        for _ in range(10):  # each run takes a step or more; the budget ends it well before
            report = run_steps(task_id=task.pk, lease=lease, connector=store)
            if report.directive is not None and report.directive.kind == "stop":
                break
    task = Task.objects.get(pk=task.pk)
    sends = Operation.objects.filter(task=task).count()
    assert task.status_reason == "budget_exhausted", (task.status, task.status_reason)
    assert sends == settings.RECKON_DEFAULT_NODE_ATTEMPTS
    assert simulator.stats()["refused_late"] == sends and effects_of(simulator, "") == 0
    assert sum(simulator.stats()["by_op_key"].values()) == 0
    failures = set(Operation.objects.filter(task=task).values_list("failure_class", flat=True))
    assert failures == {FailureClass.DEPENDENCY_UNAVAILABLE.value}
    assert find_log_problem(task) is None


def test_a_store_that_ignores_its_fence_lets_the_late_request_land_and_the_count_shows_it(
    simulator: Simulator, make_task: Any, agent_lease: Any
) -> None:
    """The check above can fail: against a store that answers "fenced" but keeps no tombstone, the late request
    lands under an op key the log records as cancelled — the effect the kill matrix counts as denied."""
    simulator.fault("ignore_fence")
    store = ObjectStoreConnector(simulator.url, timeout=CALLER_TIMEOUT)
    with kind_registered(KIND, connector=lambda: store):
        task, lease, op = in_flight(simulator, store, make_task, agent_lease)
        task_request_cancel(task_id=task.pk, actor=CREATOR, reason="the customer withdrew")
        run_steps(task_id=task.pk, lease=lease, connector=store)
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.REJECTED  # the log: never took effect
    wait_for(simulator, "side_effects", 1)
    assert effects_of(simulator, op.op_key) == 1  # the store: it did


# --- a person's "not done" ----------------------------------------------------------------------------------------


def _handed_to(operator: Principal, task: Task, lease: Any) -> None:
    lease_release(lease=lease)
    claim = takeover_claim(actor=operator, task_id=task.pk)
    assert claim.granted, claim


def _not_done(operator: Principal, op: Operation) -> Operation:
    return operation_settle_by_hand(
        actor=operator,
        task_id=op.task_id,
        op_key=op.op_key,
        expected_version=version(op.task),
        resolution="not_done",
        note="the store's history shows nothing under this key",
    )


def test_a_persons_not_done_fences_the_op_key_first_and_the_late_request_is_refused(
    simulator: Simulator, make_task: Any, agent_lease: Any
) -> None:
    store = ObjectStoreConnector(simulator.url, timeout=CALLER_TIMEOUT)
    admin = person("ann", "admin")
    with kind_registered(KIND, connector=lambda: store):
        task, lease, op = in_flight(simulator, store, make_task, agent_lease)
        _handed_to(admin, task, lease)

        settled = _not_done(admin, op)  # at once: the server's connector fenced it

    assert (settled.status, settled.failure_class) == (OperationStatus.REJECTED, "not_done")
    audit = AuditEvent.objects.filter(task_id=task.pk, action="operation_resolved_by_person").get()
    assert audit.details["fenced"] is True
    stats = wait_for(simulator, "refused_fenced", 1)
    assert stats["refused_fenced"] == 1 and effects_of(simulator, op.op_key) == 0


def test_a_persons_not_done_is_refused_when_the_remote_holds_the_write(
    simulator: Simulator, make_task: Any, agent_lease: Any
) -> None:
    store = ObjectStoreConnector(simulator.url, timeout=CALLER_TIMEOUT)
    admin = person("ann", "admin")
    with kind_registered(KIND, connector=lambda: store):
        task, lease, op = in_flight(simulator, store, make_task, agent_lease)
        _handed_to(admin, task, lease)
        wait_for(simulator, "side_effects", 1)  # the late request landed before anyone fenced it
        before = snapshot()

        with pytest.raises(InvalidTransition, match="took effect"):
            _not_done(admin, op)

    assert snapshot() == before, "a refused settlement writes nothing"
    assert effects_of(simulator, op.op_key) == 1 and simulator.stats()["refused_fenced"] == 0


def test_the_settings_state_a_deadline_longer_than_a_connectors_timeout() -> None:
    """The deadline must outlast the connector's own wait, or a request would be refused while its caller waits."""
    assert timedelta(seconds=ObjectStoreConnector("http://x").timeout) < settings.RECKON_REQUEST_DEADLINE


def test_the_traced_connector_every_worker_uses_fences_through_to_the_store(simulator: Simulator) -> None:
    """The workers' connectors are wrapped for tracing: the wrapper must fence where the store can (the Fencing
    protocol is checked on the class, so a forwarding ``__getattr__`` is not enough) and fall back to a lookup,
    never to a claimed fence, where it cannot."""
    store = ObjectStoreConnector(simulator.url)
    traced = TracedConnector(store)
    assert isinstance(traced, Fencing)
    assert traced.fence("op-never-sent") == Fenced()
    assert store.submit("op-never-sent", {"action": "store.prepare_target", "input": {"project": "a"}}) == Fenced()
    assert TracedConnector(LookupOnly(store)).fence("op-other") == NotFound()  # cannot fence: only looked up
    assert isinstance(
        store.submit("op-other", {"action": "store.prepare_target", "input": {"project": "a"}}), Committed
    )
