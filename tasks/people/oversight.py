"""What admins and auditors oversee: the forced releases waiting for review, and the check of both logs (the audit
chain and every task's event log) run on request and recorded, so the console shows the last result cheaply."""

from dataclasses import dataclass

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import Prefetch, QuerySet
from guardian.conf import settings as guardian_settings
from guardian.models import UserObjectPermission

from audit.anchors import anchors_verify
from audit.models import VerificationRun
from audit.principals import Principal
from audit.services import audit_append, verify_audit
from leases import clock
from leases.models import ForcedRelease, ReviewStatus
from tasks.access.permissions import ROLES, require_admin, task_grants_condition
from tasks.engine.verification import missing_event_triggers, task_verify_log
from tasks.models import ScopeGrant, Task

MAX_LISTED_PROBLEMS = 50  # problems kept on the run's row; the count is always complete


def forced_releases_pending() -> QuerySet[ForcedRelease]:
    """Forced releases no admin has reviewed yet, oldest first (they wait longest)."""
    return ForcedRelease.objects.filter(status=ReviewStatus.PENDING).select_related("task").order_by("forced_at", "pk")


def forced_releases_reviewed(limit: int) -> list[ForcedRelease]:
    """The ``limit`` most recently reviewed forced releases, newest review first."""
    rows = ForcedRelease.objects.exclude(status=ReviewStatus.PENDING).select_related("task")
    return list(rows.order_by("-reviewed_at", "-pk")[:limit])


def logs_verify(*, actor: Principal) -> VerificationRun:
    """An admin checks both logs now: the audit chain (verify_audit) and every task's event log (task_verify_log,
    which quarantines a task whose record fails, as ``manage.py verify_log`` does). Records the run and what it found,
    and audits who ran it. One task's broken record never stops the others being checked."""
    require_admin(actor, "verify the logs")
    started = clock.now()
    audit = verify_audit()
    # Before the tasks are walked: a task quarantined below for a cut writes an event of its own at the seq the
    # checkpoint anchored, and the anchors would then call the cut a rewrite.
    anchors = anchors_verify()
    checked = failed = quarantined = 0
    problems: list[dict[str, object]] = []
    for task_id in Task.objects.order_by("pk").values_list("pk", flat=True).iterator(chunk_size=2000):
        checked += 1
        try:
            verdict = task_verify_log(task_id=task_id, quarantine=True)
            problem, now_quarantined = verdict.problem, verdict.quarantined_now
        except Exception as error:  # a record that breaks the checker is a finding, not a crash
            problem, now_quarantined = f"verification failed: {type(error).__name__}: {error}", False
        if problem:
            failed += 1
            quarantined += now_quarantined
            if len(problems) < MAX_LISTED_PROBLEMS:
                problems.append({"task": task_id, "problem": problem, "quarantined": now_quarantined})
    missing = missing_event_triggers()
    with transaction.atomic():
        finished = clock.now()
        run = VerificationRun.objects.create(
            started_at=started,
            finished_at=finished,
            run_by=str(actor),
            audit_checked=audit.checked,
            audit_problem=audit.problem or "",
            tasks_checked=checked,
            tasks_with_problems=failed,
            tasks_quarantined=quarantined,
            task_problems=problems,
            event_triggers_missing=missing,
            anchor_verdict=anchors.as_json(),
        )
        audit_append(
            actor=actor,
            action="logs_verified",
            at=finished,
            details={
                "run": run.pk,
                "audit_checked": audit.checked,
                "audit_problem": audit.problem,
                "tasks_checked": checked,
                "tasks_with_problems": failed,
                "tasks_quarantined": quarantined,
                "anchors": anchors.state,
            },
        )
    return run


@dataclass(frozen=True)
class PersonRoles:
    user: User
    roles: list[str]
    scopes: list[ScopeGrant]
    tasks: list[int]  # the single tasks granted (django-guardian object permissions to the user)


def people_with_roles(*, name: str = "", limit: int = 200) -> tuple[list[PersonRoles], bool]:
    """Accounts whose user name contains ``name`` (all when empty), by user name, at most ``limit``, with their
    Reckon roles, scope grants and single-task grants — four queries, whatever the count — and whether more
    matched. django-guardian's stand-in for anonymous visitors is no account a person uses, and is left out."""
    users = User.objects.exclude(username=guardian_settings.ANONYMOUS_USER_NAME).order_by("username")
    if name:
        users = users.filter(username__icontains=name)
    users = users.prefetch_related(
        Prefetch("groups", queryset=Group.objects.filter(name__in=ROLES), to_attr="reckon_roles"),
        Prefetch("reckon_scope_grants", queryset=ScopeGrant.objects.order_by("project", "kind"), to_attr="scopes"),
        Prefetch(
            "userobjectpermission_set",
            queryset=UserObjectPermission.objects.filter(**task_grants_condition()).only("user_id", "object_pk"),
            to_attr="task_grants",
        ),
    )
    found = list(users[: limit + 1])
    rows = []
    for user in found[:limit]:
        held = {group.name for group in user.reckon_roles}
        tasks = sorted(int(grant.object_pk) for grant in user.task_grants)
        rows.append(PersonRoles(user, [role for role in ROLES if role in held], user.scopes, tasks))
    return rows, len(found) > limit
