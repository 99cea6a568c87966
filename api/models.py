"""Agent API tokens: the plaintext is shown once when issued and never stored; only its SHA-256 is kept."""

from dataclasses import dataclass

from django.db import models

from leases.models import Lease


@dataclass(frozen=True)
class TaskRead:
    """What a request's token was read with (api.tokens.api_token_authenticate): the task its path names — its kind
    and project, or ``kind`` None when there is no such task — and the lease its ``Reckon-Lease`` names (``lease_id``;
    ``lease`` None when that is not a lease of the token's agent on this task)."""

    task_id: int
    kind: str | None
    project: str
    lease_id: int | None
    lease: Lease | None


class ApiToken(models.Model):
    """One agent's credential for /api/v1/. A task is in its scope when its kind is in ``kinds`` or its project is
    in ``projects``; both empty: no task at all."""

    agent_id = models.CharField(max_length=200)
    name = models.CharField(max_length=200, blank=True)
    # The lookup of every API request: the hash of the presented token, unique (so an index).
    token_hash = models.CharField(max_length=64, unique=True)
    kinds = models.JSONField(default=list, blank=True)
    projects = models.JSONField(default=list, blank=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True)
    revoke_reason = models.CharField(max_length=500, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    # Not a column: what this request's authentication read with the token (None: nothing; api.tokens).
    task_read: TaskRead | None = None

    class Meta:
        ordering = ("-created_at", "-pk")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(revoked_at__isnull=True) | ~models.Q(revoked_by=""),
                name="api_token_revoked_names_who",
            ),
        ]

    def __str__(self) -> str:
        return f"token {self.pk} of agent {self.agent_id}"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class IdempotencyRecord(models.Model):
    """The first successful answer to a POST that carried an ``Idempotency-Key``, bound to the token that made it:
    the same key and request again *with that token* gets this answer again; the same key with another request is
    refused; the same key with another token — even one of the same agent — is a key that token has not used (its
    request runs as a new one, and this answer is never shown to it). Written in the transaction of the change it
    answers (api/idempotency.py), so a change and its record commit or roll back together."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="+")
    agent_id = models.CharField(max_length=200)  # the token's agent, for a person reading the table
    key = models.CharField(max_length=200)
    # SHA-256 of the method, the path and the body: what "the same request" means.
    fingerprint = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField()
    body = models.TextField()
    headers = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "key"], name="idempotency_key_unique_per_token"),
            models.CheckConstraint(condition=models.Q(status__gte=200, status__lt=300), name="idempotency_success"),
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created_idx")]

    def __str__(self) -> str:
        return f"idempotency key {self.key!r} of token {self.token_id} (agent {self.agent_id})"
