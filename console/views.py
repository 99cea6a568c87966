from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tasks.queries import task_overview


def task_list(request: HttpRequest) -> HttpResponse:
    return render(request, "console/task_list.html", {"tasks": task_overview()})
