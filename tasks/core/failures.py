"""Failure classes decide the branch (DESIGN §6), and backoff with seeded jitter on the database clock."""

import hashlib
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from tasks.core.lifecycle import FailureClass, PauseReason

# What a plan may choose per class (``on_failure``); the first entry is the default.
ALLOWED_DESTINATIONS: dict[FailureClass, tuple[str, ...]] = {
    FailureClass.INVALID_PARAMS: ("pause", "fail_task"),
    FailureClass.PERMISSION_REVOKED: ("pause",),
    # A long outage leaves the task as it is (backing off, then paused when the budget runs out), never failed.
    FailureClass.DEPENDENCY_UNAVAILABLE: ("retry",),
    # Unknown is a state, not a guess: only a query by op key settles it.
    FailureClass.CONNECTION_INTERRUPTED: ("reconcile",),
    FailureClass.CONFLICT: ("pause",),
}

PAUSE_REASON: dict[FailureClass, PauseReason] = {
    FailureClass.INVALID_PARAMS: PauseReason.NEEDS_REPLAN,
    FailureClass.PERMISSION_REVOKED: PauseReason.PERMISSION_REVOKED,
    FailureClass.CONFLICT: PauseReason.VERSION_CONFLICT,
}


def destination(failure_class: FailureClass, on_failure: dict[str, str]) -> str:
    return on_failure.get(failure_class.value, ALLOWED_DESTINATIONS[failure_class][0])


def resolved_destinations(on_failure: dict[str, str]) -> dict[str, str]:
    """Where a failure of each class goes: the node's own choice or the default. An accepted node stores this
    whole map (``Node.on_failure``), so no destination is left implicit and the console can show each one."""
    return {cls.value: destination(cls, on_failure) for cls in FailureClass}


@dataclass(frozen=True)
class Backoff:
    delay: timedelta
    not_before: datetime


def backoff(*, now: datetime, attempt: int, seed: str) -> Backoff:
    """Exponential backoff, capped, with ±25% jitter drawn from a seed (task uid, node, attempt):
    many tasks do not wake together, and a test can predict the delay."""
    base: timedelta = settings.RECKON_BACKOFF_BASE
    cap: timedelta = settings.RECKON_BACKOFF_CAP
    raw = min(cap.total_seconds(), base.total_seconds() * 2 ** max(attempt - 1, 0))
    rng = random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{attempt}".encode()).digest()[:8]))  # noqa: S311
    delay = timedelta(seconds=raw * rng.uniform(0.75, 1.25))
    return Backoff(delay=delay, not_before=now + delay)
