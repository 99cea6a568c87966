"""The retention page of a task: its live retained objects (kind, name, version, expiry, extensions used) and the
form that keeps one longer, with a reason (``retention_extend``: bounded from creation, limited in number, audited).
Who may operate the task may; the view checks access itself (console/access.py), and the service again."""

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods

from audit.errors import Refused
from console.access import operable_task, principal
from console.errors import message_for
from console.forms.retention import RetentionExtendForm, chosen_token
from retention.queries import live_retained_for_task
from retention.services import Ref, retention_extend
from tasks.access.permissions import PermissionDenied as ServiceDenied
from tasks.models import Task

TEMPLATE = "console/retained/retained.html"


def _render(
    request: HttpRequest, task: Task, form: RetentionExtendForm, status: int = 200, **extra: Any
) -> HttpResponse:
    live = live_retained_for_task(task.pk)
    chosen = form["retained"].value() if form.is_bound else None
    objects = [
        {"live": item, "token": chosen_token(item.row.pk, item.row.version, item.row.extended_count)} for item in live
    ]
    context = {"task": task, "form": form, "objects": objects, "chosen": chosen, **extra}
    return render(request, TEMPLATE, context, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
def task_retained_page(request: HttpRequest, task_id: int) -> HttpResponse:
    """GET: the live objects and the form. POST: extend one; a refusal is said on the page, nothing written."""
    task = operable_task(request, task_id)
    if request.method != "POST":
        return _render(request, task, RetentionExtendForm())
    form = RetentionExtendForm(request.POST)
    if not form.is_valid():
        return _render(request, task, form, 400)
    retained_id, version, seen = form.cleaned_data["retained"]
    try:
        kept = retention_extend(
            actor=principal(request),
            ref=Ref(retained_id, version),
            until=form.cleaned_data["until"],
            reason=form.cleaned_data["reason"],
            task_id=task.pk,
            seen_extensions=seen,
        )
    except Refused as refused:
        status = 403 if isinstance(refused, ServiceDenied) else 400
        return _render(request, task, form, status, error=message_for(refused))
    messages.success(
        request,
        f"{kept.kind} “{kept.name}” v{kept.version} is kept until {kept.expires_at:%Y-%m-%d %H:%M} UTC "
        f"(extension {kept.extended_count}), audited with your reason.",
    )
    return HttpResponseRedirect(reverse("task-retained", args=[task.pk]), status=303)


urlpatterns = [
    path("tasks/<id:task_id>/retained/", task_retained_page, name="task-retained"),
]
