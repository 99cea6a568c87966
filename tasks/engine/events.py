"""The event log: hash-chained, contiguous per task, written in the same transaction as the projection.

A payload has the shape ``{"task": {...}, "nodes": {"p<plan>/<key>": {...}}, "operations": {"<op key>": {...}},
"data": {...}}``: the first three are the projected fields the change set, the last carries references
(ids, versions, digests). Folding the payloads in ``seq`` order rebuilds the projection.

No event carries a plan. A ``plan_accepted`` event names the plan revision's digest (``data.plan_digest``); the plan
document is stored once (``PlanRevision``), and the nodes the acceptance inserts — each new one at its defaults, each
kept one with what it carries over (``tasks.core.plan.kept_keys``) — and the task's input refs derive from it. The
fold derives them the same way, from the document whose digest the event names: a document that is not the one the
log accepted cannot be folded. (Events written before this listed every node and the input refs: a ``plan_accepted``
with ``"nodes"`` in its payload is folded as it says.)
"""

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import models

from audit.hygiene import canonical_json, check_payload, digest_of
from tasks import rows
from tasks.core.errors import PlanInvalid
from tasks.core.lifecycle import TERMINAL_TASK_STATUSES, NodeStatus
from tasks.core.plan import NodeSpec, collect_input_refs, kept_keys, validate_plan
from tasks.decide.approval_binding import BINDING_FIELDS
from tasks.models import Event, LoggedEvent, Node, Operation, PlanRevision, Task
from tasks.rows import node_ref

GENESIS_DIGEST = "0" * 64
EVENT_CHUNK = 2000  # events read at a time by a check that streams a task's log

# The projected fields: what the log must be able to rebuild.
TASK_FIELDS = (
    "status",
    "status_reason",
    "status_detail",
    "plan_version",
    "attempt_budget",
    "attempts_used",
    "inputs_recheck_required",
    "cancel_requested_at",
    "input_refs",  # what the agent reads its inputs' versions from after a hand-back
)
NODE_FIELDS = (
    "status",
    "attempts",
    "last_error_class",
    "last_attempt_at",
    "next_allowed_action",
    "not_before",
    "output",
    # An approval node's binding (tasks/decide/approval_binding.py): what was asked and what was approved.
    "approval_proposed_digest",
    "approval_digest",
    "approval_requests",
    "approval_plan_version",
    "approval_expires_at",
    "approval_seq",
    "approved_by",
)
# A node enters the log with these values unless its insert says otherwise; its definition is in the
# plan revision, whose digest the plan_accepted event carries.
NODE_DEFAULTS: dict[str, Any] = {
    "status": "pending",
    "attempts": 0,
    "last_error_class": "",
    "last_attempt_at": None,
    "next_allowed_action": "",
    "not_before": None,
    "output": {},
    "approval_proposed_digest": "",
    "approval_digest": "",
    "approval_requests": {},
    "approval_plan_version": None,
    "approval_expires_at": None,
    "approval_seq": None,
    "approved_by": "",
}
# What a node kept by a new plan carries over from the old plan's succeeded node (tasks.engine.plans.plan_nodes): its
# status, output and attempts, and an approval's binding (a gated start refuses it as given under another plan).
CARRIED_FIELDS = ("status", "output", "attempts")
# The task fields a plan_accepted event leaves out: they derive from the plan document it names.
DERIVED_TASK_FIELDS = frozenset({"input_refs"})
PLAN_ACCEPTED = "plan_accepted"


def carried_fields(get: Callable[[str], Any]) -> dict[str, Any]:
    """The fields a kept node carries over, read through ``get(name)`` from the old node (a row or a projection)."""
    fields = {name: get(name) for name in CARRIED_FIELDS}
    if get("approval_seq") is not None:
        fields |= {name: get(name) for name in BINDING_FIELDS}
    return fields


# request_digest, target and purpose: what is sent (and re-sent), and which call sends it (submit, compensate,
# delete), are covered by the log, not only by the row.
OPERATION_FIELDS = (
    "node",
    "status",
    "failure_class",
    "remote_id",
    "dispatch_count",
    "request_digest",
    "target",
    "purpose",
)


def jsonable(value: Any) -> Any:
    """Normalise to what a JSON column gives back, so the digest of a stored payload is stable."""
    if value is None or type(value) in _JSON_SCALARS:
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, models.Model):
        raise TypeError(f"put a reference, not a row, in an event payload: {value!r}")
    return (
        json.loads(json.dumps(value, default=str)) if not isinstance(value, str | int | float | bool | None) else value
    )


_JSON_SCALARS = frozenset({str, int, bool})  # exactly these types: a subclass (an enum member) is normalised below


def event_digest(*, task_uid: str, seq: int, type: str, payload: dict[str, Any], created_at: str, prev: str) -> str:
    """The digest of an event: SHA-256 over the previous digest and the canonical JSON of
    ``{"at", "payload", "seq", "task", "type"}``."""
    return _chain_digest(
        task_uid=task_uid, seq=seq, type=type, body=canonical_json(payload), created_at=created_at, prev=prev
    )


def _chain_digest(*, task_uid: str, seq: int, type: str, body: str, created_at: str, prev: str) -> str:
    # The keys in their canonical (sorted) order, the payload's canonical text spliced in: the same text as
    # canonical_json of the whole object, without serialising the payload again.
    text = (
        f'{{"at":{_scalar(created_at)},"payload":{body},"seq":{_scalar(seq)},'
        f'"task":{_scalar(task_uid)},"type":{_scalar(type)}}}'
    )
    return hashlib.sha256((prev + text).encode()).hexdigest()


def _scalar(value: str | int) -> str:
    return _SCALAR(value)


_SCALAR = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(value, ensure_ascii=False), one encoder for all


def chain_event(*, task: Task, seq: int, type: str, payload: dict[str, Any], at: datetime) -> Event:
    """Event ``seq``, chained to the task row's head (the digest of event ``seq - 1``), not saved yet: the
    compare-and-set moves the head in the task row's UPDATE and then inserts it. Checked for hygiene here."""
    payload = jsonable(payload)
    body = canonical_json(payload)  # made once: for the cap, the digest and the stored value (canonical_payload)
    check_payload(payload, what=f"event {type}", canonical=body)
    prev = GENESIS_DIGEST if seq == 1 else task.log_head
    digest = _chain_digest(task_uid=str(task.uid), seq=seq, type=type, body=body, created_at=at.isoformat(), prev=prev)
    event = rows.new_row(
        Event,
        {
            "task_id": task.pk,
            "seq": seq,
            "type": type,
            "payload": payload,
            "prev_digest": prev,
            "digest": digest,
            "created_at": at,
        },
    )
    event.canonical_payload = body  # type: ignore[attr-defined]
    return event


def append_event(*, task: Task, seq: int, type: str, payload: dict[str, Any], at: datetime) -> Event:
    """Append event ``seq`` outside a compare-and-set (the task's first event) and move the task row's head."""
    event = chain_event(task=task, seq=seq, type=type, payload=payload, at=at)
    event.save(force_insert=True)
    Task.objects.filter(pk=task.pk).update(log_head=event.digest)
    task.log_head = event.digest
    event_appended(task, event)
    event_written(task, event)
    return event


# --- listeners and observers -----------------------------------------------------------------------------------
# An app that must write something in the same transaction as an event (the webhook outbox) registers a listener
# at start-up (``listen``). It is called inside the transaction, after the event's row is written and before the
# commit; what it raises rolls the change back. An app that only reports events (the state-change log line, the
# trace) registers an observer (``observe``): it is called once the change is written — after its commit, where the
# change is a transaction or a statement of its own — and it writes nothing. An event nothing listens to lets the
# compare-and-set write the change as one statement (tasks/engine/cas.py): deciding that costs a dict lookup.

type EventListener = Callable[[Task, Event], None]


@dataclass
class _Subscribers:
    by_type: dict[str, list[EventListener]] = field(default_factory=dict)
    on_finish: list[EventListener] = field(default_factory=list)  # every event whose payload ends the task

    def add(self, types: frozenset[str], listener: EventListener, on_finish: bool) -> None:
        for name in types:
            if listener not in self.by_type.setdefault(name, []):
                self.by_type[name].append(listener)
        if on_finish and listener not in self.on_finish:
            self.on_finish.append(listener)

    def remove(self, listener: EventListener) -> None:
        for listeners in self.by_type.values():
            if listener in listeners:
                listeners.remove(listener)
        if listener in self.on_finish:
            self.on_finish.remove(listener)

    def of(self, event: Event) -> list[EventListener]:
        called = list(self.by_type.get(event.type, ()))
        if self.on_finish and event.payload.get("task", {}).get("status") in ENDING_STATUSES:
            called += [listener for listener in self.on_finish if listener not in called]
        return called


_LISTENERS = _Subscribers()  # write in the change's transaction
_OBSERVERS = _Subscribers()  # report it once written
# An event that moves the task into a terminal status finishes it (the webhook's task_finished); a quarantine has its
# own event.
ENDING_STATUSES = frozenset(s.value for s in TERMINAL_TASK_STATUSES)


def listen(types: frozenset[str], listener: EventListener, *, on_finish: bool = False) -> None:
    """Call ``listener(task, event)`` for every event of ``types`` (and, with ``on_finish``, every event that ends
    the task), inside the transaction that appends it."""
    _LISTENERS.add(types, listener, on_finish)


def observe(types: frozenset[str], observer: EventListener, *, on_finish: bool = False) -> None:
    """Call ``observer(task, event)`` for every event of ``types`` (and, with ``on_finish``, every event that ends
    the task) once the change that appends it is written. An observer writes nothing."""
    _OBSERVERS.add(types, observer, on_finish)


def unlisten(listener: EventListener) -> None:
    _LISTENERS.remove(listener)
    _OBSERVERS.remove(listener)


def listeners_of(event: Event) -> list[EventListener]:
    """The listeners ``event`` will be told of: none, and appending it writes only the change's own rows."""
    return _LISTENERS.of(event)


def event_appended(task: Task, event: Event, listeners: list[EventListener] | None = None) -> None:
    """Tell the listeners of ``event`` (called by every path that appends one, inside its transaction);
    ``listeners``: as ``listeners_of`` gave them to a caller that looked them up already."""
    for listener in _LISTENERS.of(event) if listeners is None else listeners:
        listener(task, event)


def event_written(task: Task, event: Event) -> None:
    """Tell the observers of ``event`` (called by every path that appends one, once the change is written)."""
    for observer in _OBSERVERS.of(event):
        observer(task, event)


@dataclass
class Projection:
    task: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 0


class Unfoldable(Exception):
    """The log cannot be rebuilt: what is missing or wrong, said as verify_log reports it."""


class Folder:
    """Folds events in ``seq`` order into a projection, one at a time (a log of any length in flat memory).
    ``plans``: the task's plan documents by digest, from which an acceptance's nodes derive."""

    def __init__(self, plans: Mapping[str, Any]) -> None:
        self.projection = Projection()
        self.plans = plans
        self.accepted: str | None = None  # the digest of the plan the task runs (its nodes' definitions)
        self._validated: dict[str, list[NodeSpec]] = {}

    def add(self, event: Event | LoggedEvent) -> None:
        projection, payload = self.projection, event.payload
        projection.version = event.seq
        if event.type == PLAN_ACCEPTED:
            data = payload.get("data")
            digest = data.get("plan_digest") if isinstance(data, dict) else None
            if "nodes" not in payload:
                self._derive(event.seq, digest, payload.get("task", {}).get("plan_version"))
            self.accepted = digest
        projection.task.update(payload.get("task", {}))
        for ref, fields in payload.get("nodes", {}).items():
            projection.nodes.setdefault(ref, dict(NODE_DEFAULTS)).update(fields)
        for op_key, fields in payload.get("operations", {}).items():
            projection.operations.setdefault(op_key, {}).update(fields)

    def _derive(self, seq: int, digest: Any, number: Any) -> None:
        """The nodes and input refs of the plan accepted at ``seq``, from its document (the module's docstring)."""
        projection = self.projection
        specs = self._specs(seq, digest)
        succeeded: dict[str, str] = {}
        previous = projection.task.get("plan_version")
        if self.accepted is not None and previous:
            before = {spec.key: spec.definition_digest for spec in self._specs(seq, self.accepted)}
            prefix = f"p{previous}/"
            for ref, fields in projection.nodes.items():
                key = ref.removeprefix(prefix)
                if key != ref and fields.get("status") == NodeStatus.SUCCEEDED.value and key in before:
                    succeeded[key] = before[key]
        kept = kept_keys(specs, succeeded)
        for spec in specs:
            fields = dict(NODE_DEFAULTS)
            if spec.key in kept:
                fields |= carried_fields(projection.nodes[f"p{previous}/{spec.key}"].get)
            projection.nodes[f"p{number}/{spec.key}"] = fields
        projection.task["input_refs"] = collect_input_refs(specs)

    def _specs(self, seq: int, digest: Any) -> list[NodeSpec]:
        document = self.plans.get(digest) if isinstance(digest, str) else None
        if document is None:
            raise Unfoldable(f"event seq {seq} accepts plan {digest!r}, and no stored plan revision has that digest")
        if digest not in self._validated:
            try:
                self._validated[digest] = validate_plan(document)
            except PlanInvalid as invalid:
                raise Unfoldable(f"the plan event seq {seq} accepts no longer validates: {invalid}") from invalid
        return self._validated[digest]


def fold(events: Iterable[Event | LoggedEvent], plans: Mapping[str, Any] | None = None) -> Projection:
    folder = Folder(plans or {})
    for event in events:
        folder.add(event)
    return folder.projection


def task_plans(task: Task) -> dict[str, Any]:
    """The task's plan documents by the digest of what is stored (not the digest the row claims): a document
    altered since its event named it is not found under that name."""
    return {
        digest_of(document): document
        for document in PlanRevision.objects.filter(task=task).values_list("document", flat=True).iterator()
    }


def stored_projection(task: Task) -> Projection:
    nodes = {
        node_ref(node): {name: jsonable(getattr(node, name)) for name in NODE_FIELDS}
        for node in Node.objects.filter(task=task)
    }
    operations = {
        op.op_key: {"node": node_ref(op.node), **{name: jsonable(getattr(op, name)) for name in OPERATION_FIELDS[1:]}}
        for op in Operation.objects.filter(task=task).select_related("node")
    }
    return Projection(
        task={name: jsonable(getattr(task, name)) for name in TASK_FIELDS},
        nodes=nodes,
        operations=operations,
        version=task.version,
    )


def find_log_problem(task: Task) -> str | None:
    """First problem in the task's log, or None: a gap in seq, a broken chain, a payload that cannot be folded, an
    end that is not the task's version or its row's head, or a projection mismatch."""
    folder = Folder(task_plans(task))
    prev = GENESIS_DIGEST
    # Streamed in seq order: memory flat in the log's length.
    events = LoggedEvent.objects.filter(task=task).order_by("seq").iterator(chunk_size=EVENT_CHUNK)
    for expected_seq, event in enumerate(events, start=1):
        if event.seq != expected_seq:
            return f"gap in the log: expected seq {expected_seq}, found {event.seq}"
        if event.prev_digest != prev:
            return f"broken chain at seq {event.seq}: prev digest does not match seq {event.seq - 1}"
        digest = event_digest(
            task_uid=str(task.uid),
            seq=event.seq,
            type=event.type,
            payload=event.payload,
            created_at=event.created_at.isoformat(),
            prev=prev,
        )
        if digest != event.digest:
            return f"event seq {event.seq} was altered: its digest does not match its content"
        if not _foldable(event.payload):
            return f"event seq {event.seq} has a payload the log cannot be rebuilt from"
        try:
            folder.add(event)
        except Unfoldable as unfoldable:
            return str(unfoldable)
        prev = event.digest
    rebuilt, stored = folder.projection, stored_projection(task)
    if rebuilt.version != stored.version:
        return f"log ends at seq {rebuilt.version} but the task is at version {stored.version}"
    if task.log_head != prev:
        return f"the task row's log head is not the digest of event seq {rebuilt.version}: the log's end was changed"
    for name in TASK_FIELDS:
        if rebuilt.task.get(name) != stored.task[name]:
            return f"task.{name} is {stored.task[name]!r}, the log says {rebuilt.task.get(name)!r}"
    for label, rebuilt_rows, stored_rows in (
        ("node", rebuilt.nodes, stored.nodes),
        ("operation", rebuilt.operations, stored.operations),
    ):
        if rebuilt_rows.keys() != stored_rows.keys():
            missing = sorted(set(rebuilt_rows) ^ set(stored_rows))
            return f"{label}s differ from the log: {', '.join(missing)}"
        for ref, fields in stored_rows.items():
            for name, value in fields.items():
                if rebuilt_rows[ref].get(name) != value:
                    return f"{label} {ref}.{name} is {value!r}, the log says {rebuilt_rows[ref].get(name)!r}"
    return None


def _foldable(payload: Any) -> bool:
    """What ``fold`` reads: a mapping under "task", mappings of mappings under "nodes" and "operations"."""
    if not isinstance(payload, dict) or not isinstance(payload.get("task", {}), dict):
        return False
    return all(
        isinstance(rows, dict) and all(isinstance(fields, dict) for fields in rows.values())
        for rows in (payload.get("nodes", {}), payload.get("operations", {}))
    )
