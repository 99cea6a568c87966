"""The work queue ("/") and the needs-attention queue ("/attention/"): filters held in the URL, keyset pages, live
refresh of the rows by HTMX polling; and a person's saved views of them."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect, QueryDict
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HTMX_STOP_POLLING

from audit.principals import Principal
from console import present
from console.access import require_console_role
from console.forms.queue import QueueFilterForm, SavedViewForm, filter_query
from console.saved_views import (
    TooManySavedViews,
    saved_view_delete,
    saved_view_of,
    saved_view_save,
    saved_views_of,
)
from tasks.access.permissions import viewable_condition
from tasks.models import Task
from tasks.people.notes import with_note_count
from tasks.reads.detail import RemoteDown, remote_down_of_row
from tasks.reads.queries import InvalidCursor, Order, TaskFilter, attention_queue, attention_reasons, page, task_queue

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    from tasks.querysets import Overview, TaskQuerySet

PAGE_SIZE = 50
REFRESH_SECONDS = 10
BAD_CURSOR = (
    "This link to a page of tasks is not valid (it was altered or is from another list): start again from the "
    "first page."
)


@dataclass(frozen=True)
class Queue:
    url_name: str
    title: str
    order: Order
    select: Callable[[TaskFilter], "TaskQuerySet[WithAnnotations[Task, Overview]]"]
    empty: str


WORK = Queue("task-list", "Work queue", Order.NEWEST_FIRST, task_queue, "No task matches these filters.")
ATTENTION = Queue(
    "attention",
    "Needs attention",
    Order.OLDEST_CHANGE_FIRST,
    attention_queue,
    "No task needs a person right now.",
)


@dataclass(frozen=True)
class Reason:
    value: str
    shown: present.Presentation


@dataclass(frozen=True)
class TaskRow:
    task: Task
    badge: present.Badge
    attention: list[Reason]
    # The task's remote stays unreachable (read with the page: a join, no query per row).
    remote: RemoteDown | None = None


@require_safe
@vary_on_headers("HX-Request")
def task_list(request: HttpRequest) -> HttpResponse:
    return _queue(request, WORK)


@require_safe
@vary_on_headers("HX-Request")
def attention(request: HttpRequest) -> HttpResponse:
    return _queue(request, ATTENTION)


def _queue(request: HttpRequest, queue: Queue) -> HttpResponse:
    require_console_role(request)
    form = QueueFilterForm(request.GET)
    rows_only = _wants_rows(request)
    if not form.is_valid():
        return _render(request, queue, rows_only, {"form": form, "rows": [], "invalid": True}, status=400)
    task_filter = form.task_filter()
    after = request.GET.get("after") or None
    try:
        tasks, next_cursor = page(
            with_note_count(
                queue.select(task_filter).filter(viewable_condition(Principal.of_user(request.user)))
            ).select_related("wake_up"),
            after=after,
            size=PAGE_SIZE,
            order=queue.order,
        )
    except InvalidCursor:
        return HttpResponseBadRequest(BAD_CURSOR)
    context = {
        "form": form,
        "rows": [_row(task) for task in tasks],
        "next_cursor": next_cursor,
        "paged": after is not None,
        "filter_query": filter_query(request.GET),
        "polls": not task_filter.only_ended(),
    }
    # A page that can only ever show ended tasks does not change: the rows' poll is told to stop.
    return _render(request, queue, rows_only, context, status=200 if context["polls"] else HTMX_STOP_POLLING)


def _wants_rows(request: HttpRequest) -> bool:
    htmx: Any = getattr(request, "htmx", None)
    # A boosted link or a history restore swaps the whole page in: it gets the whole page.
    return bool(htmx) and not htmx.history_restore_request and not htmx.boosted


def _render(
    request: HttpRequest, queue: Queue, rows_only: bool, context: dict[str, Any], *, status: int
) -> HttpResponse:
    context = {"queue": queue, "refresh_seconds": REFRESH_SECONDS, **context}
    if rows_only:
        return render(request, "console/queue.html#rows", context, status=status)
    context["saved_views"] = list(saved_views_of(request.user))
    context["saved_view_form"] = SavedViewForm(initial={"screen": queue.url_name})
    return render(request, "console/queue.html", context, status=200 if status == HTMX_STOP_POLLING else status)


def _row(task: Task) -> TaskRow:
    reasons = [Reason(reason.value, present.attention(reason)) for reason in attention_reasons(task)]
    return TaskRow(task=task, badge=present.task_badge(task), attention=reasons, remote=remote_down_of_row(task))


@require_POST
def saved_view_create(request: HttpRequest) -> HttpResponse:
    require_console_role(request)
    form = SavedViewForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A saved view needs a name (80 characters at most) and a queue.")
        return HttpResponseRedirect(reverse(WORK.url_name))
    data = form.cleaned_data
    screen, query = data["screen"], filter_query(QueryDict(data["query"]))
    try:
        saved_view_save(owner=request.user, name=data["name"], screen=screen, query=query)
    except TooManySavedViews as refused:
        messages.error(request, str(refused))
    else:
        messages.success(request, f"Saved the view “{data['name']}”.")
    return HttpResponseRedirect(_url(screen, query))


@require_safe
def saved_view_open(request: HttpRequest, view_id: int) -> HttpResponse:
    require_console_role(request)
    view = saved_view_of(request.user, view_id)
    return HttpResponseRedirect(_url(view.screen, view.query))


@require_POST
def saved_view_remove(request: HttpRequest, view_id: int) -> HttpResponse:
    require_console_role(request)
    view = saved_view_of(request.user, view_id)
    saved_view_delete(owner=request.user, view_id=view.pk)
    messages.success(request, f"Deleted the view “{view.name}”.")
    return HttpResponseRedirect(reverse(view.screen))


def _url(screen: str, query: str) -> str:
    return f"{reverse(screen)}?{query}" if query else reverse(screen)


urlpatterns = [
    path("", task_list, name="task-list"),
    path("attention/", attention, name="attention"),
    path("views/", saved_view_create, name="saved-view-create"),
    path("views/<id:view_id>/", saved_view_open, name="saved-view-open"),
    path("views/<id:view_id>/delete/", saved_view_remove, name="saved-view-delete"),
]
