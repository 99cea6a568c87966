import uuid
from datetime import datetime

from django.db import connection, models
from django.db.models import Q

from tasks.models import Task


class RetainedKind(models.TextChoices):
    SENSITIVE_INPUT = "sensitive_input"  # model context, material the agent needs
    DEBUG_ARTIFACT = "debug_artifact"  # model outputs, tool responses: minimal fields only
    TEMP_MATERIAL = "temp_material"


class RetainedStatus(models.TextChoices):
    LIVE = "live"
    PURGING = "purging"  # a sweep owns it: its file is being removed
    PURGED = "purged"  # the file is gone; the row stays as the record


class RetainedObjectQuerySet(models.QuerySet["RetainedObject"]):
    def live(self, now: datetime) -> "RetainedObjectQuerySet":
        """What can still be read (and extended) at ``now``."""
        return self.filter(status=RetainedStatus.LIVE, expires_at__gt=now)

    def due(self, now: datetime) -> "RetainedObjectQuerySet":
        """What a sweep must finish: expired live objects, and purges a crashed sweep left half-way."""
        return self.filter(Q(status=RetainedStatus.LIVE, expires_at__lte=now) | Q(status=RetainedStatus.PURGING))

    def claimable(self) -> "RetainedObjectQuerySet":
        """Rows another sweeper is claiming right now are skipped, not waited for (PostgreSQL). SQLite
        serialises writers with IMMEDIATE transactions, and the conditional UPDATEs decide there."""
        if connection.features.has_select_for_update_skip_locked:
            return self.select_for_update(skip_locked=True, of=("self",))
        return self


class RetainedObject(models.Model):
    """A sensitive input, debug artifact or temp material of one task, sealed on disk with an expiry.

    The ciphertext lives at ``<data>/retention/<task uid>/<uid>-v<version>.bin``, written before this row;
    checkpoints hold only ``{"retained": id, "version": n}``. Purging removes the file and keeps the row.
    """

    # Names the file, so the file can be written before the row exists.
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # PROTECT: the record of what a task retained, and when it was purged, outlives no task silently.
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="retained_objects")
    kind = models.CharField(max_length=20, choices=RetainedKind.choices)
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    extended_count = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=10, choices=RetainedStatus.choices, default=RetainedStatus.LIVE)
    purge_started_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(null=True, blank=True)

    objects = RetainedObjectQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "name", "version"], name="retained_version_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="retained_version_positive"),
            models.CheckConstraint(condition=~Q(name=""), name="retained_name_not_empty"),
            models.CheckConstraint(condition=Q(kind__in=RetainedKind.values), name="retained_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=RetainedStatus.values), name="retained_status_valid"),
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="retained_sha256_hex"),
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("created_at")), name="retained_expires_after_creation"
            ),
            models.CheckConstraint(
                condition=Q(status=RetainedStatus.LIVE) | Q(purge_started_at__isnull=False),
                name="retained_purge_has_start",
            ),
            models.CheckConstraint(
                condition=(Q(status=RetainedStatus.PURGED) & Q(purged_at__isnull=False))
                | (~Q(status=RetainedStatus.PURGED) & Q(purged_at__isnull=True)),
                name="retained_purged_iff_time",
            ),
        ]
        indexes = [
            # Serves the sweep (RetainedObjectQuerySet.due): unpurged objects by expiry.
            models.Index(fields=["expires_at"], condition=Q(status__in=["live", "purging"]), name="retained_due_idx"),
        ]

    def __str__(self) -> str:
        return f"retained {self.kind} {self.name!r} v{self.version} of task {self.task_id} ({self.status})"
