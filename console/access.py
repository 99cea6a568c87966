"""Who may open a console page: every view asks here, never a template. Logged out, the login page (Django's
LoginRequiredMiddleware); logged in without a Reckon role, 403 everywhere; a task the user may not see, 404 (its
existence is not disclosed); a task they may see but not operate, 403 on every action."""

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from audit.principals import Principal
from tasks.models import Task
from tasks.permissions import ADMIN, AUDITOR, OPERATOR, can_operate, can_view, has_role

ROLES = (OPERATOR, ADMIN, AUDITOR)


def principal(request: HttpRequest) -> Principal:
    return Principal.of_user(request.user)


def require_console_role(request: HttpRequest) -> Principal:
    """The request's principal, if they hold a Reckon role (operator, admin or auditor); 403 otherwise."""
    who = principal(request)
    if not any(has_role(who, role) for role in ROLES):
        raise PermissionDenied("You have no Reckon role: ask an admin to grant you operator, admin or auditor.")
    return who


def require_admin_role(request: HttpRequest) -> Principal:
    who = principal(request)
    if not has_role(who, ADMIN):
        raise PermissionDenied("Only admins may open this page.")
    return who


def require_audit_reader(request: HttpRequest) -> Principal:
    """Admins and auditors read the audit log."""
    who = principal(request)
    if not (has_role(who, ADMIN) or has_role(who, AUDITOR)):
        raise PermissionDenied("Only admins and auditors may read the audit log.")
    return who


def viewable_task(request: HttpRequest, task_id: int) -> Task:
    """The task, if the request's user may see it; 404 otherwise (whether it exists or not)."""
    who = require_console_role(request)
    task = Task.objects.filter(pk=task_id).first()
    if task is None or not can_view(who, task):
        raise Http404("No such task.")
    return task


def operable_task(request: HttpRequest, task_id: int) -> Task:
    """The task, if the request's user may operate it; 404 if they may not see it, 403 if they only see it."""
    task = viewable_task(request, task_id)
    if not can_operate(principal(request), task):
        raise PermissionDenied("You may see this task but not operate it.")
    return task
