from datetime import timedelta

import pytest

from audit.models import AuditEvent
from audit.services import verify_audit
from leases.services import lease_release
from tasks.access.permissions import permission_grant
from tasks.core.lifecycle import TaskStatus
from tasks.core.outcomes import Committed
from tasks.engine.protocol import inputs_confirm, next_directive, operation_start, snapshot_at
from tasks.models import Task
from tasks.people.forced_release import forced_release_review, lease_force_release
from tasks.people.takeover import (
    NodeResult,
    takeover_claim,
    takeover_submit,
)
from tests.conftest import chain_plan, person


@pytest.mark.django_db
def test_a_takeover_round_trip(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a", "b"))
    admin = person("root", "admin")
    ann = person("ann", "operator")
    permission_grant(actor=admin, user=ann.user, task=task)
    lease = agent_lease(task)
    d = next_directive(task_id=task.pk, lease=lease)
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), "a", lease=lease
    ).operation
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert not claim.granted and claim.waiting_for == "agent:agent-1"
    assert next_directive(task_id=task.pk, lease=lease).kind == "reconcile"  # in-flight work may settle
    lease_release(lease=lease)
    claim = takeover_claim(actor=ann, task_id=task.pk)
    assert claim.granted and claim.lease is not None
    t = Task.objects.get(pk=task.pk)
    assert t.status == TaskStatus.HUMAN
    from tasks.people.settlement import operation_settle_by_hand

    operation_settle_by_hand(
        actor=ann,
        task_id=task.pk,
        op_key=op.op_key,
        expected_version=t.version,
        resolution="done",
        receipt=Committed(remote_id="r-a"),
        note="seen in the remote's console",
    )
    t = Task.objects.get(pk=task.pk)
    takeover_submit(
        actor=ann,
        lease=claim.lease,
        based_on_version=t.version,
        decision="end_task",
        end_status="completed",
        results=[NodeResult(node_key="b", remote_id="r-b")],
        note="did b by hand",
    )
    t = Task.objects.get(pk=task.pk)
    assert t.status == TaskStatus.COMPLETED
    assert verify_audit().problem is None
    actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert actions == [
        "permission_granted",
        "takeover_requested",
        "takeover_granted",
        "operation_resolved_by_person",
        "takeover_result_submitted",
    ], actions
    from tasks.engine.verification import find_problems

    assert find_problems(t) == []


@pytest.mark.django_db
def test_forced_release_and_review(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    root, other = person("root", "admin"), person("other", "admin")
    lease = agent_lease(task)
    forced = lease_force_release(
        actor=root,
        task_id=task.pk,
        justification="agent worker-7 is wedged for an hour",
        impact="its in-flight copy will be reconciled by op key",
    )
    from leases.errors import LeaseLost
    from tasks.decide.change import Change
    from tasks.engine.cas import compare_and_set

    with pytest.raises(LeaseLost):
        compare_and_set(task.pk, Task.objects.get(pk=task.pk).version, Change(event="x"), lease=lease)
    reviewed = forced_release_review(
        actor=other, forced_release_id=forced.pk, verdict="accepted", note="agreed, the worker was stuck"
    )
    assert reviewed.status == "accepted"
    assert verify_audit().problem is None


@pytest.mark.django_db
def test_resume_agent_makes_the_agent_recheck_inputs(make_task, agent_lease, clock) -> None:
    plan = chain_plan("a", input={"src": {"ref": {"source": "store", "locator": "p/x", "version": "7"}}})
    task = make_task(plan)
    admin = person("root", "admin")
    claim = takeover_claim(actor=admin, task_id=task.pk)
    assert claim.lease is not None
    t = Task.objects.get(pk=task.pk)
    takeover_submit(actor=admin, lease=claim.lease, based_on_version=t.version, decision="resume_agent", note="go on")
    clock.advance(timedelta(seconds=1))
    lease = agent_lease(task)
    d = next_directive(task_id=task.pk, lease=lease)
    assert (d.kind, d.reason) == ("reconcile", "recheck_inputs")
    inputs_confirm(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=d.task_version), {"a.src": "8"}, lease=lease
    )
    t = Task.objects.get(pk=task.pk)
    assert (t.status, t.status_reason) == (TaskStatus.PAUSED, "input_changed")


@pytest.mark.django_db
def test_attachments_are_stored_by_digest_and_recorded(make_task, clock, settings, tmp_path) -> None:
    import hashlib

    from tasks.models import Attachment
    from tasks.people.attachments import AttachmentIn, read_attachment

    settings.DATA_DIR = tmp_path
    task = make_task(chain_plan("a"))
    admin = person("root", "admin")
    claim = takeover_claim(actor=admin, task_id=task.pk)
    assert claim.lease is not None
    content = b"screenshot of the bucket listing"
    takeover_submit(
        actor=admin,
        lease=claim.lease,
        based_on_version=Task.objects.get(pk=task.pk).version,
        decision="end_task",
        end_status="completed",
        results=[NodeResult(node_key="a", remote_id="r-a", attachments=[AttachmentIn("listing.png", content)])],
    )
    row = Attachment.objects.get(task=task)
    assert row.sha256 == hashlib.sha256(content).hexdigest() and row.size == len(content)
    assert read_attachment(row.sha256) == content
    assert AuditEvent.objects.get(action="takeover_result_submitted").details["attachments"][0]["sha256"] == row.sha256
