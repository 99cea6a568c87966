"""Operator notes on a task: a small form, HTMX-friendly, with a plain page behind it. A note is an
audit row (tasks/people/notes.py): the detail page's timeline shows it, the queue counts it."""

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import path, reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods

from audit.errors import Refused
from console.access import operable_task, principal
from console.errors import message_for
from console.forms.bulk import NoteForm
from tasks.access.permissions import PermissionDenied as ServiceDenied
from tasks.models import Task
from tasks.people.notes import task_note_add, task_notes


def _htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def _render(request: HttpRequest, task: Task, form: NoteForm, status: int = 200, **extra: Any) -> HttpResponse:
    context = {"task": task, "form": form, "notes": task_notes(task), **extra}
    template = "console/notes/notes.html#panel" if _htmx(request) else "console/notes/notes.html"
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_http_methods(["GET", "HEAD", "POST"])
def task_notes_page(request: HttpRequest, task_id: int) -> HttpResponse:
    """GET: the task's notes and the form. POST: add one (HTMX: the panel again, with the new note on top)."""
    task = operable_task(request, task_id)
    if request.method != "POST":
        return _render(request, task, NoteForm())
    form = NoteForm(request.POST)
    if not form.is_valid():
        return _render(request, task, form, 400)
    try:
        task_note_add(actor=principal(request), task_id=task.pk, text=form.cleaned_data["text"])
    except Refused as refused:
        return _render(
            request, task, form, 403 if isinstance(refused, ServiceDenied) else 400, error=message_for(refused)
        )
    if _htmx(request):
        return _render(request, task, NoteForm(), added=True)
    messages.success(request, f"Note added to task {task.pk}.")
    return HttpResponseRedirect(reverse("task-notes", args=[task.pk]), status=303)


urlpatterns = [
    path("tasks/<id:task_id>/notes/", task_notes_page, name="task-notes"),
]
