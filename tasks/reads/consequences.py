"""What a dangerous action will do, computed from the live rows before a person confirms it (read only).

Every sentence counts the rows as they are now — operations in flight, committed effects, temp resources, the lease
holder — so a confirmation never shows a number that was true once. Each function reads a fixed number of rows
whatever the size of the task (aggregates, and at most ``NAMED`` op keys by name).
"""

from dataclasses import dataclass
from typing import Literal

from django.db.models import Count, Q

from leases.models import Lease
from leases.services import lease_open
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, OperationStatus, TempResourceStatus
from tasks.decide.decisions import not_found_final_at
from tasks.models import Operation, OperationPurpose, Task, TempResource

NAMED = 5  # op keys named in a sentence; the rest are counted
_OPEN = [s.value for s in OPEN_OPERATION_STATUSES]
_NOT_DELETED = [TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value, TempResourceStatus.STUCK.value]

Resolution = Literal["done", "not_done", "compensate"]


@dataclass(frozen=True)
class Consequences:
    """The sentences a person reads before confirming, and the one number the action touches now."""

    sentences: tuple[str, ...]
    impact: int
    impact_label: str  # what ``impact`` counts, agreeing with it: "1 operation in flight", "2 operations in flight"


@dataclass(frozen=True)
class CancelCounts:
    in_flight: int  # dispatched, accepted or unknown: awaited, recorded as they truly end
    unknown: int  # of which unknown: reconciled by op key before the task can stop
    intents: int  # registered, never sent: withdrawn
    committed_effects: int  # committed effects: they stay, nothing is undone
    temp_resources: int  # not yet deleted: cleaned once the task has stopped
    in_flight_keys: tuple[str, ...]


def plural(count: int, word: str, many: str = "") -> str:
    return f"{count} {noun(count, word, many)}"


def noun(count: int, word: str, many: str = "") -> str:
    return word if count == 1 else (many or word + "s")


def cancel_counts(task: Task) -> CancelCounts:
    """Two aggregate reads and one of at most NAMED op keys."""
    ops = Operation.objects.filter(task=task).aggregate(
        in_flight=Count("pk", filter=Q(status__in=_OPEN)),
        unknown=Count("pk", filter=Q(status=OperationStatus.UNKNOWN.value)),
        intents=Count("pk", filter=Q(status=OperationStatus.INTENT.value)),
        committed=Count("pk", filter=Q(status=OperationStatus.COMMITTED.value, purpose=OperationPurpose.EFFECT.value)),
    )
    temps = TempResource.objects.filter(task=task, status__in=_NOT_DELETED).count()
    keys = tuple(
        Operation.objects.filter(task=task, status__in=_OPEN).order_by("pk").values_list("op_key", flat=True)[:NAMED]
    )
    return CancelCounts(ops["in_flight"], ops["unknown"], ops["intents"], ops["committed"], temps, keys)


def _named(keys: tuple[str, ...], total: int) -> str:
    more = total - len(keys)
    return ", ".join(keys) + (f" and {more} more" if more > 0 else "")


def cancel_consequences(task: Task) -> Consequences:
    """What ``tasks.people.cancel.task_request_cancel`` will do to ``task`` as it is now."""
    c = cancel_counts(task)
    sentences = ["Once the cancel is recorded no new operation starts, on any node, by anyone."]
    if c.in_flight:
        sentences.append(
            f"{plural(c.in_flight, 'operation')} in flight will be awaited and recorded as "
            f"{'it' if c.in_flight == 1 else 'they'} truly end: {_named(c.in_flight_keys, c.in_flight)}."
        )
        sentences.append("The task shows stopping until then; a call already sent is not interrupted.")
    else:
        sentences.append("No operation is in flight: nothing needs to be awaited.")
    if c.unknown:
        sentences.append(
            f"{plural(c.unknown, 'operation')} of unknown outcome must be reconciled by op key: "
            "until then the task shows stopped with pending reconciliation."
        )
    if c.intents:
        sentences.append(f"{plural(c.intents, 'registered intent')} never sent will be withdrawn.")
    sentences.append(
        f"{plural(c.committed_effects, 'committed effect')} stay{'s' if c.committed_effects == 1 else ''} "
        "as recorded: a cancel undoes nothing (a compensation is a separate, explicit choice)."
    )
    sentences.append(
        f"{plural(c.temp_resources, 'temp resource')} will be cleaned up once the task has stopped."
        if c.temp_resources
        else "No temp resource is left to clean up."
    )
    return Consequences(tuple(sentences), c.in_flight, noun(c.in_flight, "operation") + " in flight")


def force_release_consequences(task: Task) -> Consequences:
    """What ``tasks.people.forced_release.lease_force_release`` will do to ``task`` as it is now."""
    holder: Lease | None = lease_open(task.pk)
    in_flight = Operation.objects.filter(task=task, status__in=_OPEN).count()
    if holder is None:
        return Consequences(("Nobody holds this task's lease: there is nothing to release.",), 0, "lease holders")
    who = f"{holder.holder_kind} {holder.holder_id}"
    sentences = [
        f"The lease of {who} (epoch {holder.epoch}) is closed now: from this moment it can write nothing more, "
        "and its late answers go to the next holder's reconciliation.",
        f"{who} may have {plural(in_flight, 'operation')} in flight; "
        "each is reconciled by op key before anything new starts.",
        "The release is recorded with your justification and impact, audited, and waits for review by "
        "another admin (you cannot review your own).",
    ]
    return Consequences(tuple(sentences), in_flight, noun(in_flight, "operation") + " in flight")


def settle_consequences(op: Operation, resolution: Resolution) -> Consequences:
    """What ``tasks.people.settlement.operation_settle_by_hand`` will do to ``op`` (its node is read with it)."""
    node = op.node
    if resolution == "done":
        sentences = [
            f"Operation {op.op_key} is recorded committed, with the receipt you give as its evidence.",
            f"Node {node.key} succeeds only if that receipt meets its evidence spec; otherwise it is marked failed.",
        ]
        touched = 1
    elif resolution == "not_done":
        sentences = [
            f"Operation {op.op_key} is recorded as never having taken effect (rejected: not done).",
            f"Node {node.key} may run again, under a new op key: if the remote did apply it, it happens twice.",
            "Accepted only once no request under the op key can still land: Reckon first asks the remote to fence "
            "the op key where it can, and otherwise waits for the request's deadline "
            f"({not_found_final_at(op).isoformat(timespec='seconds')}, clock skew included).",
        ]
        touched = 1
    else:
        sentences = [
            f"Operation {op.op_key} is recorded committed, with the receipt you give.",
            f"A compensation ({node.compensation or 'none declared'}) is registered under its own op key "
            f"{op.op_key}-compensation and sent by the agent; the system never retries it.",
            "Both receipts stay; the task then pauses needs_replan, because the plan no longer says what is true.",
        ]
        touched = 2
    sentences.append("Your note and evidence are audited with your name.")
    return Consequences(tuple(sentences), touched, noun(touched, "operation") + " written")


def temp_reset_consequences(temp: TempResource, refused: int) -> Consequences:
    """What ``tasks.engine.cleanup.temp_resource_reset`` will do; ``refused`` is the number of deletes tried so far."""
    sentences = (
        f"Temp resource {temp.locator} was refused deletion {plural(refused, 'time')}; it is marked active again.",
        "The next worker run deletes it under a new op key and records the receipt; "
        "if every delete is refused again it is marked stuck again.",
        "Only this one locator is named; the task's receipts are never touched.",
    )
    return Consequences(sentences, refused, noun(refused, "delete") + " refused so far")
