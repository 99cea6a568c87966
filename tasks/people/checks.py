"""What every person's action checks first: that the form was made on the task's current version, and that the
lease it acts under is the person's own takeover lease. Below every module of people/, so each asks the same."""

from audit.principals import Principal
from leases.models import HolderKind, Lease
from tasks.access.permissions import PermissionDenied
from tasks.core.errors import VersionConflict
from tasks.models import LoggedEvent, Task


def stale_form(task: Task, based_on_version: int) -> VersionConflict:
    """The refusal of a form based on an older version of ``task``, with the events since (seq and type)."""
    changes = list(
        LoggedEvent.objects.filter(task=task, seq__gt=based_on_version).order_by("seq").values_list("seq", "type")
    )
    listed = ", ".join(f"#{seq} {kind}" for seq, kind in changes[:20])
    return VersionConflict(
        f"the task changed since your form (version {based_on_version} → {task.version}): {listed}",
        expected=based_on_version,
        actual=task.version,
        changes=[{"seq": seq, "type": kind} for seq, kind in changes],
    )


def own_lease(actor: Principal, lease: Lease) -> None:
    """PermissionDenied unless ``lease`` is ``actor``'s takeover lease."""
    if lease.holder_kind != HolderKind.OPERATOR or lease.holder_id != actor.id:
        raise PermissionDenied(f"{actor} does not hold this takeover lease ({lease.holder_kind}:{lease.holder_id})")
