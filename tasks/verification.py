"""Verify a task's log against its projection; a gap or mismatch quarantines the task (invariant 7).
Also scans stored payloads for secrets (invariant 8)."""

from dataclasses import dataclass

from tasks.cas import Change, compare_and_set
from tasks.errors import VersionConflict
from tasks.events import find_log_problem
from tasks.hygiene import scan_payload
from tasks.lifecycle import TaskStatus
from tasks.models import Event, Node, Receipt, Task


@dataclass(frozen=True)
class Verdict:
    task_id: int
    problem: str | None
    quarantined_now: bool = False


def find_secrets(task: Task) -> list[str]:
    found = []
    for event in Event.objects.filter(task=task).only("seq", "payload"):
        found += [f"event {event.seq} {path}" for path in scan_payload(event.payload)]
    for receipt in Receipt.objects.filter(operation__task=task).only("pk", "data"):
        found += [f"receipt {receipt.pk} {path}" for path in scan_payload(receipt.data)]
    for node in Node.objects.filter(task=task).only("key", "output", "input"):
        found += [f"node {node.key} {path}" for path in scan_payload({"input": node.input, "output": node.output})]
    return found


def task_verify_log(*, task_id: int, quarantine: bool = True) -> Verdict:
    """Rebuild the projection from the events and compare. On a problem, quarantine the task with it."""
    task = Task.objects.get(pk=task_id)
    problem = find_log_problem(task)
    if problem is None:
        secrets = find_secrets(task)
        if secrets:
            problem = "credential-like data stored at " + ", ".join(secrets[:5])
    if problem is None or not quarantine or task.status == TaskStatus.QUARANTINED:
        return Verdict(task_id, problem)
    try:
        task_quarantine(task_id=task_id, expected_version=task.version, reason=problem)
    except VersionConflict:
        return Verdict(task_id, problem + " (task moved on while verifying; run again)")
    return Verdict(task_id, problem, quarantined_now=True)


def task_quarantine(*, task_id: int, expected_version: int, reason: str) -> Task:
    """Stop a task whose record cannot be trusted. Nobody advances it until a person investigates."""
    compare_and_set(
        task_id,
        expected_version,
        Change(
            event="quarantined",
            task={"status": TaskStatus.QUARANTINED.value, "status_reason": "", "status_detail": reason[:500]},
            data={"reason": reason[:500]},
        ),
        lease=None,
    )
    return Task.objects.get(pk=task_id)
