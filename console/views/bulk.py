"""Bulk actions on a filtered set of tasks: the preview (the dry run, counted per outcome), the
confirmation (the one dangerous-action flow), the progress page of the run (HTMX polling, stops once done).

The filter is the work queue's, read from the same query string (console/forms/queue.py), so a queue's URL opens
its bulk preview. Every rule is in tasks/people/bulk.py; these views check access, validate a form and call one service.
"""

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods, require_safe
from django_htmx.http import HttpResponseStopPolling

from audit.errors import Refused
from console.access import principal, request_roles, require_console_role
from console.errors import message_for
from console.forms.bulk import BulkConfirmForm, parse_seen, seen_token
from console.forms.queue import QueueFilterForm, filter_query
from console.forms.reconcile import Danger
from tasks.access.permissions import ADMIN, OPERATOR
from tasks.models import BulkOperation
from tasks.people.bulk import MAX_TASKS, Preview, Seen, bulk_preview, bulk_run_create, bulk_run_progress
from tasks.reads.consequences import Consequences, noun, plural

POLL_SECONDS = 2


def require_bulk_person(request: HttpRequest) -> None:
    """Operators and admins; 403 for an auditor and anyone without a role."""
    require_console_role(request)
    if not request_roles(request) & {OPERATOR, ADMIN}:
        raise PermissionDenied("Only operators and admins act on tasks in bulk.")


def _htmx(request: HttpRequest) -> bool:
    """An HTMX request for a part of the page; a history restore (the back button after hx-push-url) or a boosted
    link gets the whole page."""
    htmx: Any = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request and not htmx.boosted


def _page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _operation(value: str) -> str:
    return value if value in BulkOperation.values else ""


def _choices(query: str, chosen: str) -> list[tuple[str, str, bool]]:
    """(label, url, chosen) of every operation, on the same filter."""
    here = reverse("bulk")
    return [
        (label, f"{here}?{query}&op={value}" if query else f"{here}?op={value}", value == chosen)
        for value, label in BulkOperation.choices
    ]


def _consequences(preview: Preview) -> Consequences:
    """One sentence per outcome, counted now: the tasks that change, then each reason to skip."""
    sentences = []
    for group in preview.groups:
        many = plural(group.count, "task")
        verb = "will change" if group.verdict.changes else "will be skipped"
        sentences.append(f"{many} {verb}: {group.verdict.sentence}")
    sentences.append("Each task is changed on its own, by the same service as its own page, and audited.")
    sentences.append("A task that changes between now and the run is skipped and listed, never forced.")
    changing = len(preview.changing)
    return Consequences(tuple(sentences), changing, f"{noun(changing, 'task')} will change")


def _danger(form: BulkConfirmForm, preview: Preview, query: str, error: str = "") -> Danger:
    label = BulkOperation(preview.operation).label
    back = f"{reverse('task-list')}?{query}" if query else reverse("task-list")
    return Danger(
        title=f"{label}: {plural(len(preview.changing), 'task')}",
        action=reverse("bulk"),
        back=back,
        submit=f"{label} for {plural(len(preview.changing), 'task')}",
        consequences=_consequences(preview),
        form=form,
        error=error,
    )


def _preview_context(
    request: HttpRequest, operation: str, filters: QueueFilterForm, query: str, data: QueryDict | None = None
) -> dict[str, Any]:
    context: dict[str, Any] = {
        "filters": filters,
        "query": query,
        "operation": operation,
        "choices": _choices(query, operation),
        "max_tasks": MAX_TASKS,
        "back": f"{reverse('task-list')}?{query}" if query else reverse("task-list"),
    }
    if not operation:
        return context
    preview = bulk_preview(actor=principal(request), operation=operation, task_filter=filters.task_filter())
    seen = [Seen(r.facts.task_id, r.facts.version, r.facts.epoch) for r in preview.changing]
    initial = {"operation": operation, "seen": seen_token(seen), "filter": query}
    if data is not None:  # a refused confirmation: keep what was typed, with the preview as it is now
        data = data.copy()
        data.update({"seen": initial["seen"], "operation": operation, "filter": query})
    form = BulkConfirmForm(data, expected=str(len(seen)), initial=initial)
    if data is not None:
        form.is_valid()
    context["preview"] = preview
    context["danger"] = _danger(form, preview, query) if preview.changing and not preview.too_many else None
    return context


@require_http_methods(["GET", "HEAD", "POST"])
def bulk(request: HttpRequest) -> HttpResponse:
    """GET: the preview of an operation on the queue filter in the query string. POST: confirm it."""
    require_bulk_person(request)
    if request.method == "POST":
        return _confirm(request)
    filters = QueueFilterForm(request.GET)
    query = filter_query(request.GET)
    if not filters.is_valid():
        return _page(request, "console/bulk/preview.html", {"filters": filters, "query": query, "invalid": True}, 400)
    context = _preview_context(request, _operation(request.GET.get("op", "")), filters, query)
    template = "console/bulk/preview.html#preview" if _htmx(request) else "console/bulk/preview.html"
    return _page(request, template, context)


def _confirm(request: HttpRequest) -> HttpResponse:
    seen = parse_seen(request.POST.get("seen", "")) or []
    form = BulkConfirmForm(request.POST, expected=str(len(seen)))
    error = ""
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = bulk_run_create(
                actor=principal(request),
                operation=data["operation"],
                reason=data["reason"],
                seen=data["seen"],
                filter_query=data["filter"],
            )
        except Refused as refused:
            error = message_for(refused)
        else:
            return HttpResponseRedirect(reverse("bulk-run", args=[run.pk]), status=303)
    query = filter_query(QueryDict(request.POST.get("filter", "")))
    filters = QueueFilterForm(QueryDict(query))
    operation = _operation(request.POST.get("operation", ""))
    if not filters.is_valid() or not operation:
        return _page(request, "console/bulk/preview.html", {"filters": filters, "query": query, "invalid": True}, 400)
    context = _preview_context(request, operation, filters, query, data=request.POST)
    if context.get("danger") is not None and error:
        context["danger"] = _danger(context["danger"].form, context["preview"], query, error)
    return _page(request, "console/bulk/preview.html", context, 400)


def _progress(request: HttpRequest, run_id: int) -> Any:
    require_bulk_person(request)
    progress = bulk_run_progress(actor=principal(request), run_id=run_id)
    if progress is None:
        raise Http404("No such bulk run, or it is not yours.")
    return progress


@require_safe
def bulk_run(request: HttpRequest, run_id: int) -> HttpResponse:
    progress = _progress(request, run_id)
    context = {"progress": progress, "run": progress.run, "poll_seconds": POLL_SECONDS}
    return _page(request, "console/bulk/run.html", context)


@require_safe
def bulk_run_status(request: HttpRequest, run_id: int) -> HttpResponse:
    """The progress panel alone (HTMX polling); the whole page without htmx. Polling stops once the run is done."""
    progress = _progress(request, run_id)
    context = {"progress": progress, "run": progress.run, "poll_seconds": POLL_SECONDS}
    if not _htmx(request):
        return _page(request, "console/bulk/run.html", context)
    html = render_to_string("console/bulk/run.html#progress", context, request=request)
    response = HttpResponseStopPolling(html) if progress.finished else HttpResponse(html)
    patch_vary_headers(response, ("HX-Request",))
    return response


urlpatterns = [
    path("bulk/", bulk, name="bulk"),
    path("bulk/runs/<id:run_id>/", bulk_run, name="bulk-run"),
    path("bulk/runs/<id:run_id>/status/", bulk_run_status, name="bulk-run-status"),
]
