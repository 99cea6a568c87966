from django.db import models
from django.db.models import Q


class HolderKind(models.TextChoices):
    AGENT = "agent"
    OPERATOR = "operator"


class ReleaseReason(models.TextChoices):
    RELEASED = "released"  # the holder gave it back
    EXPIRED = "expired"  # closed by the next acquire, after expiry plus grace
    FORCED = "forced"  # an admin removed the holder (tasks/people/forced_release.py)


class LeaseQuerySet(models.QuerySet["Lease"]):
    def open(self) -> "LeaseQuerySet":
        """Not released yet: live, inside its grace, or lapsed but not yet closed by a new grant."""
        return self.filter(released_at__isnull=True)


class Lease(models.Model):
    """One grant of the right to advance a task. Rows are history; at most one per task is open.

    The ``epoch`` is the fencing token: it grows by one with every grant on the task, and every
    state write compares it (tasks.engine.cas.compare_and_set), so a holder that lost its lease can
    change nothing.
    """

    # A string reference, not an import: leases sits below tasks in the dependency order.
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="leases")
    holder_kind = models.CharField(max_length=16, choices=HolderKind.choices)
    holder_id = models.CharField(max_length=200)
    task_version_at_grant = models.PositiveBigIntegerField()
    granted_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    renewal_seq = models.PositiveIntegerField(default=0)
    # How long each renewal (and each write, a heartbeat) extends the lease from the database's now.
    ttl = models.DurationField(null=True, blank=True)
    epoch = models.PositiveBigIntegerField()
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=16, choices=ReleaseReason.choices, blank=True)

    objects = LeaseQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "epoch"], name="lease_epoch_unique_per_task"),
            # Serves lease_acquire's race: two grants at once → one insert fails here.
            models.UniqueConstraint(
                fields=["task"], condition=Q(released_at__isnull=True), name="lease_one_open_per_task"
            ),
            models.CheckConstraint(condition=Q(epoch__gte=1), name="lease_epoch_positive"),
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("granted_at")), name="lease_expires_after_grant"
            ),
            models.CheckConstraint(condition=Q(holder_kind__in=HolderKind.values), name="lease_holder_kind_valid"),
            models.CheckConstraint(
                condition=(
                    Q(released_at__isnull=True, release_reason="")
                    | Q(released_at__isnull=False) & ~Q(release_reason="")
                ),
                name="lease_release_has_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"lease task={self.task_id} epoch={self.epoch} {self.holder_kind}:{self.holder_id}"


class LeaseReservation(models.Model):
    """A person asked to take the task over while an agent held it: nobody else may be granted the lease
    until this operator claims it (or withdraws). At most one per task."""

    task = models.OneToOneField("tasks.Task", on_delete=models.CASCADE, related_name="lease_reservation")
    holder_id = models.CharField(max_length=200)
    requested_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"reservation of task {self.task_id} for operator:{self.holder_id}"


class ReviewStatus(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    DISPUTED = "disputed"


class ForcedRelease(models.Model):
    """An admin removed a lease holder. Lands in a review queue; another admin accepts or disputes it."""

    lease = models.OneToOneField(Lease, on_delete=models.PROTECT, related_name="forced_release")
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="forced_releases")
    forced_by = models.CharField(max_length=200)
    # The account itself, so a renamed admin is still the one who forced it.
    forced_by_user = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    forced_at = models.DateTimeField()
    justification = models.TextField()
    impact = models.TextField()
    removed_holder = models.CharField(max_length=220)
    epoch = models.PositiveBigIntegerField()
    task_version = models.PositiveBigIntegerField()
    open_operations = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=10, choices=ReviewStatus.choices, default=ReviewStatus.PENDING)
    reviewed_by = models.CharField(max_length=200, blank=True)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_note = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ReviewStatus.values), name="forced_release_status_valid"),
            models.CheckConstraint(
                condition=Q(status=ReviewStatus.PENDING, reviewed_at__isnull=True)
                | (~Q(status=ReviewStatus.PENDING) & Q(reviewed_at__isnull=False) & ~Q(reviewed_by="")),
                name="forced_release_review_complete",
            ),
            models.CheckConstraint(
                condition=~Q(reviewed_by=models.F("forced_by")), name="forced_release_reviewed_by_another"
            ),
        ]
        indexes = [
            # Serves the admins' review queue.
            models.Index(fields=["status", "forced_at"], name="forced_release_queue_idx"),
        ]

    def __str__(self) -> str:
        return f"forced release of {self.removed_holder} on task {self.task_id} ({self.status})"


class BeatLease(models.Model):
    """The right to send the periodic messages (Celery beat): held by one beat process at a time, until
    ``expires_at`` on the database's clock, renewed while it runs (leases/beat.py). ``holder`` is empty when the
    last holder gave it back; ``epoch`` grows by one with every grant to a new holder."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=200, blank=True)
    epoch = models.PositiveBigIntegerField(default=0)
    granted_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"beat lease {self.name}: {self.holder or 'free'} (epoch {self.epoch})"
