"""Verify what a task's record claims (invariants 7 and 8); a problem quarantines the task.

Checked: the event log (contiguous seq, hash chain) rebuilds the stored projection; every node's
definition is the one of the accepted plan revision whose digest the log carries; every receipt is
the one the log recorded; the facts a call is made from (an operation's request, target and purpose, the task's
input refs, every temp resource's locator and node, none missing) are the ones the log recorded; the task row's head
is the log's last digest; the log still reaches the head a signed checkpoint outside the database anchored (a tail
cut with the row rolled back consistently is found: tasks/engine/anchors.py); no stored payload carries credential-like
data. One task's problem never stops the others from being checked, not even a record that breaks the checker. The
log's append-only triggers are checked too.
"""

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from audit.append_only import Triggers, missing_triggers
from audit.hygiene import digest_of, scan_payload
from audit.principals import Principal
from audit.services import MAX_TEXT, audit_append
from leases import clock
from tasks.core.errors import PlanInvalid, StoredFactAltered, VersionConflict
from tasks.core.lifecycle import Actor, ChangeKind, TaskStatus
from tasks.core.outcomes import RECEIPT_FIELDS
from tasks.core.plan import NodeSpec, collect_input_refs, validate_plan
from tasks.decide.approval_binding import BINDING_FIELDS
from tasks.decide.change import Change
from tasks.engine.anchors import find_anchor_problem
from tasks.engine.cas import compare_and_set
from tasks.engine.events import PLAN_ACCEPTED, find_log_problem, jsonable, task_plans
from tasks.models import LoggedEvent, Node, Operation, PlanRevision, ProposalStatus, Receipt, Task, TempResource


@dataclass(frozen=True)
class Verdict:
    task_id: int
    problem: str | None
    quarantined_now: bool = False


def find_secrets(task: Task) -> list[str]:
    found = []
    for event in LoggedEvent.objects.filter(task=task).only("seq", "payload"):
        found += [f"event {event.seq} {path}" for path in scan_payload(event.payload)]
    for receipt in Receipt.objects.filter(operation__task=task).only("pk", "data"):
        found += [f"receipt {receipt.pk} {path}" for path in scan_payload(receipt.data)]
    for node in Node.objects.filter(task=task).only("key", "output", "input"):
        found += [f"node {node.key} {path}" for path in scan_payload({"input": node.input, "output": node.output})]
    for revision in PlanRevision.objects.filter(task=task).only("number", "document"):
        found += [f"plan revision {revision.number} {path}" for path in scan_payload(revision.document)]
    return found


def _definition_problems(task: Task) -> list[str]:
    logged = {
        e.payload.get("data", {}).get("plan_revision"): e.payload.get("data", {}).get("plan_digest")
        for e in LoggedEvent.objects.filter(task=task, type="plan_accepted").only("payload")
    }
    problems = []
    for revision in PlanRevision.objects.filter(task=task, status=ProposalStatus.ACCEPTED):
        if digest_of(revision.document) != revision.digest or logged.get(revision.number) != revision.digest:
            problems.append(f"plan revision {revision.number} is not the one the log accepted")
            continue
        try:
            specs = {spec.key: spec for spec in validate_plan(revision.document)}
        except PlanInvalid as exc:
            problems.append(f"plan revision {revision.number} no longer validates: {exc}")
            continue
        for node in Node.objects.filter(task=task, plan_version=revision.number):
            spec = specs.get(node.key)
            if spec is None or _spec_of(node).definition_digest != spec.definition_digest:
                problems.append(f"node {node.key} of plan {revision.number} differs from its accepted definition")
    return problems


def _spec_of(node: Node) -> NodeSpec:
    return NodeSpec(
        key=node.key,
        position=node.position,
        action=node.action,
        depends_on=node.depends_on,
        input=node.input,
        evidence=node.evidence,
        on_failure=node.on_failure,
        irreversible=node.irreversible,
        compensation=node.compensation,
        rerun=node.rerun,
        max_attempts=node.max_attempts,
    )


def _receipt_problems(task: Task) -> list[str]:
    logged: dict[str, Any] = {}
    kinds = [
        "node_succeeded",
        "evidence_insufficient",
        "takeover_result_submitted",
        "node_approved",
        "compensation_committed",
        "cleanup_committed",
    ]
    for event in LoggedEvent.objects.filter(task=task, type__in=kinds):
        data = event.payload.get("data", {})
        if "receipt" in data:
            logged[data["op_key"]] = data["receipt"]
        logged.update(data.get("receipts", {}))
    problems = []
    for receipt in Receipt.objects.filter(operation__task=task).select_related("operation"):
        fields = {name: getattr(receipt, name) for name in RECEIPT_FIELDS}
        if logged.get(receipt.operation.op_key) != fields:
            problems.append(f"receipt of {receipt.operation.op_key} is not the one the log recorded")
    return problems


def _stored_fact_problems(task: Task) -> list[str]:
    """The facts a call is made from, against what the log recorded: every operation's request against its digest
    (the digest itself is in the log), every temp resource's locator against the receipts that named it."""
    problems = [
        f"operation {op_key}'s stored request does not match its registered digest"
        for op_key, request, digest in Operation.objects.filter(task=task).values_list(
            "op_key", "request", "request_digest"
        )
        if digest_of(request) != digest
    ]
    logged = _logged_temps(task.pk)
    stored = dict(TempResource.objects.filter(task=task).values_list("locator", "node_id"))
    problems += [
        f"temp resource {locator!r} is not one a receipt in the log named"
        for locator in stored
        if locator not in logged
    ]
    # The log's record of a temp resource is complete only with its row: without it cleanup never deletes it.
    unstored = sorted(logged.keys() - stored.keys())
    problems += [f"temp resource {locator!r} a receipt in the log named is not stored" for locator in unstored]
    nodes = _node_refs(task)
    problems += [
        f"temp resource {locator!r} is stored under another node than the log's"
        for locator, node_id in stored.items()
        if locator in logged and nodes.get(node_id) != logged[locator]
    ]
    return problems


_TEMP_EVENTS = ["node_succeeded", "evidence_insufficient"]


def _logged_temps(task_id: int) -> dict[str, str | None]:
    """The temp resources the log's receipts named — locator → the node of the receipt's operation as the log
    recorded it (``p<plan>/<key>``) — the first naming wins, as it does for the row."""
    op_nodes: dict[str, Any] = {}
    logged: dict[str, str | None] = {}
    for kind, payload in LoggedEvent.objects.filter(task_id=task_id).order_by("seq").values_list("type", "payload"):
        if not isinstance(payload, dict):
            continue
        operations = payload.get("operations")
        for op_key, fields in operations.items() if isinstance(operations, dict) else ():
            if isinstance(fields, dict) and "node" in fields:
                op_nodes.setdefault(op_key, fields["node"])
        data = payload.get("data")
        if kind in _TEMP_EVENTS and isinstance(data, dict) and isinstance(data.get("temp"), list):
            for locator in data["temp"]:
                logged.setdefault(str(locator), op_nodes.get(str(data.get("op_key"))))
    return logged


def _node_refs(task: Task) -> dict[int, str]:
    rows = Node.objects.filter(task=task).values_list("pk", "plan_version", "key")
    return {pk: f"p{plan}/{key}" for pk, plan, key in rows}


def temp_locator_verified(resource: TempResource) -> None:
    """Before a delete is sent: the locator is one a receipt in the log named (the row alone is not trusted). The
    receipts searched are those of the operations of the temp resource's node (its row names the node; a row that
    names another finds no receipt naming it, and nothing is deleted): a task's 10,000 receipts are not read for
    each of its deletes."""
    node_id = resource.node_id
    keys: list[str] = []
    if node_id is not None:
        operations = Operation.objects.filter(task_id=resource.task_id, node_id=node_id)
        keys = list(operations.values_list("op_key", flat=True))
    receipts = LoggedEvent.objects.filter(
        task_id=resource.task_id, type__in=_TEMP_EVENTS, payload__data__op_key__in=keys
    ).values_list("payload", flat=True)
    for payload in receipts:
        data = payload.get("data") if isinstance(payload, dict) else None
        named = data.get("temp") if isinstance(data, dict) else None
        if isinstance(named, list) and resource.locator in [str(locator) for locator in named]:
            return
    raise StoredFactAltered(
        f"temp resource {resource.locator!r} of task {resource.task_id} is not one a receipt in the log named: "
        "nothing is deleted",
        locator=resource.locator,
    )


def approval_binding_verified(approvals: list[Node]) -> None:
    """Before a gated operation starts: each approval's binding is the one the log recorded at the approval's event
    — the binding the caller decided on, and the one its node row holds now, read again here (neither a row nor a
    snapshot of it kept by a process is trusted with what was approved, nor until when)."""
    fields = ("id", "approval_seq", "approval_plan_version", *BINDING_FIELDS)
    stored = {row["id"]: row for row in Node.objects.filter(pk__in=[n.pk for n in approvals]).values(*fields)}
    for node in approvals:
        for row in _held_and_stored({name: getattr(node, name) for name in fields}, stored.get(node.pk, {})):
            if row.get("approval_seq") is None:
                continue
            payload = (
                LoggedEvent.objects.filter(task_id=node.task_id, seq=row["approval_seq"], type="node_approved")
                .values_list("payload", flat=True)
                .first()
            )
            logged = (payload or {}).get("nodes", {}).get(f"p{row['approval_plan_version']}/{node.key}", {})
            if any(logged.get(name) != jsonable(row.get(name)) for name in BINDING_FIELDS):
                raise StoredFactAltered(
                    f"approval {node.key}'s binding is not the one the log recorded at event {row['approval_seq']}: "
                    "nothing is started under it",
                    node=node.key,
                )


def operation_request_verified(op: Operation) -> None:
    """Before an operation is sent again: its request is the one whose digest the log recorded when it was
    registered, and its target and purpose (which call sends it: submit or compensate) are the log's too — as the
    caller holds them, and as its row holds them now, read again here (neither a row nor a snapshot of it kept by a
    process is trusted with what is sent, nor with how)."""
    logged: dict[str, Any] = {}
    for operations in (
        LoggedEvent.objects.filter(task_id=op.task_id, payload__operations__has_key=op.op_key)
        .order_by("seq")
        .values_list("payload__operations", flat=True)
    ):
        if isinstance(operations, dict) and isinstance(operations.get(op.op_key), dict):
            logged.update(operations[op.op_key])
    fields = ("request", "request_digest", "target", "purpose")
    stored = Operation.objects.filter(pk=op.pk).values(*fields).first()
    digest = logged.get("request_digest")
    for row in _held_and_stored({name: getattr(op, name) for name in fields}, stored or {}):
        if digest is None or digest != row.get("request_digest") or digest_of(row.get("request")) != digest:
            raise StoredFactAltered(
                f"operation {op.op_key}'s stored request is not the one the log registered: it is not sent",
                op_key=op.op_key,
            )
        for name in ("target", "purpose"):
            if logged.get(name, row[name]) != row[name]:
                raise StoredFactAltered(
                    f"operation {op.op_key}'s stored {name} is not the one the log registered: it is not sent",
                    op_key=op.op_key,
                )


def _held_and_stored(held: dict[str, Any], stored: dict[str, Any]) -> list[dict[str, Any]]:
    """The values a caller holds and the ones its row holds now, to check against the log: once when they agree."""
    return [held] if stored == held else [held, stored]


def input_refs_verified(task: Task) -> None:
    """Before the inputs' versions are read again: the task's input refs are the ones the log last recorded — set by
    an event, or derived from the plan document the last plan_accepted names (checked against its digest)."""
    last = (
        LoggedEvent.objects.filter(task=task)
        .filter(Q(type=PLAN_ACCEPTED) | Q(payload__task__has_key="input_refs"))
        .order_by("-seq")
        .only("payload")
        .first()
    )
    if last is not None and _logged_input_refs(task, last.payload) == task.input_refs:
        return
    if not task.input_refs:
        return
    raise StoredFactAltered(f"task {task.pk}'s input refs are not the ones the log recorded: nothing is read from them")


def _logged_input_refs(task: Task, payload: Any) -> Any:
    fields = payload.get("task") if isinstance(payload, dict) else None
    if isinstance(fields, dict) and "input_refs" in fields:
        return fields["input_refs"]
    digest = (payload.get("data") or {}).get("plan_digest") if isinstance(payload, dict) else None
    document = task_plans(task).get(digest) if isinstance(digest, str) else None  # by what is stored, not the row
    if document is None:
        return None
    try:
        return collect_input_refs(validate_plan(document))
    except PlanInvalid:
        return None


# The triggers that keep the event log append-only (tasks/migrations/0009), its archive too (0022): verify_log reports
# one that is gone.
# With them, the one that lets an approval's binding change only by a later approval (tasks/migrations/0018).
EVENT_TRIGGERS: Triggers = {
    "postgresql": {
        "tasks_event": ("event_no_update", "event_no_delete", "event_no_truncate"),
        "tasks_archivedevent": ("archived_event_no_update", "archived_event_no_delete", "archived_event_no_truncate"),
        "tasks_node": ("node_approval_binding_fixed",),
    },
    "sqlite": {
        "tasks_event": ("event_no_update", "event_no_delete"),
        "tasks_archivedevent": ("archived_event_no_update", "archived_event_no_delete"),
        "tasks_node": ("node_approval_binding_fixed",),
    },
}


def missing_event_triggers() -> list[str]:
    """The event log's append-only triggers that are missing or disabled, as ``table.trigger``."""
    return missing_triggers(EVENT_TRIGGERS)


def find_problems(task: Task) -> list[str]:
    problems = []
    log_problem = find_log_problem(task)
    if log_problem:
        problems.append(log_problem)
    anchor_problem = find_anchor_problem(task)
    if anchor_problem:
        problems.append(anchor_problem)
    problems += _definition_problems(task) + _receipt_problems(task) + _stored_fact_problems(task)
    secrets = find_secrets(task)
    if secrets:
        problems.append("credential-like data stored at " + ", ".join(secrets[:5]))
    return problems


def task_verify_log(*, task_id: int, quarantine: bool = True) -> Verdict:
    """Check the task's record; on a problem, quarantine the task with it (unless already quarantined)."""
    task = Task.objects.get(pk=task_id)
    try:
        problems = find_problems(task)
    except Exception as exc:  # a record that breaks the checker is one nobody can trust: a problem like the others
        problems = [f"the record could not be verified: {type(exc).__name__}: {exc}"]
    if task.status == TaskStatus.QUARANTINED:
        # Quarantine stays until a person resolves it, even if the record now reads consistently.
        return Verdict(task_id, "; ".join(problems) or f"quarantined: {task.status_detail}")
    if not problems:
        return Verdict(task_id, None)
    problem = "; ".join(problems)
    if not quarantine:
        return Verdict(task_id, problem)
    try:
        with transaction.atomic():
            task_quarantine(task_id=task_id, expected_version=task.version, reason=problem)
    except VersionConflict:
        return Verdict(task_id, problem + " (task moved on while verifying; run again)")
    except IntegrityError:
        # The log already holds an event past the task's version (a forged tail): no event can follow it. The task
        # is stopped all the same, and the audit log says why.
        if not _quarantine_beside_the_log(task, problem):
            return Verdict(task_id, problem + " (task moved on while verifying; run again)")
    return Verdict(task_id, problem, quarantined_now=True)


def _quarantine_beside_the_log(task: Task, problem: str) -> bool:
    with transaction.atomic():
        now = clock.now()
        stopped = Task.objects.filter(pk=task.pk, version=task.version).update(
            status=TaskStatus.QUARANTINED.value, status_reason="", status_detail=problem[:500], updated_at=now
        )
        if stopped != 1:
            return False
        audit_append(
            actor=Principal.system("verify_log"),
            action="quarantined_beside_the_log",
            at=now,
            task_id=task.pk,
            version_before=task.version,
            version_after=task.version,
            reason=problem[:MAX_TEXT],  # what the row keeps: every problem found may add up past the cap
            details={"why": "the log holds an event past the task's version: no event can be appended"},
        )
    return True


def task_quarantine(*, task_id: int, expected_version: int, reason: str) -> Task:
    """Stop a task whose record cannot be trusted. Nobody advances it until a person investigates."""
    compare_and_set(
        task_id,
        expected_version,
        Change(
            event="quarantined",
            kind=ChangeKind.QUARANTINE,
            task={"status": TaskStatus.QUARANTINED.value, "status_reason": "", "status_detail": reason[:500]},
            data={"reason": reason[:500]},
        ),
        lease=None,
        actor=Actor.SYSTEM,
    )
    return Task.objects.get(pk=task_id)
