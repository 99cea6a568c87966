"""Who may open a console page: every view asks here, never a template. Logged out, the login page (Django's
LoginRequiredMiddleware); logged in without a Reckon role, 403 everywhere; a task the user may not see, 404 (its
existence is not disclosed); a task they may see but not operate, 403 on every action.

The user's roles are read once per request (tasks.access.permissions.roles_of caches them on the request's user object),
so a page that checks several times, and the task lists filtered by viewable_condition, ask the database once."""

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from audit.principals import Principal
from tasks.access.permissions import ADMIN, AUDITOR, can_operate, can_view, roles_of
from tasks.models import Task


def principal(request: HttpRequest) -> Principal:
    return Principal.of_user(request.user)


def request_roles(request: HttpRequest) -> frozenset[str]:
    """The Reckon roles of the request's user: one query the first time, none after."""
    return roles_of(request.user)


def require_console_role(request: HttpRequest) -> Principal:
    """The request's principal, if they hold a Reckon role (operator, admin or auditor); 403 otherwise."""
    if not request_roles(request):
        raise PermissionDenied("You have no Reckon role yet: ask an admin to make you an operator or an auditor.")
    return principal(request)


def require_admin_role(request: HttpRequest) -> Principal:
    if ADMIN not in request_roles(request):
        raise PermissionDenied("Only admins may do this.")
    return principal(request)


def require_audit_reader(request: HttpRequest) -> Principal:
    """Admins and auditors read the audit log and the review queue."""
    if not request_roles(request) & {ADMIN, AUDITOR}:
        raise PermissionDenied("Only admins and auditors may read the audit log and the reviews.")
    return principal(request)


def viewable_task(request: HttpRequest, task_id: int) -> Task:
    """The task, if the request's user may see it; 404 otherwise (whether it exists or not)."""
    who = require_console_role(request)
    task = Task.objects.filter(pk=task_id).first()
    if task is None or not can_view(who, task):
        raise Http404("No such task, or you may not see it.")
    return task


def operable_task(request: HttpRequest, task_id: int) -> Task:
    """The task, if the request's user may operate it; 404 if they may not see it, 403 if they only see it.
    One object-permission check when they may operate it (can_view of an operator asks can_operate again)."""
    who = require_console_role(request)
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise Http404("No such task, or you may not see it.")
    if can_operate(who, task):
        return task
    if not can_view(who, task):
        raise Http404("No such task, or you may not see it.")
    raise PermissionDenied("You may see this task but not operate it: ask an admin for a grant.")
