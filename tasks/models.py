import uuid
from typing import Any, NoReturn

from django.db import models
from django.db.models import Q

from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, PauseReason, TaskStatus, TempResourceStatus
from tasks.querysets import TaskQuerySet

type _Enum = type[TaskStatus | PauseReason | NodeStatus | OperationStatus | FailureClass]


def _choices(enum: _Enum) -> list[tuple[str, str]]:
    return [(member.value, member.value) for member in enum]


def _values(enum: _Enum) -> list[str]:
    return [member.value for member in enum]


class Task(models.Model):
    """The projection of one long job. ``version`` grows by one with every state change, and the event
    with ``seq == version`` records that change."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=100)
    title = models.CharField(max_length=200)
    project = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=20, choices=_choices(TaskStatus), default=TaskStatus.PENDING.value)
    status_reason = models.CharField(max_length=30, choices=_choices(PauseReason), blank=True)
    status_detail = models.CharField(max_length=500, blank=True)
    version = models.PositiveBigIntegerField(default=1)
    # The digest of the event at seq == version: the next append chains to it without reading the log.
    log_head = models.CharField(max_length=64, default="0" * 64)
    plan_version = models.PositiveIntegerField(default=0)
    input_refs = models.JSONField(default=dict, blank=True)
    attempt_budget = models.PositiveIntegerField()
    attempts_used = models.PositiveIntegerField(default=0)
    # Set when a person hands the task back: the agent re-reads its inputs' versions before anything new.
    inputs_recheck_required = models.BooleanField(default=False)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=200, blank=True)
    cancel_reason = models.CharField(max_length=500, blank=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = TaskQuerySet.as_manager()

    class Meta:
        permissions = [("operate_task", "Can take over, decide on and cancel this task")]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=_values(TaskStatus)), name="task_status_valid"),
            models.CheckConstraint(condition=Q(version__gte=1), name="task_version_positive"),
            models.CheckConstraint(
                condition=Q(status=TaskStatus.PAUSED, status_reason__in=_values(PauseReason))
                | (~Q(status=TaskStatus.PAUSED) & Q(status_reason="")),
                name="task_paused_iff_reason",
            ),
            models.CheckConstraint(
                condition=~Q(status=TaskStatus.QUARANTINED) | ~Q(status_detail=""), name="task_quarantine_has_detail"
            ),
            models.CheckConstraint(
                condition=Q(attempts_used__lte=models.F("attempt_budget")), name="task_attempts_within_budget"
            ),
            models.CheckConstraint(
                condition=Q(cancel_requested_at__isnull=True) | ~Q(status__in=["pending", "running", "backing_off"]),
                name="task_cancel_stops_running",
            ),
        ]
        indexes = [
            # Serves the recovery scan and the console's task list: tasks by status.
            models.Index(fields=["status", "updated_at"], name="task_status_idx"),
            # Serves the needs-attention queue (oldest change first) and page()'s keyset on updated_at.
            models.Index(fields=["updated_at", "id"], name="task_updated_idx"),
        ]

    def __str__(self) -> str:
        return f"task {self.pk} {self.kind} v{self.version} {self.status}"


class ProposalStatus(models.TextChoices):
    PROPOSED = "proposed"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class PlanRevision(models.Model):
    """Every plan ever proposed for a task. A model proposes; only the scheduler accepts."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="plan_revisions")
    number = models.PositiveIntegerField()
    document = models.JSONField()
    digest = models.CharField(max_length=71)
    proposed_by = models.CharField(max_length=200)
    proposed_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=ProposalStatus.choices, default=ProposalStatus.PROPOSED)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "number"], name="plan_revision_number_unique"),
            models.CheckConstraint(condition=Q(number__gte=1), name="plan_revision_number_positive"),
            models.CheckConstraint(condition=Q(status__in=ProposalStatus.values), name="plan_revision_status_valid"),
            models.CheckConstraint(
                condition=Q(status=ProposalStatus.PROPOSED, decided_at__isnull=True)
                | (~Q(status=ProposalStatus.PROPOSED) & Q(decided_at__isnull=False)),
                name="plan_revision_decided_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"plan {self.number} of task {self.task_id} ({self.status})"


class Node(models.Model):
    """One step of an accepted plan: one bounded side effect, confirmed by a receipt."""

    # No index of its own: node_key_unique_per_plan (task, plan_version, key) serves every lookup by task, and each
    # index is written again on every node update (two per step).
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="nodes", db_index=False)
    plan_version = models.PositiveIntegerField()
    key = models.CharField(max_length=100)
    position = models.PositiveIntegerField()
    action = models.CharField(max_length=100)
    depends_on = models.JSONField(default=list, blank=True)
    input = models.JSONField(default=dict, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    on_failure = models.JSONField(default=dict, blank=True)
    irreversible = models.BooleanField(default=False)
    compensation = models.CharField(max_length=100, blank=True)
    rerun = models.CharField(max_length=200, blank=True)
    definition_digest = models.CharField(max_length=71)
    status = models.CharField(max_length=12, choices=_choices(NodeStatus), default=NodeStatus.PENDING.value)
    max_attempts = models.PositiveIntegerField()
    attempts = models.PositiveIntegerField(default=0)
    last_error_class = models.CharField(max_length=30, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_allowed_action = models.CharField(max_length=30, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)
    output = models.JSONField(default=dict, blank=True)
    # An approval node's binding (tasks/decide/approval_binding.py): the request asked to be approved (its digest,
    # recorded by the event approval_proposed; cleared once approved) and the approval given — the digest of the
    # requests it permits ({gated node: request digest}), the plan revision it was given under, its expiry on the
    # database clock, the event that records it and who gave it. All five or none, on a succeeded node, by a person;
    # changed only by a later approval (a trigger, migration 0018). Empty on every other node.
    approval_proposed_digest = models.CharField(max_length=71, blank=True)
    approval_digest = models.CharField(max_length=71, blank=True)
    approval_requests = models.JSONField(default=dict, blank=True)
    approval_plan_version = models.PositiveIntegerField(null=True, blank=True)
    approval_expires_at = models.DateTimeField(null=True, blank=True)
    approval_seq = models.PositiveBigIntegerField(null=True, blank=True)
    approved_by = models.CharField(max_length=220, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "plan_version", "key"], name="node_key_unique_per_plan"),
            models.CheckConstraint(
                condition=Q(
                    approval_digest="",
                    approval_plan_version__isnull=True,
                    approval_expires_at__isnull=True,
                    approval_seq__isnull=True,
                    approved_by="",
                )
                | Q(
                    approval_digest__regex=r"^sha256:[0-9a-f]{64}$",
                    approval_plan_version__isnull=False,
                    approval_expires_at__isnull=False,
                    approval_seq__isnull=False,
                    approved_by__startswith="user:",
                    status=NodeStatus.SUCCEEDED.value,
                ),
                name="node_approval_binding_whole",
            ),
            models.CheckConstraint(
                condition=Q(approval_plan_version__isnull=True)
                | Q(approval_plan_version__lte=models.F("plan_version")),
                name="node_approval_not_ahead_of_its_plan",
            ),
            models.CheckConstraint(
                condition=Q(approval_proposed_digest="") | Q(approval_proposed_digest__regex=r"^sha256:[0-9a-f]{64}$"),
                name="node_approval_proposed_is_a_digest",
            ),
            models.CheckConstraint(condition=Q(status__in=_values(NodeStatus)), name="node_status_valid"),
            models.CheckConstraint(
                condition=Q(attempts__lte=models.F("max_attempts")), name="node_attempts_within_budget"
            ),
            models.CheckConstraint(condition=~Q(key=""), name="node_key_not_empty"),
        ]
        indexes = [
            # Serves the needs-attention queue's budget reason: a pending node that spent its attempts.
            models.Index(
                fields=["task", "plan_version"],
                condition=Q(status="pending", attempts__gte=models.F("max_attempts")),
                name="node_spent_idx",
            ),
            # Serves the needs-attention queue's awaiting-approval reason: pending nodes of the approval actions.
            models.Index(fields=["action", "status"], name="node_action_status_idx"),
        ]
        ordering = ["plan_version", "position"]

    def __str__(self) -> str:
        return f"node {self.key} of task {self.task_id} ({self.status})"


class OperationPurpose(models.TextChoices):
    EFFECT = "effect"  # a node's side effect: its receipt must satisfy the node's evidence spec
    COMPENSATION = "compensation"  # undoes a committed effect, started only by a person's explicit choice
    CLEANUP = "cleanup"  # deletes a temp resource once the task has ended (tasks/engine/cleanup.py)


class Operation(models.Model):
    """The execution record of one external write. The op key is stable across retries of the same intent."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="operations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="operations")
    op_key = models.CharField(max_length=200, unique=True)
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=300, blank=True)
    request = models.JSONField(default=dict)
    request_digest = models.CharField(max_length=71)
    status = models.CharField(max_length=12, choices=_choices(OperationStatus), default=OperationStatus.INTENT.value)
    failure_class = models.CharField(max_length=30, blank=True)
    failure_detail = models.CharField(max_length=500, blank=True)
    remote_id = models.CharField(max_length=200, blank=True)
    dispatch_count = models.PositiveIntegerField(default=0)
    registered_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)
    # The request's deadline (the database clock at its latest send + RECKON_REQUEST_DEADLINE), sent with it: a remote
    # that cannot fence refuses the request after it, and a "not found" is final only past it (plus the clock skew).
    not_after = models.DateTimeField(null=True, blank=True)
    # Indexed only where set (operation_compensates_idx): almost every operation compensates nothing.
    compensates = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="compensations", db_index=False
    )
    # Who settled it when a person did (takeover): "user:<name>"; empty when the remote's answer settled it.
    settled_by = models.CharField(max_length=220, blank=True)
    purpose = models.CharField(max_length=12, choices=OperationPurpose.choices, default=OperationPurpose.EFFECT)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=_values(OperationStatus)), name="operation_status_valid"),
            models.CheckConstraint(
                condition=~Q(status=OperationStatus.REJECTED) | ~Q(failure_class=""),
                name="operation_rejection_has_class",
            ),
            models.CheckConstraint(condition=~Q(op_key=""), name="operation_key_not_empty"),
            models.CheckConstraint(condition=Q(purpose__in=OperationPurpose.values), name="operation_purpose_valid"),
            models.CheckConstraint(
                condition=~Q(purpose=OperationPurpose.COMPENSATION) | Q(compensates__isnull=False),
                name="operation_compensation_names_its_effect",
            ),
        ]
        indexes = [
            models.Index(
                fields=["compensates"], condition=Q(compensates__isnull=False), name="operation_compensates_idx"
            ),
            # Serves next_directive / the reconciler: open operations of a task come first.
            models.Index(
                fields=["task", "status"],
                condition=Q(status__in=["dispatched", "accepted", "unknown"]),
                name="operation_open_idx",
            ),
            # Serves the metrics' failures and retries by class (observability/metrics.py): failed operations only.
            models.Index(fields=["failure_class"], condition=~Q(failure_class=""), name="operation_failure_idx"),
        ]

    def __str__(self) -> str:
        return f"op {self.op_key} ({self.status})"


class Receipt(models.Model):
    """What the external system says it committed. Immutable once written; the evidence of a side effect."""

    operation = models.OneToOneField(Operation, on_delete=models.PROTECT, related_name="receipt")
    remote_id = models.CharField(max_length=200)
    remote_version = models.CharField(max_length=100, blank=True)
    count = models.BigIntegerField(null=True, blank=True)
    digest = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict, blank=True)
    received_at = models.DateTimeField()
    committed_after_cancel_request = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(remote_id=""), name="receipt_has_remote_id"),
            models.CheckConstraint(
                condition=Q(count__isnull=True) | Q(count__gte=0), name="receipt_count_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"receipt {self.remote_id} for operation {self.operation_id}"


class EventRefused(Exception):
    """Events are append-only."""


class EventQuerySet(models.QuerySet["Event"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise EventRefused("events are append-only: no update")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise EventRefused("events are append-only: no delete")


class EventColumns(models.Model):
    """The columns of one event wherever it is kept: the hot table (``Event``), the archive (``ArchivedEvent``) and
    the view over both (``LoggedEvent``). ``seq`` is contiguous from 1 per task; ``digest`` chains it to the event
    before (``prev_digest``)."""

    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=50)
    payload = models.JSONField(default=dict)
    prev_digest = models.CharField(max_length=64)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"event {self.task_id}#{self.seq} {self.type}"  # type: ignore[attr-defined]

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise EventRefused("events are append-only: no delete")


class Event(EventColumns):
    """Append-only, hash-chained record of every state change of a task; ``seq`` is contiguous from 1.

    Updates and deletes are refused here and, in the database, by triggers (migration 0009), TRUNCATE included on
    PostgreSQL — a delete only lets go of a row with an identical copy in the archive (the archive step's move,
    migration 0022); the task row keeps the chain's head (``log_head``), so a cut tail is found by verify_log. This
    is where events are appended; read a task's log through ``LoggedEvent``."""

    # No index of its own: event_seq_unique_per_task (task, seq) serves every lookup by task.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events", db_index=False)

    objects = EventQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="event_seq_unique_per_task"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="event_seq_positive"),
        ]
        indexes = [
            # Serves the metrics' steps by outcome and quarantines (observability/metrics.py): events of a few types;
            # and one task's events of a type (a temp resource's resets, its receipts) without walking its whole log.
            models.Index(fields=["type", "task"], name="event_type_task_idx"),
        ]
        ordering = ["task", "seq"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise EventRefused("events are append-only: no update")
        super().save(*args, **kwargs)


class ArchivedEvent(EventColumns):
    """An event of an ended task moved out of the hot table by the archive step (tasks/engine/archive.py), as it was:
    the same id, seq, type, payload, digests and time; ``archived_at`` is the database clock at the move.

    Append-only like the hot table, in the database too (migration 0022): no update, no delete, no truncate. A hot
    event can be deleted only once an identical copy is here (the hot table's delete trigger checks every column).
    Read a task's log through ``LoggedEvent``, never here alone."""

    id = models.BigIntegerField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="archived_events", db_index=False)
    archived_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="archived_event_seq_unique_per_task"),
        ]
        indexes = [models.Index(fields=["type", "task"], name="archived_event_type_task_idx")]
        ordering = ["task", "seq"]

    def __str__(self) -> str:
        return f"archived event {self.task_id}#{self.seq} {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise EventRefused("archived events are written only by the archive step's INSERT … SELECT")


class ArchivedEventCount(models.Model):
    """How many events of each type the archive holds, kept by the archive step in the transaction that moves them
    (tasks/engine/archive.py): the metrics' counters add it to the hot table's counts instead of counting the
    archive's millions of rows at each scrape."""

    type = models.CharField(max_length=50, primary_key=True)
    events = models.PositiveBigIntegerField()

    def __str__(self) -> str:
        return f"{self.events} archived {self.type} events"


class LoggedEvent(EventColumns):
    """Every event of every task wherever it is kept — the hot table (``Event``, where appends go) and the archive
    (``ArchivedEvent``) — as one read-only database view (UNION ALL, migration 0022). The one way to read a task's
    log: a read that filters by task reaches both tables through their (task, seq) indexes."""

    id = models.BigIntegerField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False)

    class Meta:
        managed = False
        db_table = "tasks_event_log"
        ordering = ["task", "seq"]

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise EventRefused("the log is read here; an event is appended by the compare-and-set (tasks.engine.cas)")


class TempResource(models.Model):
    """Something a task created that must be cleaned up; cleanup is an operation with its own receipt."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="temp_resources")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT, related_name="temp_resources")
    locator = models.CharField(max_length=500)
    status = models.CharField(max_length=10, choices=TempResourceStatus.choices, default=TempResourceStatus.ACTIVE)
    created_at = models.DateTimeField()
    retention_until = models.DateTimeField()
    # After a temporary refusal of its delete (dependency_unavailable): no delete is sent before this moment
    # (database clock; tasks.core.failures.backoff, the rule a node's retry follows). Spends no attempt.
    not_before = models.DateTimeField(null=True, blank=True)
    cleanup_operation = models.OneToOneField(
        Operation, null=True, blank=True, on_delete=models.PROTECT, related_name="cleaned_resource"
    )
    cleanup_receipt = models.OneToOneField(
        Receipt, null=True, blank=True, on_delete=models.PROTECT, related_name="cleaned_resource"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "locator"], name="temp_resource_unique_per_task"),
            models.CheckConstraint(
                condition=Q(status__in=TempResourceStatus.values), name="temp_resource_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status=TempResourceStatus.DELETED) | Q(cleanup_receipt__isnull=False),
                name="temp_resource_deleted_has_receipt",
            ),
            models.CheckConstraint(
                condition=Q(retention_until__gte=models.F("created_at")), name="temp_resource_retention_after_creation"
            ),
        ]
        indexes = [
            # Serves the recovery scan (ended tasks with resources left) and the metrics' cleanup backlog: the few
            # resources not deleted, found without reading the deleted ones of every finished task.
            models.Index(fields=["status", "task"], name="temp_resource_status_idx"),
        ]

    def __str__(self) -> str:
        return f"temp {self.locator} of task {self.task_id} ({self.status})"


class ScopeGrant(models.Model):
    """An operator may operate every task of a project, or of a kind (``*`` matches any). Object permissions
    (django-guardian) grant single tasks; both are granted and revoked by tasks.access.permissions, audited."""

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="reckon_scope_grants")
    project = models.CharField(max_length=100, default="*")
    kind = models.CharField(max_length=100, default="*")
    granted_by = models.CharField(max_length=200)
    granted_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project", "kind"], name="scope_grant_unique"),
            models.CheckConstraint(condition=~(Q(project="*") & Q(kind="*")), name="scope_grant_not_everything"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} operates project={self.project} kind={self.kind}"


class Attachment(models.Model):
    """A file a person attached as evidence to a takeover result, stored by its SHA-256 under the data folder."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attachments")
    node_key = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    uploaded_by = models.CharField(max_length=220)
    uploaded_at = models.DateTimeField()
    task_version = models.PositiveBigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="attachment_sha256_hex"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]}) for {self.node_key} of task {self.task_id}"


class BulkOperation(models.TextChoices):
    """The named operations a person applies to a filtered set of tasks (tasks/people/bulk.py), each through one
    service."""

    RESUME = "resume", "Resume the agent (it re-checks its inputs first)"
    CANCEL = "cancel", "Cancel"
    REQUEST_TAKEOVER = "request_takeover", "Request takeover"
    RELEASE = "release", "Release my takeover"


class BulkRunStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


class BulkItemStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    SKIPPED = "skipped"  # a rule said no, or the task moved since the preview: nothing was written to it
    FAILED = "failed"  # an unexpected error: nothing was written to it (its transaction rolled back)


class BulkRun(models.Model):
    """One confirmed bulk operation: who, what, why, on which filter. Its items are the tasks the preview said it
    would change, each with the version seen then."""

    operation = models.CharField(max_length=20, choices=BulkOperation.choices)
    actor = models.ForeignKey("auth.User", on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    filter_query = models.CharField(max_length=2000, blank=True)
    status = models.CharField(max_length=10, choices=BulkRunStatus.choices, default=BulkRunStatus.PENDING)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(operation__in=BulkOperation.values), name="bulk_run_operation_valid"),
            models.CheckConstraint(condition=Q(status__in=BulkRunStatus.values), name="bulk_run_status_valid"),
        ]

    def __str__(self) -> str:
        return f"bulk run {self.pk} {self.operation} ({self.status})"


class BulkRunItem(models.Model):
    """One task of a bulk run, as seen at the preview. ``task_id`` is a plain id, not a foreign key: a posted id
    that names no task (or one the person may not see) is recorded and skipped like any other refusal."""

    run = models.ForeignKey(BulkRun, on_delete=models.CASCADE, related_name="items")
    task_id = models.BigIntegerField()
    seen_version = models.PositiveBigIntegerField()
    seen_epoch = models.PositiveBigIntegerField(null=True, blank=True)  # the open lease's epoch at the preview
    status = models.CharField(max_length=10, choices=BulkItemStatus.choices, default=BulkItemStatus.PENDING)
    detail = models.CharField(max_length=500, blank=True)  # what was done, or why not
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "task_id"], name="bulk_item_one_per_task"),
            models.CheckConstraint(condition=Q(status__in=BulkItemStatus.values), name="bulk_item_status_valid"),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} of bulk run {self.run_id}: {self.status}"


class TaskWakeUp(models.Model):
    """A task's worker wake-ups, as the database knows them (tasks/engine/recovery.py; owned by the liveness work).

    ``queued_version``/``queued_until``: a wake-up for that version is on the broker until then, so nobody queues
    another (deduplication at enqueue). The wake-up clears it when it runs; a lost message stops blocking at
    ``queued_until`` (the message's own expiry), so the recovery scan still makes it good.
    ``remote_down_*``: the task's remote could not be reached that many times in a row, since then; it is asked
    again no earlier than ``remote_next_ask_at`` (tasks.core.failures.backoff: growing, jittered, capped)."""

    task = models.OneToOneField(Task, on_delete=models.CASCADE, primary_key=True, related_name="wake_up")
    queued_version = models.PositiveBigIntegerField(null=True, blank=True)
    queued_until = models.DateTimeField(null=True, blank=True)
    remote_down_tries = models.PositiveIntegerField(default=0)
    remote_down_since = models.DateTimeField(null=True, blank=True)
    remote_next_ask_at = models.DateTimeField(null=True, blank=True)
    # Counters for the metrics (observability/metrics.py: read from the database, as every process writes here):
    # wake-ups queued for this task (claims taken for a message) and wake-ups refused at enqueue because one for
    # the same version was on the broker already (deduplicated). Bumped in the claim's own statement.
    queued_count = models.PositiveBigIntegerField(default=0)
    deduplicated_count = models.PositiveBigIntegerField(default=0)

    class Meta:
        indexes = [
            # Serve the recovery scan's "a wake-up is queued" and "its remote is resting" (tasks.engine.recovery): the
            # few
            # live claims and outages, not a row per task ever woken.
            models.Index(fields=["queued_until"], condition=Q(queued_until__isnull=False), name="wake_up_queued_idx"),
            models.Index(
                fields=["remote_next_ask_at"], condition=Q(remote_next_ask_at__isnull=False), name="wake_up_resting_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"wake-ups of task {self.task_id}"

    @property
    def remote_down_detail(self) -> str:
        """What the console and the API show while a remote stays down ("" when it answers)."""
        if not self.remote_down_tries or self.remote_down_since is None or self.remote_next_ask_at is None:
            return ""
        return (
            f"remote unreachable since {self.remote_down_since:%Y-%m-%d %H:%M:%S} UTC ({self.remote_down_tries} tries);"
            f" next try at {self.remote_next_ask_at:%H:%M:%S} UTC"
        )
