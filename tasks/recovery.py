"""Which tasks need a worker, from the database alone (the recovery scan; DESIGN §8: messages may be lost)."""

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet

from leases import clock
from leases.models import Lease, LeaseReservation
from leases.services import lease_grace
from tasks.cleanup import ENDED
from tasks.lifecycle import TaskStatus
from tasks.models import Task, TempResource, TempResourceStatus

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
    """Workable tasks, and ended tasks with temp resources left to delete, that nobody holds (no lease still inside
    its grace) and no person waits for."""
    now = now or clock.now()
    held = Lease.objects.open().filter(task_id=OuterRef("pk"), expires_at__gt=now - lease_grace())
    reserved = LeaseReservation.objects.filter(task_id=OuterRef("pk"))
    litter = TempResource.objects.filter(
        task_id=OuterRef("pk"), status__in=[TempResourceStatus.ACTIVE, TempResourceStatus.CLEANING]
    )
    needs_work = Q(status__in=WORKABLE) | (Q(status__in=ENDED) & Q(Exists(litter)))
    return Task.objects.filter(needs_work).exclude(Exists(held)).exclude(Exists(reserved)).order_by("pk")
