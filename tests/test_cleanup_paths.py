"""Cleanup on every path (issue 24), against the real object-store simulator: a store outage during cleanup (a
temporary refusal backs off on the database clock and spends no attempt), an operation settled by hand (the staging
objects it created are recorded and deleted), and an agent over the API that never comes back (a server worker
deletes its temp resources when the kind has a connector here; otherwise the task is listed for people). Each ends
by counting the store's staging objects, not by asking Reckon."""

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from audit.errors import Refused
from harness.simulator import STAGING_PREFIX
from leases.clock import ControllableClock
from leases.services import lease_acquire, lease_release
from reference import migrate_project
from reference.objectstore import ObjectStoreConnector
from tasks.core.errors import EvidenceInsufficient, InvalidTransition
from tasks.core.lifecycle import FailureClass, OperationStatus, TaskStatus, TempResourceStatus
from tasks.core.outcomes import Committed, Failed, Outcome
from tasks.engine.cleanup import MAX_CLEANUP_ATTEMPTS, cleanup_attempts_spent
from tasks.engine.recovery import tasks_needing_work
from tasks.engine.registry import connector_for, known_kinds
from tasks.engine.runner import run_steps, run_task_once
from tasks.engine.verification import find_problems
from tasks.models import Event, Operation, OperationPurpose, Task, TempResource
from tasks.people.settlement import operation_settle_by_hand, settle_prefill
from tasks.people.takeover import takeover_claim, takeover_submit
from tasks.querysets import Attention
from tasks.reads.queries import attention_reasons
from tests.conftest import person, snapshot
from tests.kinds import kind_registered
from tests.simulator_fixture import Simulator

pytestmark = pytest.mark.django_db

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def start(store: Simulator, project: str = "acme") -> Task:
    source = SOURCE | {"locator": f"projects/{project}"}
    store.set_source(source["locator"], "7", SOURCE["digest"])
    return migrate_project.start(
        project=project,
        objects=30,
        source=source,
        store=ObjectStoreConnector(store.url),
        max_batch=10,
        created_by="agent:migrator",
    )


def staging(store: Simulator) -> list[str]:
    return sorted(key for key in store.snapshot()["objects"] if f"/{STAGING_PREFIX}" in key)


def reasons(task: Task) -> list[Attention]:
    return attention_reasons(Task.objects.with_attention().get(pk=task.pk))


class _LookupsLost:
    """The store's answers to lookups are lost: an operation stays unknown until a person settles it."""

    def __init__(self, inner: ObjectStoreConnector) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def lookup(self, op_key: str) -> Outcome:
        return Failed(FailureClass.CONNECTION_INTERRUPTED, "lookup lost")


# --- a store outage during cleanup ----------------------------------------------------------------------------------


def test_a_store_outage_during_cleanup_backs_off_spends_no_attempt_and_the_staging_copies_are_deleted(
    store: Simulator, clock: ControllableClock
) -> None:
    """The crash run's outage: the store answers 503 to three deletes in a row. Each refusal backs the temp
    resource off on the database clock (longer each time); a wake-up before its moment sends nothing and the scan
    does not wake the task; none spends one of the cleanup's attempts; once the store is back every staging copy
    is deleted and none went to a person."""
    task = start(store)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    lease_release(lease=run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url)).lease)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED and len(staging(store)) == 3
    store.fault("dependency_unavailable", times=MAX_CLEANUP_ATTEMPTS, action="delete")
    waits = []
    for _ in range(MAX_CLEANUP_ATTEMPTS):
        wake = run_task_once(task_id=task.pk, holder_id="worker", connector=ObjectStoreConnector(store.url))
        temp = TempResource.objects.filter(task=task, not_before__isnull=False).get()
        assert temp.not_before is not None
        assert wake.wake_at == temp.not_before and temp.not_before > clock.now(), wake.summary
        assert temp.status == TempResourceStatus.CLEANING and cleanup_attempts_spent(temp) == 0
        waits.append(temp.not_before - clock.now())
        # Before its moment: the scan leaves the task alone, and a wake-up anyway sends nothing.
        assert task.pk not in set(tasks_needing_work().values_list("pk", flat=True))
        sent = store.stats()["by_action"].get("delete", 0)
        run_task_once(task_id=task.pk, holder_id="early", connector=ObjectStoreConnector(store.url))
        assert store.stats()["by_action"].get("delete", 0) == sent
        clock.set(temp.not_before)
        assert task.pk in set(tasks_needing_work().values_list("pk", flat=True))
    assert waits[0] < waits[1] < waits[2], waits  # asked later and later
    wake = run_task_once(task_id=task.pk, holder_id="worker", connector=ObjectStoreConnector(store.url))
    assert "cleanup: 3 deleted, 0 left" in wake.summary, wake.summary
    assert staging(store) == []
    temps = TempResource.objects.filter(task=task)
    assert {t.status for t in temps} == {TempResourceStatus.DELETED}
    assert not Event.objects.filter(task=task, type="cleanup_needs_person").exists()
    assert find_problems(Task.objects.get(pk=task.pk)) == []


# --- settled by hand ------------------------------------------------------------------------------------------------


def test_an_operation_settled_by_hand_records_its_staging_object_and_the_cleanup_deletes_it(
    store: Simulator, settings: Any
) -> None:
    """ginkgo / maple: the store committed copy-batch-2 and its answer was lost, and so are the lookups; a person
    settles it as done. The staging object it created is named on the form (pre-filled from the store, asked by op
    key with the kind's connector), recorded as a temp resource, and deleted once the task completes: the store
    holds no staging object at the end."""
    settings.RECKON_OBJECTSTORE_URL = store.url  # the kind's connector on this server reaches the simulator
    task = start(store)
    store.fault("accept_then_drop", times=1, action="copy_batch", every=2)
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="w")
    report = run_steps(task_id=task.pk, lease=lease, connector=_LookupsLost(ObjectStoreConnector(store.url)))
    lease_release(lease=report.lease)
    lost = Operation.objects.get(task=task, node__key="copy-batch-2", purpose=OperationPurpose.EFFECT)
    assert lost.status == OperationStatus.UNKNOWN
    target = Operation.objects.get(task=task, node__key="prepare-target").remote_id
    assert f"{target}/{STAGING_PREFIX}batch-2" in staging(store)
    assert not TempResource.objects.filter(task=task, node=lost.node).exists()  # nobody knows of it yet

    olga = person("olga", "admin")
    claim = takeover_claim(actor=olga, task_id=task.pk)
    assert claim.lease is not None
    prefill = settle_prefill(kind=task.kind, op_key=lost.op_key)
    assert prefill == [f"{target}/{STAGING_PREFIX}batch-2"]
    receipt = Committed(remote_id=f"{target}:batch-2", count=10)
    version = Task.objects.get(pk=task.pk).version
    note = "the store's console shows batch 2 copied"

    def settle(**extra: Any) -> None:
        fields: dict[str, Any] = {"resolution": "done", "receipt": receipt} | extra
        operation_settle_by_hand(
            actor=olga, task_id=task.pk, op_key=lost.op_key, expected_version=version, note=note, **fields
        )

    before = snapshot()
    refusals: list[tuple[dict[str, Any], type[Refused]]] = [
        ({"resolution": "not_done", "receipt": None, "temp_locators": prefill}, InvalidTransition),
        ({"temp_locators": [""]}, EvidenceInsufficient),
        ({"temp_locators": ["x" * 501]}, EvidenceInsufficient),
        ({"temp_locators": ["https://admin:hunter2@store/tmp/batch-2"]}, Refused),
    ]
    for extra, refusal in refusals:
        with pytest.raises(refusal):
            settle(**extra)
        assert snapshot() == before, extra
    settle(temp_locators=prefill)
    temp = TempResource.objects.get(task=task, node=lost.node)
    assert (temp.locator, temp.status) == (prefill[0], TempResourceStatus.ACTIVE)
    assert Event.objects.filter(task=task, type="node_succeeded").latest("seq").payload["data"]["temp"] == prefill

    version = Task.objects.get(pk=task.pk).version
    takeover_submit(actor=olga, lease=claim.lease, based_on_version=version, decision="resume_agent", note="go on")
    for _ in range(3):  # the hand-back's input re-check, the rest of the plan, the cleanup
        run_task_once(task_id=task.pk, holder_id="w2", connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, (task.status, task.status_detail)
    assert {t.status for t in TempResource.objects.filter(task=task)} == {TempResourceStatus.DELETED}
    assert staging(store) == []
    assert find_problems(task) == []


# --- an agent over the API that never comes back --------------------------------------------------------------------

API_KIND = "migrate_project_api"


def api_task_left(store: Simulator) -> Task:
    """A task of the API kind run to completion by an agent that then died holding its lease, before deleting
    anything: its lease lapsed, its staging copies are recorded and still at the store."""
    task = start(store)
    Task.objects.filter(pk=task.pk).update(kind=API_KIND)  # set-up: the same plan, driven from outside
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="api-agent")
    run_steps(task_id=task.pk, lease=lease, connector=ObjectStoreConnector(store.url))
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED and len(staging(store)) == 3
    return task


def test_a_dead_agent_s_temp_resources_are_listed_for_people_when_no_connector_here_can_delete_them(
    store: Simulator, clock: ControllableClock
) -> None:
    task = api_task_left(store)
    assert Attention.TEMP_RESOURCE_LEFT not in reasons(task)  # its agent still holds it: it may come back now
    clock.advance(settings.RECKON_LEASE_TTL + timedelta(seconds=1))
    assert Attention.TEMP_RESOURCE_LEFT not in reasons(task)  # expired, in its grace: only its agent may renew
    clock.advance(_lapse() - settings.RECKON_LEASE_TTL - timedelta(seconds=1))
    assert reasons(task) == [Attention.TEMP_RESOURCE_LEFT]
    assert task.pk in set(Task.objects.needs_attention().values_list("pk", flat=True))
    # The scan wakes no worker for a kind with no connector here: nothing is deleted behind the agent's back.
    assert task.pk not in set(tasks_needing_work().filter(kind__in=["migrate_project"]).values_list("pk", flat=True))
    assert len(staging(store)) == 3


def test_a_dead_agent_s_temp_resources_are_deleted_by_a_server_worker_when_the_kind_has_a_connector_here(
    store: Simulator, clock: ControllableClock
) -> None:
    task = api_task_left(store)
    with kind_registered(API_KIND, connector=lambda: ObjectStoreConnector(store.url)):
        clock.advance(_lapse())
        assert Attention.TEMP_RESOURCE_LEFT not in reasons(task)  # a worker here will delete them
        assert task.pk in set(tasks_needing_work().filter(kind__in=known_kinds()).values_list("pk", flat=True))
        wake = run_task_once(task_id=task.pk, holder_id="worker", connector=connector_for(API_KIND))
    assert "cleanup: 3 deleted, 0 left" in wake.summary, wake.summary
    assert staging(store) == []
    assert find_problems(Task.objects.get(pk=task.pk)) == []


def _lapse() -> timedelta:
    """Long enough for the dead agent's lease to lapse: its ttl and grace."""
    lapse: timedelta = settings.RECKON_LEASE_TTL + settings.RECKON_LEASE_GRACE + timedelta(seconds=1)
    return lapse
