"""Plans: validation, proposal, acceptance. A model may propose; only the scheduler (plan_accept) accepts.

A plan document::

    {"nodes": [{"key": "copy-1", "action": "store.copy_batch", "depends_on": ["prepare"],
                "input": {"source": {"ref": {"source": "store", "locator": "proj/a", "version": "7", "digest": "…"}},
                          "target": {"from": "prepare", "field": "remote_id"}, "limit": 100},
                "evidence": {"remote_id": true, "count": 100, "digest": {"input": "source", "field": "digest"},
                             "remote_version": {"input": "source", "field": "version"}},
                "on_failure": {"invalid_params": "fail_task"}, "irreversible": false, "compensation": "",
                "rerun": "idempotent by op key", "max_attempts": 3}]}

Input values are literals, versioned references to external snapshots (``ref``: version required), or an
earlier node's structured output (``from`` an ancestor, ``field`` of its receipt) resolved by the
scheduler — never re-extracted from text. A node's input is capped (``NODE_INPUT_CAP_BYTES``): a reference,
not the content.

Every node states its evidence spec, ``"remote_id": true`` at least — approval nodes too: an approval's
receipt is the person's approval record (submitted with ``takeover_submit``), its remote id names that
record, and the spec may also pin what was approved (e.g. the source's version). ``on_failure`` may be left
out: the accepted node stores, for every failure class, the destination that applies — the node's own choice
or the default of ``tasks/failures.py``.
"""

import copy
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.models import HolderKind, Lease
from leases.services import lease_open, lease_release
from tasks.actions import get_action
from tasks.cas import Audit, Change, audited_compare_and_set, compare_and_set
from tasks.errors import InvalidTransition, OperationsOpen, PlanInvalid, TaskError, TaskNotFound, VersionConflict
from tasks.events import append_event
from tasks.failures import ALLOWED_DESTINATIONS, resolved_destinations
from tasks.hygiene import NODE_INPUT_CAP_BYTES, PLAN_CAP_BYTES, canonical_json, check_payload
from tasks.lifecycle import (
    OPEN_OPERATION_STATUSES,
    Actor,
    ChangeKind,
    FailureClass,
    NodeStatus,
    TaskStatus,
)
from tasks.models import Event, Node, Operation, PlanRevision, ProposalStatus, Task
from tasks.permissions import PermissionDenied, require_operate
from tasks.receipts import RECEIPT_FIELDS

KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")
# Bounded so that the plan_accepted event (one entry per node) stays under the event payload cap.
MAX_NODES = 100
OUTPUT_FIELDS = RECEIPT_FIELDS
REF_FIELDS = ("source", "locator", "version", "digest")
EVIDENCE_KEYS = ("remote_id", "count", "digest", "remote_version")
NODE_KEYS = {
    "key",
    "action",
    "depends_on",
    "input",
    "evidence",
    "on_failure",
    "irreversible",
    "compensation",
    "rerun",
    "max_attempts",
}


@dataclass(frozen=True)
class NodeSpec:
    key: str
    position: int
    action: str
    depends_on: list[str]
    input: dict[str, Any]
    evidence: dict[str, Any]
    on_failure: dict[str, str]
    irreversible: bool
    compensation: str
    rerun: str
    max_attempts: int

    @property
    def definition_digest(self) -> str:
        body = canonical_json({k: v for k, v in self.__dict__.items() if k != "position"})
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def digest_of(value: Any, *, canonical: str | None = None) -> str:
    """``sha256:`` and the hex digest of the value's canonical JSON (``canonical``: that text, when the caller
    made it already)."""
    text = canonical if canonical is not None else canonical_json(value)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def validate_plan(document: Any) -> list[NodeSpec]:
    """Return the nodes in a dependency order, or raise PlanInvalid listing every problem found."""
    problems: list[str] = []
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list) or not document["nodes"]:
        raise PlanInvalid(["a plan is an object with a non-empty list 'nodes'"])
    raw_nodes: list[Any] = document["nodes"]
    if len(raw_nodes) > MAX_NODES:
        raise PlanInvalid([f"a plan has at most {MAX_NODES} nodes, this one has {len(raw_nodes)}"])
    by_key: dict[str, dict[str, Any]] = {}
    for index, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            problems.append(f"node #{index} is not an object")
            continue
        key = raw.get("key")
        if not isinstance(key, str) or not KEY_PATTERN.match(key):
            problems.append(f"node #{index}: key {key!r} must match {KEY_PATTERN.pattern}")
            continue
        if key in by_key:
            problems.append(f"node {key}: duplicate key")
            continue
        unknown = set(raw) - NODE_KEYS
        if unknown:
            problems.append(f"node {key}: unknown fields {sorted(unknown)}")
        by_key[key] = raw
    if problems:
        raise PlanInvalid(problems)

    for key, raw in by_key.items():
        problems.extend(_node_shape_problems(key, raw, by_key))
    if problems:
        raise PlanInvalid(problems)

    order = _topological_order(by_key)
    if order is None:
        raise PlanInvalid(["the plan has a cycle in depends_on"])
    ancestors = _ancestors(by_key, order)
    for key, raw in by_key.items():
        problems.extend(_input_problems(key, raw.get("input", {}), ancestors[key]))
        problems.extend(_evidence_problems(key, raw.get("evidence", {}), raw.get("input", {})))
        action = get_action(raw["action"])
        if action is not None and action.kind == "approval" and raw.get("irreversible"):
            problems.append(f"node {key}: an approval node has no side effect to be irreversible")
        if raw.get("irreversible") and not raw.get("compensation"):
            confirmed = any((a := get_action(by_key[k]["action"])) and a.kind == "approval" for k in ancestors[key])
            if not confirmed:
                problems.append(
                    f"node {key}: irreversible without a compensation needs an approval node before it (in depends_on)"
                )
    if problems:
        raise PlanInvalid(problems)
    try:
        check_payload(document, what="plan document", cap=PLAN_CAP_BYTES)
    except Exception as exc:
        raise PlanInvalid([str(exc)]) from exc
    default_attempts: int = settings.RECKON_DEFAULT_NODE_ATTEMPTS
    return [
        NodeSpec(
            key=key,
            position=position,
            action=by_key[key]["action"],
            depends_on=list(by_key[key].get("depends_on", [])),
            input=dict(by_key[key].get("input", {})),
            evidence=dict(by_key[key].get("evidence", {})),
            on_failure=resolved_destinations(by_key[key].get("on_failure", {})),
            irreversible=bool(by_key[key].get("irreversible", False)),
            compensation=by_key[key].get("compensation") or "",
            rerun=by_key[key].get("rerun") or "",
            max_attempts=int(by_key[key].get("max_attempts", default_attempts)),
        )
        for position, key in enumerate(order)
    ]


def _node_shape_problems(key: str, raw: dict[str, Any], by_key: dict[str, Any]) -> list[str]:
    problems = []
    action = raw.get("action")
    if not isinstance(action, str) or get_action(action) is None:
        problems.append(f"node {key}: unknown action {action!r}")
    depends_on = raw.get("depends_on", [])
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        problems.append(f"node {key}: depends_on must be a list of node keys")
    else:
        for dep in depends_on:
            if dep == key:
                problems.append(f"node {key}: depends on itself")
            elif dep not in by_key:
                problems.append(f"node {key}: depends on unknown node {dep!r}")
    inputs = raw.get("input", {})
    if not isinstance(inputs, dict):
        problems.append(f"node {key}: input must be an object")
    elif (size := len(canonical_json(inputs).encode())) > NODE_INPUT_CAP_BYTES:
        problems.append(
            f"node {key}: input is {size} bytes, over the {NODE_INPUT_CAP_BYTES}-byte node input cap: "
            "give a versioned ref (or an earlier node's output), not the content"
        )
    if "evidence" not in raw:
        problems.append(f'node {key}: no evidence spec: say what its receipt must show, at least {{"remote_id": true}}')
    elif not isinstance(raw["evidence"], dict):
        problems.append(f"node {key}: evidence must be an object")
    on_failure = raw.get("on_failure", {})
    if not isinstance(on_failure, dict):
        problems.append(f"node {key}: on_failure must be an object")
    else:
        for cls, dest in on_failure.items():
            if cls not in FailureClass.__members__.values():
                problems.append(f"node {key}: on_failure names unknown failure class {cls!r}")
            elif not isinstance(dest, str) or dest not in ALLOWED_DESTINATIONS[FailureClass(cls)]:
                allowed = ALLOWED_DESTINATIONS[FailureClass(cls)]
                problems.append(f"node {key}: on_failure {cls} → {dest!r} not allowed (allowed: {', '.join(allowed)})")
    if not isinstance(raw.get("irreversible", False), bool):
        problems.append(f"node {key}: irreversible must be true or false")
    compensation = raw.get("compensation") or ""
    if compensation:
        compensating = get_action(compensation) if isinstance(compensation, str) else None
        if compensating is None:
            problems.append(f"node {key}: compensation names unknown action {compensation!r}")
        elif compensating.kind != "effect":
            problems.append(f"node {key}: compensation {compensation!r} has no side effect: it cannot undo anything")
    max_attempts = raw.get("max_attempts", 1)
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= 100:
        problems.append(f"node {key}: max_attempts must be an integer from 1 to 100")
    if not isinstance(raw.get("rerun", ""), str):
        problems.append(f"node {key}: rerun must be a sentence saying what running it again does")
    return problems


def _topological_order(by_key: dict[str, dict[str, Any]]) -> list[str] | None:
    """Kahn's algorithm, stable in document order; None when there is a cycle."""
    remaining = {key: set(raw.get("depends_on", [])) for key, raw in by_key.items()}
    order: list[str] = []
    while remaining:
        ready = [key for key, deps in remaining.items() if not deps]
        if not ready:
            return None
        for key in ready:
            order.append(key)
            del remaining[key]
        for deps in remaining.values():
            deps.difference_update(ready)
    return order


def _ancestors(by_key: dict[str, dict[str, Any]], order: list[str]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for key in order:
        found: set[str] = set()
        for dep in by_key[key].get("depends_on", []):
            found |= {dep} | result[dep]
        result[key] = found
    return result


def _input_problems(key: str, inputs: dict[str, Any], ancestors: set[str]) -> list[str]:
    problems = []
    for name, value in inputs.items():
        if isinstance(value, dict) and "ref" in value:
            ref = value["ref"]
            if not isinstance(ref, dict) or set(ref) - set(REF_FIELDS):
                problems.append(f"node {key}: input {name}: ref has fields {', '.join(REF_FIELDS)} only")
                continue
            for required in ("source", "locator", "version"):
                if not isinstance(ref.get(required), str) or not ref.get(required):
                    problems.append(f"node {key}: input {name}: ref needs a non-empty {required} (refs carry versions)")
        elif isinstance(value, dict) and "from" in value:
            source, field_name = value.get("from"), value.get("field")
            if not isinstance(source, str) or source not in ancestors:
                problems.append(f"node {key}: input {name} reads from {source!r}, which is not a node it depends on")
            if not isinstance(field_name, str) or field_name not in OUTPUT_FIELDS:
                problems.append(f"node {key}: input {name}: field must be one of {', '.join(OUTPUT_FIELDS)}")
    return problems


def _evidence_problems(key: str, evidence: dict[str, Any], inputs: dict[str, Any]) -> list[str]:
    problems = []
    if "remote_id" not in evidence:
        problems.append(f'node {key}: evidence remote_id is always required: write "remote_id": true')
    for name, expected in evidence.items():
        if name not in EVIDENCE_KEYS:
            problems.append(f"node {key}: evidence {name!r} unknown (known: {', '.join(EVIDENCE_KEYS)})")
        elif name == "remote_id":
            if expected is not True:
                problems.append(f'node {key}: evidence remote_id is always required: write "remote_id": true')
        elif isinstance(expected, dict):
            source = expected.get("input")
            if not isinstance(source, str) or source not in inputs:
                problems.append(f"node {key}: evidence {name} reads unknown input {source!r}")
            elif isinstance(inputs[source], dict) and "ref" in inputs[source]:
                if not isinstance(expected.get("field"), str) or expected.get("field") not in REF_FIELDS:
                    problems.append(f"node {key}: evidence {name} from ref {source} needs field in {REF_FIELDS}")
            elif set(expected) - {"input"}:
                problems.append(f"node {key}: evidence {name} from a non-ref input takes no field")
        elif name == "count" and (not isinstance(expected, int) or isinstance(expected, bool) or expected < 0):
            problems.append(f"node {key}: evidence count must be a non-negative integer")
        elif name in ("digest", "remote_version") and (not isinstance(expected, str) or not expected):
            problems.append(f"node {key}: evidence {name} must be a non-empty string or an input reference")
    return problems


def collect_input_refs(specs: list[NodeSpec]) -> dict[str, dict[str, str]]:
    refs: dict[str, dict[str, str]] = {}
    for spec in specs:
        for name, value in spec.input.items():
            if isinstance(value, dict) and "ref" in value:
                refs[f"{spec.key}.{name}"] = dict(value["ref"])
    return refs


def _new_nodes(specs: list[NodeSpec], plan_version: int, carried: dict[str, Node]) -> list[tuple[Node, dict[str, Any]]]:
    """Nodes of a newly accepted plan. A succeeded node of the previous plan with the same definition,
    whose dependencies are all kept too, carries its status and output over: its side effect happened
    and is not redone. A node downstream of a redone one is redone: its receipt proved the old inputs."""
    nodes: list[tuple[Node, dict[str, Any]]] = []
    kept: set[str] = set()
    for spec in specs:  # dependency order: a node is kept only if everything it depends on is kept
        previous = carried.get(spec.key)
        done = (
            previous is not None
            and previous.definition_digest == spec.definition_digest
            and all(dep in kept for dep in spec.depends_on)
        )
        if done:
            kept.add(spec.key)
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
        fields = {
            "status": NodeStatus.SUCCEEDED.value if done and previous else NodeStatus.PENDING.value,
            "output": previous.output if done and previous else {},
            "attempts": previous.attempts if done and previous else 0,
        }
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
    check_payload({"kind": kind, "title": title, "project": project, "created_by": created_by}, what="task")
    specs = validate_plan(plan)
    budget = attempt_budget if attempt_budget is not None else settings.RECKON_DEFAULT_TASK_ATTEMPTS
    if budget < 1:
        raise PlanInvalid(["attempt_budget must be at least 1"])
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
        _accept(task, revision, specs, lease=None)
        task.refresh_from_db()
        return task


def plan_propose(*, task_id: int, plan: Any, proposed_by: str, expected_version: int, lease: Lease) -> PlanRevision:
    """Store a model's proposal. It changes nothing about what runs until plan_accept takes it."""
    return _propose(task_id, plan, proposed_by, expected_version, lease, audit=None)


def _propose(
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
    revision = _acceptable(revision_id)
    specs = validate_plan(revision.document)
    with transaction.atomic():
        _accept(revision.task, revision, specs, lease=lease, expected_version=expected_version)
    return Task.objects.get(pk=revision.task_id)


def _acceptable(revision_id: int) -> PlanRevision:
    revision = PlanRevision.objects.select_related("task").filter(pk=revision_id).first()
    if revision is None:
        raise TaskNotFound(f"plan revision {revision_id} does not exist")
    if revision.status != ProposalStatus.PROPOSED:
        raise InvalidTransition(f"plan revision {revision.number} is already {revision.status}")
    if revision.number <= revision.task.plan_version:
        raise InvalidTransition(
            f"plan revision {revision.number} is older than the task's plan {revision.task.plan_version}: propose again"
        )
    return revision


# --- re-plan by a person ----------------------------------------------------------------------------------------
# A person re-plans while holding the task's takeover lease: the permit table lets the operator propose and accept
# only in ``human``, so a person's plan never races the agent's. The agent's path (plan_propose, plan_accept with
# its lease) is unchanged; a person's path is its own, with the person's identity, permission check and audit.


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
    from tasks.takeover import stale_form  # takeover builds on plans (digest_of): the import goes this way at run time

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
    check_payload({"reason": reason}, what="re-plan reason")
    if len(reason.strip()) < 10:
        raise InvalidTransition("a re-plan needs the reason (at least 10 characters)")
    if task.version != expected_version:
        raise _stale(task_id, expected_version)
    audit = Audit(actor, "plan_proposed", reason=reason, details={"plan_digest": digest_of(plan)})
    try:
        return _propose(task_id, plan, str(actor), expected_version, lease, audit=audit)
    except VersionConflict:
        raise _stale(task_id, expected_version) from None


def plan_accept_by_person(*, actor: Principal, revision_id: int, expected_version: int) -> Task:
    """A person holding the takeover accepts a proposed plan and hands the task back in the same transaction: the
    plan becomes the task's, the task goes ``pending`` with its inputs to be re-read before anything new (when it
    has any), the takeover lease is released, and the agent is woken once this is committed. Succeeded nodes with
    an unchanged definition and upstream keep their receipts. Audited with the person's name."""
    revision = _acceptable(revision_id)
    task = revision.task
    lease = _person_lease(actor, task)
    if task.version != expected_version:
        raise _stale(task.pk, expected_version)
    specs = validate_plan(revision.document)
    try:
        with transaction.atomic():
            _accept(task, revision, specs, lease=lease, expected_version=expected_version, accepted_by=actor)
            lease_release(lease=lease)
            wake_agent_on_commit(task.pk)
    except VersionConflict:
        raise _stale(task.pk, expected_version) from None
    return Task.objects.get(pk=task.pk)


def wake_agent_on_commit(task_id: int) -> None:
    """The agent's wake-up, sent once a person's hand-back is committed (never from inside the transaction: a worker
    that woke first would find the person's lease still open). A lost message costs latency only: the recovery
    scan finds the task from the database. ``robust``: a broker that is down does not undo a committed decision."""
    from tasks.jobs import drive_task  # Celery entry points sit above the services they call

    transaction.on_commit(lambda: drive_task.delay(task_id), robust=True)


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
        Event.objects.filter(task=task, type="plan_accepted").order_by("-seq").values_list("seq", flat=True).first()
    )
    rechecks = Event.objects.filter(task=task, type="inputs_confirmed", seq__gt=accepted or 0).order_by("-seq")
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


def _accept(
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
            nodes=_new_nodes(specs, revision.number, carried),
            data={"plan_revision": revision.number, "plan_digest": revision.digest, "nodes": len(specs)},
            kind=ChangeKind.ACCEPT,
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
    new = _new_nodes(specs, task.plan_version + 1, carried)
    kept = [node.key for node, fields in new if fields["status"] == NodeStatus.SUCCEEDED.value]
    redone = [node.key for node, fields in new if fields["status"] != NodeStatus.SUCCEEDED.value]
    dropped = sorted(set(current) - {spec.key for spec in specs})
    return PlanEffect(kept=kept, redone=redone, dropped=dropped)
