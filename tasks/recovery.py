"""Which tasks need a worker, from the database alone (the recovery scan; DESIGN §8: messages may be lost)."""

from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet

from leases import clock
from leases.models import Lease, LeaseReservation
from leases.services import lease_grace
from tasks.lifecycle import TaskStatus
from tasks.models import Task

# Statuses in which an agent has something to do: run nodes, observe or reconcile operations, settle a cancel.
WORKABLE = [
    TaskStatus.PENDING.value,
    TaskStatus.RUNNING.value,
    TaskStatus.OBSERVING.value,
    TaskStatus.BACKING_OFF.value,
    TaskStatus.STOPPING.value,
    TaskStatus.STOPPED_PENDING.value,
]


def tasks_needing_work(now: datetime | None = None) -> QuerySet[Task]:
    """Workable tasks that nobody holds (no lease still inside its grace) and no person waits for."""
    now = now or clock.now()
    held = Lease.objects.open().filter(task_id=OuterRef("pk"), expires_at__gt=now - lease_grace())
    reserved = LeaseReservation.objects.filter(task_id=OuterRef("pk"))
    return Task.objects.filter(status__in=WORKABLE).exclude(Exists(held)).exclude(Exists(reserved)).order_by("pk")
