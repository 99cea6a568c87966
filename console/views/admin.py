"""The admin and auditor pages: roles and scope grants (admins), the review queue of forced releases, the audit log
with its filters, CSV export and the last check of both logs (admins and auditors read; only admins act)."""

import csv
from collections.abc import Iterator
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.db import transaction
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.views.decorators.http import require_POST, require_safe

from audit.anchors import AnchorVerdict
from audit.errors import Refused
from audit.models import AuditEvent
from audit.queries import AuditFilter, audit_export, audit_page, latest_verification
from console.access import request_roles, require_admin_role, require_audit_reader
from console.errors import message_for
from console.forms.admin import (
    KNOWN_ACTIONS,
    AccountForm,
    AuditFilterForm,
    ReviewForm,
    RoleForm,
    ScopeForm,
    TaskGrantForm,
)
from tasks.access.accounts import account_create, account_password_reset, role_grant, role_revoke
from tasks.access.permissions import ADMIN, permission_grant, permission_revoke
from tasks.core.parsing import ascii_int
from tasks.jobs import verify_logs
from tasks.models import Task
from tasks.people.forced_release import forced_release_review
from tasks.people.oversight import (
    forced_releases_pending,
    forced_releases_reviewed,
    people_with_roles,
)

AUDIT_PAGE_SIZE = 50
PEOPLE_SHOWN = 200
RECENT_REVIEWS = 20
CSV_COLUMNS = ("seq", "at", "actor", "action", "task", "lease_epoch", "version_before", "version_after", "reason",
               "impact", "details", "digest")  # fmt: skip


# --- roles ------------------------------------------------------------------------------------------------------


@require_safe
def roles(request: HttpRequest) -> HttpResponse:
    require_admin_role(request)
    name = request.GET.get("name", "").strip()[:150]
    people, more = people_with_roles(name=name, limit=PEOPLE_SHOWN)
    context = {
        "people": people,
        "more": more,
        "name": name,
        "shown": PEOPLE_SHOWN,
        "role_form": RoleForm(),
        "account_form": AccountForm(),
        "scope_form": ScopeForm(),
    }
    return render(request, "console/admin/roles.html", context)


@require_POST
def role_grant_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = RoleForm(request.POST)
    if _valid(request, form):
        user, role = form.cleaned_data["username"], form.cleaned_data["role"]
        _act(request, lambda: role_grant(actor=who, user=user, role=role), f"{user.get_username()} is now {role}.")
    return redirect("roles")


@require_POST
def role_revoke_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = RoleForm(request.POST)
    if _valid(request, form):
        user, role = form.cleaned_data["username"], form.cleaned_data["role"]
        _act(request, lambda: role_revoke(actor=who, user=user, role=role), f"{user.get_username()} is no {role}.")
    return redirect("roles")


@require_POST
def scope_grant_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = ScopeForm(request.POST)
    if _valid(request, form):
        user, project, kind = (form.cleaned_data[k] for k in ("username", "project", "kind"))
        _act(
            request,
            lambda: permission_grant(actor=who, user=user, project=project.strip(), kind=kind.strip()),
            f"{user.get_username()} may now operate tasks of project {project}, kind {kind}.",
        )
    return redirect("roles")


@require_POST
def scope_revoke_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = ScopeForm(request.POST)
    if _valid(request, form):
        user, project, kind = (form.cleaned_data[k] for k in ("username", "project", "kind"))
        _act(
            request,
            lambda: permission_revoke(actor=who, user=user, project=project.strip(), kind=kind.strip()),
            f"{user.get_username()} no longer operates tasks of project {project}, kind {kind}.",
        )
    return redirect("roles")


@require_POST
def task_grant_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = TaskGrantForm(request.POST)
    if _valid(request, form) and (task := _task_named(request, form.cleaned_data["task"])):
        user = form.cleaned_data["username"]
        _act(
            request,
            lambda: permission_grant(actor=who, user=user, task=task),
            f"{user.get_username()} may now operate task {task.pk}.",
        )
    return redirect("roles")


@require_POST
def task_revoke_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = TaskGrantForm(request.POST)
    if _valid(request, form) and (task := _task_named(request, form.cleaned_data["task"])):
        user = form.cleaned_data["username"]
        _act(
            request,
            lambda: permission_revoke(actor=who, user=user, task=task),
            f"{user.get_username()} no longer operates task {task.pk}.",
        )
    return redirect("roles")


def _task_named(request: HttpRequest, task_id: int) -> Task | None:
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        messages.error(request, f"There is no task {task_id}.")
    return task


@require_POST
def account_create_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = AccountForm(request.POST)
    if not _valid(request, form):
        return redirect("roles")
    username, role = form.cleaned_data["username"].strip(), form.cleaned_data["role"]
    try:
        user, password = account_create(actor=who, username=username, role=role)
    except Refused as error:
        messages.error(request, message_for(error))
        return redirect("roles")
    return _password_shown(request, user, password, f"The account {username} was created, as {role}.")


@require_POST
def password_reset_view(request: HttpRequest, user_id: int) -> HttpResponse:
    who = require_admin_role(request)
    user = User.objects.filter(pk=user_id).first()
    if user is None:
        raise Http404("No such account.")
    try:
        password = account_password_reset(actor=who, user=user)
    except Refused as error:
        messages.error(request, message_for(error))
        return redirect("roles")
    return _password_shown(request, user, password, f"{user.get_username()} has a new password.")


def _password_shown(request: HttpRequest, user: User, password: str, done: str) -> HttpResponse:
    """The generated password, shown once on this answer (never put in a message or a session), never cached."""
    response = render(
        request, "console/admin/password_shown.html", {"account": user, "password": password, "done": done}
    )
    add_never_cache_headers(response)
    return response


# --- forced releases --------------------------------------------------------------------------------------------


@require_safe
def reviews(request: HttpRequest) -> HttpResponse:
    who = require_audit_reader(request)
    pending = list(forced_releases_pending())
    context = {
        "pending": pending,
        # The admin who forced a release is shown why they cannot review it (the service refuses them too).
        "own": {fr.pk for fr in pending if fr.forced_by_user_id == request.user.pk or fr.forced_by == str(who)},
        "reviewed": forced_releases_reviewed(RECENT_REVIEWS),
        "may_review": ADMIN in request_roles(request),
        "review_form": ReviewForm(),
    }
    return render(request, "console/admin/reviews.html", context)


@require_POST
def review(request: HttpRequest, forced_release_id: int) -> HttpResponse:
    who = require_admin_role(request)
    form = ReviewForm(request.POST)
    if _valid(request, form):
        verdict, note = form.cleaned_data["verdict"], form.cleaned_data["note"]
        _act(
            request,
            lambda: forced_release_review(actor=who, forced_release_id=forced_release_id, verdict=verdict, note=note),
            f"Forced release #{forced_release_id} {verdict}.",
        )
    return redirect("reviews")


# --- the audit log ----------------------------------------------------------------------------------------------


@require_safe
def audit_log(request: HttpRequest) -> HttpResponse:
    require_audit_reader(request)
    form = AuditFilterForm(request.GET)
    before = _cursor(request.GET.get("before"))
    rows: list[AuditEvent] = []
    next_before = None
    if form.is_valid():
        rows, next_before = audit_page(form.to_filter(), before=before, size=AUDIT_PAGE_SIZE)
    verification = latest_verification()
    context = {
        "form": form,
        "rows": rows,
        "next_query": _query(request, before=next_before) if next_before else None,
        "first_query": _query(request, before=None) if before is not None else None,
        "export_query": _query(request, before=None),
        "known_actions": KNOWN_ACTIONS,
        "verification": verification,
        "anchors": AnchorVerdict.from_json(verification.anchor_verdict) if verification else None,
        "may_verify": ADMIN in request_roles(request),
    }
    # A filter or a page asked by HTMX gets the results only; a history restore, the whole page.
    htmx: Any = getattr(request, "htmx", None)
    partial = "#results" if htmx and not htmx.history_restore_request else ""
    response = render(request, "console/admin/audit_log.html" + partial, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_safe
def audit_log_csv(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    require_audit_reader(request)
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponse("These filters are not valid: fix them on the audit log page.", status=400)
    response = StreamingHttpResponse(_csv_lines(form.to_filter()), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="reckon-audit.csv"'
    return response


@require_POST
def verify_now(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    username = request.user.get_username()
    transaction.on_commit(lambda: verify_logs.delay(username), robust=True)
    messages.success(request, f"Verification started by {who.id}: the result appears here when it is done.")
    return redirect("audit-log")


# --- helpers ----------------------------------------------------------------------------------------------------


def _valid(request: HttpRequest, form: Form) -> bool:
    if form.is_valid():
        return True
    for field, errors in form.errors.items():
        label = "" if field == "__all__" else f"{form.fields[field].label or field.capitalize()}: "
        messages.error(request, label + " ".join(str(error) for error in errors))
    return False


def _act(request: HttpRequest, action: Any, done: str) -> None:
    """Run one service call; its refusal becomes the message the person reads (and nothing was written)."""
    try:
        action()
    except Refused as error:
        messages.error(request, message_for(error))
    else:
        messages.success(request, done)


def _cursor(value: str | None) -> int | None:
    return ascii_int(value)


def _query(request: HttpRequest, *, before: int | None) -> str:
    query = request.GET.copy()
    query.pop("before", None)
    if before is not None:
        query["before"] = str(before)
    return query.urlencode()


class _Echo:
    def write(self, value: str) -> str:
        return value


def _cell(value: object) -> str:
    """A CSV cell a spreadsheet shows as text: a leading = + - @ would make it a formula (CSV injection)."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _csv_lines(which: AuditFilter) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for e in audit_export(which):
        row = (e.seq, e.at.isoformat(), f"{e.actor_kind}:{e.actor_id}", e.action, e.task_id, e.lease_epoch,
               e.version_before, e.version_after, e.reason, e.impact, e.details_text, e.digest)  # fmt: skip
        yield writer.writerow([_cell(value) for value in row])


urlpatterns = [
    path("roles/", roles, name="roles"),
    path("roles/grant/", role_grant_view, name="role-grant"),
    path("roles/revoke/", role_revoke_view, name="role-revoke"),
    path("roles/tasks/grant/", task_grant_view, name="task-grant"),
    path("roles/tasks/revoke/", task_revoke_view, name="task-revoke"),
    path("roles/accounts/", account_create_view, name="account-create"),
    path("roles/accounts/<id:user_id>/password/", password_reset_view, name="password-reset"),
    path("roles/scopes/grant/", scope_grant_view, name="scope-grant"),
    path("roles/scopes/revoke/", scope_revoke_view, name="scope-revoke"),
    path("reviews/", reviews, name="reviews"),
    path("reviews/<id:forced_release_id>/", review, name="review"),
    path("audit/", audit_log, name="audit-log"),
    path("audit/export.csv", audit_log_csv, name="audit-log-csv"),
    path("audit/verify/", verify_now, name="verify-logs"),
]
