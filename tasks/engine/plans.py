"""Plans, the scheduler's side: a task made with its first plan, a model's proposal stored, a proposal accepted.
A model may propose; only the scheduler accepts (plan_accept). The plan document's schema and its validation:
tasks/core/plan.py; a person's re-plan: tasks/people/replan.py."""

from functools import partial
from typing import Any

from django.db import transaction

from audit.hygiene import check_payload, digest_of
from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.models import Lease
from tasks.core.budget import budget_after_accept, stated_budget
from tasks.core.errors import InvalidTransition, OperationsOpen, ProposalSuperseded, TaskNotFound
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, Actor, ChangeKind, NodeStatus, TaskStatus
from tasks.core.plan import NodeSpec, collect_input_refs, kept_keys, validate_plan
from tasks.decide.change import Change
from tasks.engine.cas import Audit, audited_compare_and_set, compare_and_set
from tasks.engine.events import append_event, carried_fields
from tasks.models import Node, Operation, PlanRevision, ProposalStatus, Task


def plan_nodes(specs: list[NodeSpec], plan_version: int, carried: dict[str, Node]) -> list[tuple[Node, dict[str, Any]]]:
    """Nodes of a newly accepted plan: new ones pending, the ones ``tasks.core.plan.kept_keys`` keeps of the previous
    plan's succeeded nodes (``carried``) with what they carry over (``tasks.engine.events.carried_fields``; a kept
    approval keeps what it approved, under the revision it was given under: the gated start refuses it as given
    under another plan, and a person approves again). The log derives the same nodes from the plan document."""
    kept = kept_keys(specs, {key: node.definition_digest for key, node in carried.items()})
    nodes: list[tuple[Node, dict[str, Any]]] = []
    for spec in specs:
        node = Node(
            plan_version=plan_version,
            key=spec.key,
            position=spec.position,
            action=spec.action,
            depends_on=spec.depends_on,
            input=spec.input,
            evidence=spec.evidence,
            on_failure=spec.on_failure,
            irreversible=spec.irreversible,
            compensation=spec.compensation,
            rerun=spec.rerun,
            definition_digest=spec.definition_digest,
            max_attempts=spec.max_attempts,
        )
        previous = carried.get(spec.key)
        fields = (
            carried_fields(partial(getattr, previous))
            if spec.key in kept and previous is not None
            else {"status": NodeStatus.PENDING.value, "output": {}, "attempts": 0}
        )
        nodes.append((node, fields))
    return nodes


def task_create(
    *,
    kind: str,
    title: str,
    plan: Any,
    created_by: str,
    project: str = "",
    attempt_budget: int | None = None,
) -> Task:
    """Create a task with its first plan, proposed by ``created_by`` and accepted by the scheduler.

    An invalid plan raises PlanInvalid; credential-like data in the task's own text (title, project, …)
    SecretInPayload. Either way nothing is written.
    """
    # The task row's own text, before it is written: its title and project reach no event or audit row.
    check_payload({"kind": kind, "title": title, "project": project, "created_by": created_by}, what="task")
    specs = validate_plan(plan)
    stated = stated_budget(plan, len(specs), requested=attempt_budget)
    budget = budget_after_accept(stated=stated, nodes=len(specs))
    with transaction.atomic():
        now = clock.now()
        task = Task.objects.create(
            kind=kind,
            title=title,
            project=project,
            attempt_budget=budget,
            created_by=created_by,
            created_at=now,
            updated_at=now,
        )
        revision = PlanRevision.objects.create(
            task=task, number=1, document=plan, digest=digest_of(plan), proposed_by=created_by, proposed_at=now
        )
        append_event(
            task=task,
            seq=1,
            type="task_created",
            payload={
                "task": {
                    "status": task.status,
                    "status_reason": "",
                    "status_detail": "",
                    "plan_version": 0,
                    "attempt_budget": budget,
                    "attempts_used": 0,
                    "inputs_recheck_required": False,
                    "cancel_requested_at": None,
                },
                "data": {"kind": kind, "plan_revision": 1, "plan_digest": revision.digest, "by": created_by},
            },
            at=now,
        )
        accept_revision(task, revision, specs, lease=None)
        task.refresh_from_db()
        return task


def plan_propose(*, task_id: int, plan: Any, proposed_by: str, expected_version: int, lease: Lease) -> PlanRevision:
    """Store a model's proposal. It changes nothing about what runs until plan_accept takes it."""
    return propose_revision(task_id, plan, proposed_by, expected_version, lease, audit=None)


def propose_revision(
    task_id: int, plan: Any, proposed_by: str, expected_version: int, lease: Lease, *, audit: Audit | None
) -> PlanRevision:
    validate_plan(plan)
    number = (
        PlanRevision.objects.filter(task_id=task_id).order_by("-number").values_list("number", flat=True).first()
    ) or 0
    created: list[PlanRevision] = []

    def store(task: Task, now: Any) -> None:
        created.append(
            PlanRevision.objects.create(
                task=task,
                number=number + 1,
                document=plan,
                digest=digest_of(plan),
                proposed_by=proposed_by,
                proposed_at=now,
            )
        )

    change = Change(
        event="plan_proposed",
        kind=ChangeKind.PROPOSE,
        data={"plan_revision": number + 1, "plan_digest": digest_of(plan), "by": proposed_by},
    )
    if audit is None:
        compare_and_set(task_id, expected_version, change, lease=lease, before_event=store)
    else:
        audited_compare_and_set(task_id, expected_version, change, lease=lease, audit=audit, before_event=store)
    return created[0]


def plan_accept(*, revision_id: int, expected_version: int, lease: Lease | None) -> Task:
    """The scheduler accepts a proposed plan: validates it again and makes it the task's plan.

    Only while nobody is advancing the old plan (pending, paused, human); no operation may be open.
    """
    revision = acceptable_revision(revision_id)
    specs = validate_plan(revision.document)
    with transaction.atomic():
        accept_revision(revision.task, revision, specs, lease=lease, expected_version=expected_version)
    return Task.objects.get(pk=revision.task_id)


def acceptable_revision(revision_id: int) -> PlanRevision:
    revision = PlanRevision.objects.select_related("task").filter(pk=revision_id).first()
    if revision is None:
        raise TaskNotFound(f"plan revision {revision_id} does not exist")
    if revision.status != ProposalStatus.PROPOSED:
        raise InvalidTransition(f"plan revision {revision.number} is already {revision.status}")
    newer = superseded_by(revision)
    if newer is not None:
        raise ProposalSuperseded(
            f"plan revision {revision.number} is superseded by plan revision {newer}: only the newest proposal may "
            "be accepted",
            revision=revision.number,
            superseded_by=newer,
        )
    return revision


def superseded_by(revision: PlanRevision) -> int | None:
    """Whether ``revision`` is superseded (the number of the revision that supersedes it) or may still be accepted
    (None), reading the task's newest revision. The accept's compare-and-set on the task version keeps the answer
    true until the write: proposing moves the version."""
    newest = (
        PlanRevision.objects.filter(task_id=revision.task_id)
        .order_by("-number")
        .values_list("number", flat=True)
        .first()
    )
    return superseding(revision.number, newest=newest or revision.number, plan_version=revision.task.plan_version)


def superseding(number: int, *, newest: int, plan_version: int) -> int | None:
    """THE rule of which proposal may be accepted: only the task's newest revision, and only while it is newer than
    the task's plan. A proposal ``number`` is superseded by a later proposal (``newest``, the task's highest revision
    number) or by the plan accepted since (``plan_version``): that number is returned, else None. Pages ask it too,
    so they offer to accept exactly what the service accepts."""
    if newest > number:
        return newest
    if plan_version >= number:
        return plan_version
    return None


def accept_revision(
    task: Task,
    revision: PlanRevision,
    specs: list[NodeSpec],
    *,
    lease: Lease | None,
    expected_version: int | None = None,
    accepted_by: Principal | None = None,
) -> None:
    carried = {
        n.key: n for n in Node.objects.filter(task=task, plan_version=task.plan_version, status=NodeStatus.SUCCEEDED)
    }
    new_status = TaskStatus.PENDING.value
    fields: dict[str, Any] = {"plan_version": revision.number, "input_refs": collect_input_refs(specs)}
    if task.status != new_status:
        fields.update(status=new_status, status_reason="", status_detail="")
    if accepted_by is not None:  # a person hands the task back: the agent re-reads the new plan's inputs first
        fields["inputs_recheck_required"] = bool(fields["input_refs"])
    if revision.number > 1:  # the first plan's budget is the task's own, set as it was created
        budget = budget_after_accept(
            stated=stated_budget(revision.document, len(specs)),
            nodes=len(specs),
            current=task.attempt_budget,
            previous_nodes=Node.objects.filter(task=task, plan_version=task.plan_version).count(),
            used=task.attempts_used,
        )
        if budget != task.attempt_budget:
            fields["attempt_budget"] = budget
    by = f"accepted by {accepted_by}" if accepted_by is not None else "accepted by the scheduler"

    def mark_accepted(_task: Task, now: Any) -> None:
        PlanRevision.objects.filter(pk=revision.pk, status=ProposalStatus.PROPOSED).update(
            status=ProposalStatus.ACCEPTED, decided_at=now, decision_reason=by
        )

    before = expected_version if expected_version is not None else task.version
    # Operations change only with the task version, which the compare-and-set checks: this read holds at ``before``.
    if Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES]).exists():
        raise OperationsOpen("an operation is dispatched, accepted or unknown: reconcile it by op key first")
    applied = compare_and_set(
        task.pk,
        before,
        Change(
            event="plan_accepted",
            task=fields,
            nodes=plan_nodes(specs, revision.number, carried),
            data={"plan_revision": revision.number, "plan_digest": revision.digest, "nodes": len(specs)},
            kind=ChangeKind.ACCEPT,
            derived=True,  # the nodes and input refs derive from the document the digest names: the event lists none
        ),
        lease=lease,
        actor=None if lease is not None else Actor.SYSTEM,
        before_event=mark_accepted,
    )
    if revision.number > 1:
        audit_append(
            actor=accepted_by or Principal.system("scheduler"),
            action="plan_accepted_after_replan",
            at=applied.at,
            task_id=task.pk,
            version_before=before,
            version_after=applied.version,
            details={
                "plan_revision": revision.number,
                "plan_digest": revision.digest,
                "proposed_by": revision.proposed_by,
            },
        )
