"""Reads of retained objects for pages and the API."""

from dataclasses import dataclass
from datetime import datetime

from leases import clock
from retention.models import RetainedObject
from retention.services import max_extensions, max_lifetime


def retained_for_task(task_id: int) -> list[RetainedObject]:
    """A task's retained objects, every version, purged ones too (their rows stay as the record)."""
    return list(RetainedObject.objects.filter(task_id=task_id).order_by("name", "version"))


@dataclass(frozen=True)
class LiveRetained:
    """A live retained object as a person deciding to keep it longer sees it: how far and how often it may still
    be extended (``retention_extend`` decides; these only say what it will allow)."""

    row: RetainedObject
    kept_at_most_until: datetime  # created_at + RECKON_RETENTION_MAX_EXTENSION
    extensions_allowed: int  # RECKON_RETENTION_MAX_EXTENSIONS

    @property
    def extensions_left(self) -> int:
        return max(self.extensions_allowed - self.row.extended_count, 0)


def live_retained_for_task(task_id: int, *, now: datetime | None = None) -> list[LiveRetained]:
    """The task's objects still readable at ``now`` (default: the database clock), the soonest to expire first.
    One query."""
    now = clock.now() if now is None else now
    bound, allowed = max_lifetime(), max_extensions()
    rows = RetainedObject.objects.live(now).filter(task_id=task_id).order_by("expires_at", "name", "version")
    return [
        LiveRetained(row=row, kept_at_most_until=row.created_at + bound, extensions_allowed=allowed) for row in rows
    ]
