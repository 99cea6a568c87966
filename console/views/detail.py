"""The task detail page: the header and what the state waits for, the plan's nodes and the operations a page at a
time, the timeline with the hash-chain check, the lease panel (polled), the takeover package, temp resources and
retained objects. Views check access and call the reads of tasks/reads/detail.py; nothing here writes."""

from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from console.access import principal, viewable_task
from retention.queries import retained_for_task
from tasks.access.permissions import can_operate
from tasks.access.permits import permits
from tasks.core.lifecycle import ChangeKind, task_ended
from tasks.models import Task
from tasks.reads.detail import (
    InvalidPageNumber,
    InvalidTimelineCursor,
    chain_check,
    detail_page,
    lease_view,
    page_number,
    timeline_page,
)

TEMPLATE = "console/task_detail.html"
TIMELINE_PAGE_SIZE = 25
# How often the lease panel asks again, while the tab is visible (the page says so).
LEASE_POLL_SECONDS = 5


@require_safe
@vary_on_headers("HX-Request")
def task_detail_page(request: HttpRequest, task_id: int) -> HttpResponse:
    """The page, its nodes and operations a page at a time (``?nodes=2``, ``?ops=3``; past the last is the last)
    and its timeline by cursor (``?before=…``)."""
    task = viewable_task(request, task_id)
    try:
        timeline, older = timeline_page(task, before=request.GET.get("before") or None, size=TIMELINE_PAGE_SIZE)
    except InvalidTimelineCursor:
        return HttpResponseBadRequest("This link to older events is not valid: open the task again.")
    context = {"task": task, "timeline": timeline, "older": older, "paged": "before" in request.GET}
    if request.headers.get("HX-Request") and "before" in request.GET:
        return render(request, f"{TEMPLATE}#timeline-page", context)
    try:
        nodes_page, operations_page = page_number(request.GET.get("nodes")), page_number(request.GET.get("ops"))
    except InvalidPageNumber:
        return HttpResponseBadRequest("This link to a page of nodes or operations is not valid: open the task again.")
    shown = _page_context(request, task, nodes_page=nodes_page, operations_page=operations_page)
    return render(request, TEMPLATE, shown | context)


@require_safe
@vary_on_headers("HX-Request")
def task_lease_panel(request: HttpRequest, task_id: int) -> HttpResponse:
    """The lease panel alone, for polling. Once the task is terminal the last panel is sent with htmx's stop code."""
    task = viewable_task(request, task_id)
    terminal = task_ended(task.status)
    context = {"task": task, "lease": lease_view(task), "terminal": terminal, "poll_seconds": LEASE_POLL_SECONDS}
    if not request.headers.get("HX-Request"):
        return redirect(reverse("task-detail", args=[task.pk]) + "#lease-panel")
    html = render_to_string(f"{TEMPLATE}#lease-panel", context, request=request)
    return HttpResponseStopPolling(html) if terminal else HttpResponse(html)


@require_POST
@vary_on_headers("HX-Request")
def task_chain_check(request: HttpRequest, task_id: int) -> HttpResponse:
    """Verify the task's hash chain now, however long its log (read only: a problem found here is shown, not
    acted on — the verify_log job quarantines). Any user who may see the task may ask."""
    task = viewable_task(request, task_id)
    if request.headers.get("HX-Request"):
        return render(request, f"{TEMPLATE}#chain-check", {"task": task, "check": chain_check(task, force=True)})
    timeline, older = timeline_page(task, before=None, size=TIMELINE_PAGE_SIZE)
    context = {"timeline": timeline, "older": older, "paged": False}
    return render(request, TEMPLATE, _page_context(request, task, force_check=True) | context)


def _page_context(
    request: HttpRequest, task: Task, *, force_check: bool = False, nodes_page: int = 1, operations_page: int = 1
) -> dict[str, Any]:
    shown = detail_page(task, force_check=force_check, nodes_page=nodes_page, operations_page=operations_page)
    may_operate = can_operate(principal(request), task)
    return {
        "task": task,
        "detail": shown.detail,
        "lease": shown.lease,
        "terminal": shown.detail.terminal,
        "check": shown.check,
        "package": shown.package,
        "retained": retained_for_task(task.pk),
        "may_operate": may_operate,
        "may_take_over": permits(principal(request), ChangeKind.TAKEOVER, task, operable=may_operate) is None,
        "poll_seconds": LEASE_POLL_SECONDS,
        "approvals": shown.approvals,
        "remote": shown.remote,
        "state_sentence": shown.sentence,
        "remote_wait_seconds": shown.remote.wait_seconds(shown.lease.now) if shown.remote else None,
    }


urlpatterns = [
    path("tasks/<id:task_id>/", task_detail_page, name="task-detail"),
    path("tasks/<id:task_id>/lease/", task_lease_panel, name="task-lease-panel"),
    path("tasks/<id:task_id>/chain-check/", task_chain_check, name="task-chain-check"),
]
