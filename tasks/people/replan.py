"""A person's re-plan. A person re-plans while holding the task's takeover lease: the permit table lets the
operator propose and accept only in ``human``, so a person's plan never races the agent's. The agent's path
(tasks/engine/plans.py: plan_propose, plan_accept with its lease) is its own; a person's path is this one, with the
person's identity, permission check and audit; the draft and the effect a reviewer sees before accepting."""

import copy
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from audit.hygiene import digest_of
from audit.principals import Principal
from audit.reasons import MIN_REASON
from leases.models import HolderKind, Lease
from leases.services import lease_open, lease_release
from tasks.access.permissions import PermissionDenied, require_operate
from tasks.core.errors import InvalidTransition, TaskError, TaskNotFound, VersionConflict
from tasks.core.lifecycle import NodeStatus
from tasks.core.plan import validate_plan
from tasks.engine.cas import Audit
from tasks.engine.enqueue import wake_agent_on_commit
from tasks.engine.plans import accept_revision, acceptable_revision, plan_nodes, propose_revision
from tasks.models import LoggedEvent, Node, PlanRevision, Task
from tasks.people.checks import stale_form


def _person_lease(actor: Principal, task: Task) -> Lease:
    require_operate(actor, task)
    lease = lease_open(task.pk)
    if lease is None or lease.holder_kind != HolderKind.OPERATOR or lease.holder_id != actor.id:
        holder = f"{lease.holder_kind}:{lease.holder_id}" if lease else "nobody"
        raise PermissionDenied(
            f"{actor} does not hold task {task.pk}'s takeover lease (held by {holder}): take the task over first",
            needs="takeover_lease",
        )
    return lease


def _stale(task_id: int, expected_version: int) -> TaskError:
    return stale_form(Task.objects.get(pk=task_id), expected_version)


def plan_propose_by_person(
    *, actor: Principal, task_id: int, plan: Any, expected_version: int, reason: str
) -> PlanRevision:
    """A person holding the takeover proposes a plan, as themselves: audited, on the version they saw. It changes
    nothing that runs until they (or the scheduler) accept it."""
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist")
    lease = _person_lease(actor, task)
    if len(reason.strip()) < MIN_REASON:
        raise InvalidTransition(f"a re-plan needs the reason (at least {MIN_REASON} characters)")
    if task.version != expected_version:
        raise _stale(task_id, expected_version)
    audit = Audit(actor, "plan_proposed", reason=reason, details={"plan_digest": digest_of(plan)})
    try:
        return propose_revision(task_id, plan, str(actor), expected_version, lease, audit=audit)
    except VersionConflict:
        raise _stale(task_id, expected_version) from None


def plan_accept_by_person(*, actor: Principal, revision_id: int, expected_version: int) -> Task:
    """A person holding the takeover accepts a proposed plan and hands the task back in the same transaction: the
    plan becomes the task's, the task goes ``pending`` with its inputs to be re-read before anything new (when it
    has any), the takeover lease is released, and the agent is woken once this is committed. Succeeded nodes with
    an unchanged definition and upstream keep their receipts. Audited with the person's name."""
    revision = acceptable_revision(revision_id)
    task = revision.task
    lease = _person_lease(actor, task)
    if task.version != expected_version:
        raise _stale(task.pk, expected_version)
    specs = validate_plan(revision.document)
    try:
        with transaction.atomic():
            accept_revision(task, revision, specs, lease=lease, expected_version=expected_version, accepted_by=actor)
            lease_release(lease=lease)
            wake_agent_on_commit(task.pk)
    except VersionConflict:
        raise _stale(task.pk, expected_version) from None
    return Task.objects.get(pk=task.pk)


@dataclass(frozen=True)
class ReplanDraft:
    """A plan to start a person's re-plan from: the task's current plan, with every input whose source changed
    set to the version found, so the unchanged part is kept as it is (its succeeded nodes keep their receipts)."""

    document: dict[str, Any]
    kept: list[str]  # nodes whose definition and upstream are unchanged
    redone: list[str]  # nodes that read a changed input, and every node downstream of one
    notes: list[str]  # what the person must still check


def replan_draft(task_id: int) -> ReplanDraft:
    """The current plan, updated for the input changes the last recheck found (after a pause ``input_changed``):
    the unchanged part is kept as it is."""
    task = Task.objects.get(pk=task_id)
    revision = PlanRevision.objects.filter(task=task, number=task.plan_version).first()
    document: dict[str, Any] = copy.deepcopy(revision.document) if revision else {"nodes": []}
    changed = _inputs_changed_since_plan(task)
    notes: list[str] = []
    touched: set[str] = set()
    by_key = {raw.get("key"): raw for raw in document.get("nodes", []) if isinstance(raw, dict)}
    for name, versions in sorted(changed.items()):
        key, _dot, input_name = name.partition(".")
        value = by_key.get(key, {}).get("input", {}).get(input_name)
        if not (isinstance(value, dict) and isinstance(value.get("ref"), dict) and isinstance(versions, dict)):
            continue
        value["ref"]["version"] = str(versions.get("now"))
        touched.add(key)
        notes.append(f"{name}: version {versions.get('planned')} → {versions.get('now')}")
        if value["ref"].get("digest"):
            notes.append(f"{name}: its digest is still the one of version {versions.get('planned')}: correct it")
    redone = _downstream(by_key, touched)
    kept = [k for k in by_key if isinstance(k, str) and k not in redone]
    return ReplanDraft(document=document, kept=kept, redone=sorted(redone), notes=notes)


def _inputs_changed_since_plan(task: Task) -> dict[str, Any]:
    """The input changes the last recheck found since the current plan was accepted (the task paused
    ``input_changed``, and may since have been taken over by a person): input name → {planned, now}."""
    accepted = (
        LoggedEvent.objects.filter(task=task, type="plan_accepted")
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    rechecks = LoggedEvent.objects.filter(task=task, type="inputs_confirmed", seq__gt=accepted or 0).order_by("-seq")
    for payload in rechecks.values_list("payload", flat=True).iterator():
        found = payload.get("data", {}).get("changed", {}) if isinstance(payload, dict) else {}
        if isinstance(found, dict) and found:
            return found
    return {}


def _downstream(by_key: dict[Any, dict[str, Any]], roots: set[str]) -> set[str]:
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for key, raw in by_key.items():
            if key not in found and set(raw.get("depends_on", [])) & found:
                found.add(key)
                grew = True
    return found


@dataclass(frozen=True)
class PlanEffect:
    """What accepting a plan would do to the task's nodes, computed without writing (the re-plan's review)."""

    kept: list[str]  # succeeded nodes whose definition and upstream are unchanged: their receipts stay
    redone: list[str]  # nodes that run (again) under the new plan
    dropped: list[str]  # nodes of the current plan the new one does not have


def plan_effect(task_id: int, document: Any) -> PlanEffect:
    """Validate ``document`` and say which of the task's nodes it keeps, redoes and drops (PlanInvalid if invalid)."""
    specs = validate_plan(document)
    task = Task.objects.get(pk=task_id)
    current = {n.key: n for n in Node.objects.filter(task=task, plan_version=task.plan_version)}
    carried = {k: n for k, n in current.items() if n.status == NodeStatus.SUCCEEDED}
    new = plan_nodes(specs, task.plan_version + 1, carried)
    kept = [node.key for node, fields in new if fields["status"] == NodeStatus.SUCCEEDED.value]
    redone = [node.key for node, fields in new if fields["status"] != NodeStatus.SUCCEEDED.value]
    dropped = sorted(set(current) - {spec.key for spec in specs})
    return PlanEffect(kept=kept, redone=redone, dropped=dropped)
