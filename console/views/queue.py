from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe

from console.access import require_console_role
from tasks.models import Task
from tasks.queries import InvalidCursor, attention_reasons, page, task_overview
from tasks.querysets import Attention

PAGE_SIZE = 50


@dataclass(frozen=True)
class TaskRow:
    task: Task
    attention: list[Attention]


@require_safe
def task_list(request: HttpRequest) -> HttpResponse:
    require_console_role(request)
    after = request.GET.get("after") or None
    try:
        tasks, next_cursor = page(task_overview().viewable_by(request.user), after=after, size=PAGE_SIZE)
    except InvalidCursor:
        return HttpResponseBadRequest("This link to a page of tasks is not valid: start again from the first page.")
    rows = [TaskRow(task, attention_reasons(task)) for task in tasks]
    context = {"rows": rows, "next_cursor": next_cursor, "paged": after is not None}
    return render(request, "console/task_list.html", context)


urlpatterns = [
    path("", task_list, name="task-list"),
]
