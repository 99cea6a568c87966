"""Agent API tokens: issue, revoke (admins only, audited in the same transaction) and authenticate.

A token is 32 random bytes, URL-safe base64, prefixed ``rk_`` so that a leaked one is recognisable. Only its
SHA-256 is stored, in a unique indexed column: a request's token is found by its hash, so the comparison is the
index lookup's, not a character-by-character compare in Python."""

import hashlib
import secrets
from collections.abc import Sequence
from datetime import timedelta
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from api.http import KindNotFound
from api.models import ApiToken, TaskRead
from audit.principals import Principal
from audit.services import audit_append
from leases import clock
from leases.models import HolderKind, Lease
from tasks import rows
from tasks.access.permissions import require_admin
from tasks.core.errors import TaskNotFound
from tasks.core.parsing import ascii_int
from tasks.models import Task

TOKEN_PREFIX = "rk_"  # noqa: S105 (a prefix that marks a token, not a secret)
NAME_MAX = 100  # a kind or a project: tasks.models.Task's columns
SCOPE_MAX = 50  # entries in kinds or projects
# last_used_at is a hint, not a log: written at most once a minute per token, not on every request.
LAST_USED_GRANULARITY = timedelta(minutes=1)


class TokenError(Exception):
    """A refused token change. Not a TaskError: the console says it in its own words (str), not by code."""

    code = "token_error"


class TokenNotFound(TokenError):
    code = "token_not_found"


class TokenRefused(TokenError):
    """An issue or revocation that does not make sense: a bad scope, an agent id missing, a token already revoked."""

    code = "token_refused"


def token_hash(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def api_token_issue(
    *, actor: Principal, agent_id: str, kinds: Sequence[str], projects: Sequence[str], name: str = ""
) -> tuple[ApiToken, str]:
    """A new token for ``agent_id`` scoped to ``kinds`` and ``projects``, and its plaintext — the only time it
    exists outside the agent. Admins only; audited."""
    require_admin(actor, "issue agent API tokens")
    agent_id, kinds, projects = agent_id.strip(), _scope(kinds), _scope(projects)
    if not agent_id or len(agent_id) > 200:
        raise TokenRefused("an agent id is 1 to 200 characters")
    if not kinds and not projects:
        raise TokenRefused("a token needs at least one task kind or project in its scope")
    name = name.strip()[:200]
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        now = clock.now()
        row = ApiToken.objects.create(
            agent_id=agent_id,
            name=name,
            token_hash=token_hash(plaintext),
            kinds=kinds,
            projects=projects,
            created_by=str(actor),
            created_at=now,
        )
        audit_append(
            actor=actor,
            action="api_token_issued",
            at=now,
            # The name is recorded with the rest, and so passes the audit's hygiene: a credential pasted into it is
            # refused before any row is written.
            details={"token": row.pk, "agent": agent_id, "name": name, "kinds": kinds, "projects": projects},
        )
    return row, plaintext


def api_token_revoke(*, actor: Principal, token_id: int, reason: str) -> ApiToken:
    """Revoke the token: every later request with it is refused (401). Admins only; audited; a compare-and-set on
    "not yet revoked", so two admins revoking at once write one revocation."""
    require_admin(actor, "revoke agent API tokens")
    reason = reason.strip()
    if not reason:
        raise TokenRefused("say why the token is revoked")
    with transaction.atomic():
        now = clock.now()
        changed = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=str(actor), revoke_reason=reason[:500]
        )
        if changed != 1:
            if ApiToken.objects.filter(pk=token_id).exists():
                raise TokenRefused(f"token {token_id} is already revoked")
            raise TokenNotFound(f"token {token_id} does not exist")
        row = ApiToken.objects.get(pk=token_id)
        audit_append(
            actor=actor,
            action="api_token_revoked",
            at=now,
            reason=reason[:500],
            details={"token": row.pk, "agent": row.agent_id},
        )
    return row


def api_token_authenticate(
    plaintext: str, *, task_id: int | None = None, lease_id: int | None = None
) -> ApiToken | None:
    """The live token whose plaintext this is, or None (unknown or revoked). One query; and at most once a minute
    per token, one more to note when it was last used. ``task_id``: the task a request addresses, whose kind and
    project (what ``require_scope`` judges) are read in the same query; ``lease_id``: the lease the request names,
    read with them if it is this agent's lease on that task — both as the token's ``task_read``."""
    if not plaintext.startswith(TOKEN_PREFIX) or len(plaintext) > 100:
        return None
    lease_of = lease_id if task_id is not None else None
    with connection.cursor() as cursor:
        cursor.execute(_token_sql(), [task_id, lease_of, HolderKind.AGENT.value, token_hash(plaintext)])
        found = cursor.fetchone()
    if found is None:
        return None
    columns = rows.Columns.of(ApiToken)
    row = columns.instance(found)
    if task_id is not None:
        kind, project, lease_pk, epoch, ttl = found[len(columns.fields) :]
        lease = _lease(lease_pk, task_id, row.agent_id, epoch, ttl) if lease_pk is not None else None
        row.task_read = TaskRead(task_id, kind, project or "", lease_of, lease)
    now = timezone.now()  # the app server's clock: a hint, and the database clock would cost a query per request
    if row.last_used_at is None or row.last_used_at <= now - LAST_USED_GRANULARITY:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row


def _lease(lease_id: int, task_id: int, agent_id: str, epoch: int, ttl: Any) -> Lease:
    """The lease read with the token: its id, task, holder, epoch and ttl loaded (what a step's write uses; any other
    field is read when first used), as the ORM reads them (the ttl in microseconds on SQLite)."""
    known = {"id": lease_id, "task_id": task_id, "holder_kind": HolderKind.AGENT.value, "holder_id": agent_id}
    return rows.Columns.of(Lease).loaded(known | {"epoch": epoch, "ttl": ttl})


@cache
def _token_sql() -> str:
    """The live token by its hash, with the kind and project of the task whose id is the first parameter (null for
    none) and the lease whose id is the second if the token's agent holds it on that task: SQL made once (the ORM
    compiled the query again on every request, at more CPU than the query)."""
    token, task, lease = ApiToken._meta, Task._meta, Lease._meta
    q = connection.ops.quote_name
    return (
        f"SELECT {rows.Columns.of(ApiToken).columns('k')}, t.{q('kind')}, t.{q('project')},"  # noqa: S608
        f" l.{q('id')}, l.{q('epoch')}, l.{q('ttl')}"
        f" FROM {q(token.db_table)} k LEFT JOIN {q(task.db_table)} t ON t.{q('id')} = %s"
        f" LEFT JOIN {q(lease.db_table)} l ON l.{q('id')} = %s AND l.{q('task_id')} = t.{q('id')}"
        f" AND l.{q('holder_kind')} = %s AND l.{q('holder_id')} = k.{q('agent_id')}"
        f" WHERE k.{q('token_hash')} = %s AND k.{q('revoked_at')} IS NULL"
    )


def api_token_list() -> list[ApiToken]:
    """Every token, newest first (the admin page): one query."""
    return list(ApiToken.objects.all())


def scope_condition(token: ApiToken) -> Q:
    """The tasks the token's agent may see: its kinds or its projects (neither: none)."""
    condition = Q(pk__in=[])
    if token.kinds:
        condition |= Q(kind__in=token.kinds)
    if token.projects:
        condition |= Q(project__in=token.projects)
    return condition


def require_scope(token: ApiToken, raw_task_id: str) -> None:
    """The scope rule of every task-addressed route (api/auth.py runs it before anything else): the task the path
    names must be in the token's scope. A task outside it is answered exactly as a task that does not exist
    (TaskNotFound, the same detail), so a token learns nothing of tasks it may not see. A path value that is not a
    number is left to the route's own validation, a negative one names no task, and one past any column is left to
    the guard every API request passes (api/urls.py): the same answer for every token. One query, by primary key —
    none when the token was read with this task's kind and project (``api_token_authenticate(…, task_id=…)``)."""
    task_id = ascii_int(raw_task_id)
    if task_id is None:
        if raw_task_id.startswith("-") and ascii_int(raw_task_id[1:]) is not None:  # a number no task has
            raise TaskNotFound(f"task {raw_task_id} does not exist")
        return
    read = token.task_read
    if read is not None and read.task_id == task_id:
        row = (read.kind, read.project) if read.kind is not None else None
    else:
        row = Task.objects.filter(pk=task_id).values_list("kind", "project").first()
    if row is None or not covers(token.kinds, token.projects, kind=row[0], project=row[1] or ""):
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)


def require_kind_scope(token: ApiToken, kind: str) -> None:
    """The scope rule of a route that names a task kind (api/auth.py runs it before anything else): the token may
    create tasks of it — the kind is in its kinds, or it has projects (a task of any kind in one of them). A kind
    outside the scope is answered exactly as one no task can be of (empty, or longer than the column): KindNotFound,
    the same detail, so a token learns nothing of the kinds it may not use."""
    if not 0 < len(kind) <= NAME_MAX or not (kind in token.kinds or token.projects):
        raise KindNotFound(f"no task kind {kind[:NAME_MAX]!r} here")


def scope_covers(kinds: Sequence[str], projects: Sequence[str], task: Task) -> bool:
    """Whether a scope of ``kinds`` and ``projects`` covers ``task`` (the webhook outbox reads the scopes without
    the tokens)."""
    return covers(kinds, projects, kind=task.kind, project=task.project)


def covers(kinds: Sequence[str], projects: Sequence[str], *, kind: str, project: str) -> bool:
    """The one definition of a scope: a task is in it by its kind, or by its project (a task without a project is
    in no project's scope)."""
    return kind in kinds or (bool(project) and project in projects)


def _scope(names: Sequence[str]) -> list[str]:
    cleaned = sorted({n.strip() for n in names if n.strip()})
    if len(cleaned) > SCOPE_MAX or any(len(n) > NAME_MAX for n in cleaned):
        raise TokenRefused(f"a scope lists at most {SCOPE_MAX} names of at most {NAME_MAX} characters")
    return cleaned


def token_tasks(token: ApiToken) -> "QuerySet[Task]":
    """The tasks in the token's scope (page them with tasks.reads.queries.page)."""
    return Task.objects.filter(scope_condition(token))
