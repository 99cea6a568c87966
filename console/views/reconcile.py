"""A task's actions: reconcile its open operations — ask the remote by
op key, or settle by hand — reset a stuck temp resource, cancel, force-release its lease.

Every view: the access check (console/access.py), a form, one service, a page. Every dangerous action is one flow
(console/forms/reconcile.py, templates/console/_danger.html): consequences from live rows, a typed reason, a typed
confirmation, the version the person read; the service checks the permission again and writes the audit row.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db.models import Case, IntegerField, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseStopPolling

from audit.errors import Refused
from audit.principals import Principal
from console import present
from console.access import operable_task, principal, require_admin_role, viewable_task
from console.errors import message_for, status_for
from console.forms.reconcile import (
    RESOLUTIONS,
    CancelForm,
    Danger,
    DangerForm,
    ForceReleaseForm,
    QueryForm,
    SettleForm,
    TempResetForm,
)
from leases import clock
from leases.errors import LeaseError
from leases.models import HolderKind, Lease
from leases.state import lease_state
from tasks.access.permits import permits
from tasks.core.lifecycle import (
    OPEN_OPERATION_STATUSES,
    ChangeKind,
    OperationStatus,
    TempResourceStatus,
    task_ended,
)
from tasks.engine.cleanup import cleanup_tries, temp_resource_reset
from tasks.models import Node, Operation, Task, TempResource
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import lease_force_release
from tasks.people.settlement import RemoteAnswer, operation_query_remote, operation_settle_by_hand, settle_prefill
from tasks.reads import consequences
from tasks.reads.state import read_state_sentence, task_state_sentence

POLL_SECONDS = 2
_SHOWN_TEMPS = [TempResourceStatus.STUCK.value, TempResourceStatus.ACTIVE.value, TempResourceStatus.CLEANING.value]


def _htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


type Refusal = Refused | LeaseError


def _actions_url(task: Task) -> str:
    return reverse("task-actions", args=[task.pk])


def _open_operations(task: Task) -> list[Operation]:
    """Open operations, unprovable first, then unknown, then the rest: one query."""
    rank = Case(
        When(failure_class="unprovable", then=Value(0)),
        When(status=OperationStatus.UNKNOWN.value, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    ops = Operation.objects.filter(task=task, status__in=[s.value for s in OPEN_OPERATION_STATUSES])
    return list(ops.select_related("node").annotate(rank=rank).order_by("rank", "pk"))


def _temp_resources(task: Task) -> list[TempResource]:
    rank = Case(When(status=TempResourceStatus.STUCK.value, then=Value(0)), default=Value(1))
    temps = TempResource.objects.filter(task=task, status__in=_SHOWN_TEMPS)
    return list(temps.annotate(rank=rank).order_by("rank", "pk"))


@dataclass(frozen=True)
class Shown:
    """A task's status as a person reads it: an icon, a word, and what it waits for (never colour alone)."""

    icon: str
    label: str
    waits: str


def shown_status(task: Task, sentence: str | None = None) -> Shown:
    """The task's status as console/present.py labels it everywhere, and what it waits for in the one sentence every
    page takes from tasks/reads/state.py (``sentence``, or read from the rows now)."""
    presented = present.status(task.status)
    return Shown(presented.icon, presented.label, read_state_sentence(task) if sentence is None else sentence)


def _actions_context(request: HttpRequest, task: Task, **extra: Any) -> dict[str, Any]:
    now = clock.now()  # the lease is shown as it stands at this reading of the database clock
    newest = Lease.objects.filter(task=task).order_by("-epoch").first()
    lease = newest if newest is not None and newest.released_at is None else None
    state = None if lease is None else lease_state(expires_at=lease.expires_at, now=now)
    who = principal(request)
    mine = lease is not None and lease.holder_kind == HolderKind.OPERATOR and lease.holder_id == who.id
    holds = mine and state is not None and state.live  # only a live lease writes
    operations = _open_operations(task)
    nodes = list(Node.objects.filter(task=task, plan_version=task.plan_version))
    sentence = task_state_sentence(task, nodes=nodes, operations=operations, lease=newest, now=now)
    return {
        "task": task,
        "shown": shown_status(task, sentence),
        **_offered(who, task, lease if holds else None),
        "operations": operations,
        "temps": _temp_resources(task),
        "lease": lease,
        "lease_state": state,
        "mine": mine,
        "holds_takeover": holds,
        "terminal": task_ended(task.status),
        "poll_seconds": POLL_SECONDS,
        **extra,
    }


def _offered(who: Principal, task: Task, lease: Lease | None) -> dict[str, bool]:
    """The actions the page offers: exactly those the permit table allows ``who`` now (tasks.access.permits), with
    their takeover lease when they hold it. The page opened only for people who may operate the task."""

    def allowed(change: ChangeKind, held: Lease | None = None) -> bool:
        return permits(who, change, task, lease=held, operable=True) is None

    return {
        # A cancel already recorded is not asked again: the service would change nothing.
        "cancellable": task.cancel_requested_at is None and allowed(ChangeKind.CANCEL),
        "may_force_release": allowed(ChangeKind.FORCE_RELEASE),
        "may_settle": lease is not None and allowed(ChangeKind.SETTLE, lease),
        "may_reset_temps": allowed(ChangeKind.CLEANUP),
    }


def _page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_safe
def task_actions(request: HttpRequest, task_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    return _page(request, "console/reconcile/actions.html", _actions_context(request, task))


@require_safe
def task_actions_status(request: HttpRequest, task_id: int) -> HttpResponse:
    """The status panel alone (HTMX polling): stopping → stopped_pending → stopped; polling stops once terminal."""
    task = operable_task(request, task_id)
    if not _htmx(request):  # the link behind the poll: the whole page
        return _page(request, "console/reconcile/actions.html", _actions_context(request, task))
    context = {
        "task": task,
        "shown": shown_status(task),
        "terminal": task_ended(task.status),
        "poll_seconds": POLL_SECONDS,
    }
    html = render_to_string("console/reconcile/actions.html#status", context, request=request)
    response = HttpResponseStopPolling(html) if context["terminal"] else HttpResponse(html)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _danger(
    request: HttpRequest,
    danger: Danger,
    task: Task,
    status: int = 200,
) -> HttpResponse:
    template = "console/reconcile/confirm.html#dialog" if _htmx(request) else "console/reconcile/confirm.html"
    return _page(request, template, {"task": task, "danger": danger}, status)


def _done(request: HttpRequest, task: Task, sentence: str) -> HttpResponse:
    messages.success(request, sentence)
    return HttpResponseRedirect(_actions_url(task), status=303)


@dataclass(frozen=True)
class _Outcome:
    """What a dangerous action's POST came to: done (the redirect to send), or the dialog again with why."""

    response: HttpResponse | None = None
    error: str = ""
    status: int = 200


def _confirmed(
    request: HttpRequest, task: Task, form: DangerForm, act: Callable[[dict[str, Any]], object], done: str
) -> _Outcome:
    """The one step every dangerous action shares: on a POST whose confirmation is valid, make the one service call
    and redirect with ``done``; a refusal becomes its sentence, and the task is read again for the dialog."""
    if request.method != "POST":
        return _Outcome()
    outcome = _Outcome(status=400)
    if form.is_valid():
        try:
            act(form.cleaned_data)
        except (Refused, LeaseError) as refused:
            outcome = _Outcome(error=message_for(refused), status=status_for(refused))
        else:
            return _Outcome(response=_done(request, task, done))
    task.refresh_from_db()
    return outcome


@require_http_methods(["GET", "HEAD", "POST"])
def task_cancel(request: HttpRequest, task_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    form = CancelForm(request.POST or None, expected=str(task.pk), initial={"version": task.version})
    outcome = _confirmed(
        request,
        task,
        form,
        lambda data: task_request_cancel(
            actor=principal(request), task_id=task.pk, reason=data["reason"], expected_version=data["version"]
        ),
        f"Cancel recorded for task {task.pk}: nothing new starts.",
    )
    if outcome.response:
        return outcome.response
    danger = Danger(
        title=f"Cancel task {task.pk}",
        action=reverse("task-cancel", args=[task.pk]),
        back=_actions_url(task),
        submit="Cancel the task",
        consequences=consequences.cancel_consequences(task),
        form=form,
        error=outcome.error,
    )
    return _danger(request, danger, task, outcome.status)


@require_http_methods(["GET", "HEAD", "POST"])
def force_release(request: HttpRequest, task_id: int) -> HttpResponse:
    task = viewable_task(request, task_id)
    require_admin_role(request)
    form = ForceReleaseForm(request.POST or None, expected=str(task.pk), initial={"version": task.version})
    outcome = _confirmed(
        request,
        task,
        form,
        lambda data: lease_force_release(
            actor=principal(request),
            task_id=task.pk,
            justification=data["justification"],
            impact=data["impact"],
            expected_version=data["version"],
        ),
        f"Lease of task {task.pk} released; it waits for another admin's review.",
    )
    if outcome.response:
        return outcome.response
    danger = Danger(
        title=f"Force-release the lease of task {task.pk}",
        action=reverse("force-release", args=[task.pk]),
        back=_actions_url(task),
        submit="Force-release the lease",
        consequences=consequences.force_release_consequences(task),
        form=form,
        error=outcome.error,
    )
    return _danger(request, danger, task, outcome.status)


def _operation(task: Task, op_key: str) -> Operation:
    op = Operation.objects.select_related("node").filter(task=task, op_key=op_key).first()
    if op is None:
        raise Http404("No such operation on this task.")
    return op


@require_http_methods(["GET", "HEAD", "POST"])
def operation_settle(request: HttpRequest, task_id: int, op_key: str) -> HttpResponse:
    task = operable_task(request, task_id)
    op = _operation(task, op_key)
    chosen = request.POST.get("resolution") or request.GET.get("resolution") or "done"
    resolution = chosen if chosen in ("done", "not_done", "compensate") else "done"
    initial: dict[str, Any] = {"version": task.version, "resolution": resolution}
    if request.method != "POST" and resolution != "not_done":  # what the remote says it left, when it can be asked
        initial["temp_locators"] = "\n".join(settle_prefill(kind=task.kind, op_key=op.op_key))
    form = SettleForm(
        request.POST or None,
        expected=str(task.pk),
        can_compensate=bool(op.node.compensation),
        initial=initial,
    )
    outcome = _confirmed(
        request,
        task,
        form,
        lambda data: operation_settle_by_hand(
            actor=principal(request),
            task_id=task.pk,
            op_key=op.op_key,
            expected_version=data["version"],
            resolution=data["resolution"],
            receipt=form.receipt(),
            note=data["reason"],
            temp_locators=data["temp_locators"],
        ),
        f"Operation {op.op_key} settled by hand ({resolution}).",
    )
    if outcome.response:
        return outcome.response
    here = reverse("operation-settle", args=[task.pk, op.op_key])
    variants = tuple(
        (label.split(":")[0], f"{here}?resolution={value}", value == resolution)
        for value, label in RESOLUTIONS
        if value != "compensate" or op.node.compensation
    )
    danger = Danger(
        title=f"Settle operation {op.op_key} by hand",
        action=reverse("operation-settle", args=[task.pk, op.op_key]),
        back=_actions_url(task),
        submit="Settle the operation",
        consequences=consequences.settle_consequences(op, resolution),  # type: ignore[arg-type]
        form=form,
        error=outcome.error,
        variants=variants,
    )
    return _danger(request, danger, task, outcome.status)


@require_POST
def operation_query(request: HttpRequest, task_id: int, op_key: str) -> HttpResponse:
    """Ask the remote now what became of ``op_key``, record its answer, show it (the receipt, or none)."""
    task = operable_task(request, task_id)
    op = _operation(task, op_key)
    form = QueryForm(request.POST)
    answer: RemoteAnswer | None = None
    error, status = "", 200
    if not form.is_valid():
        error, status = "This page is out of date: reload it and ask again.", 400
    else:
        try:
            answer = operation_query_remote(
                actor=principal(request),
                task_id=task.pk,
                op_key=op.op_key,
                expected_version=form.cleaned_data["version"],
            )
        except (Refused, LeaseError) as refused:
            error, status = message_for(refused), status_for(refused)
    task.refresh_from_db()
    context = _actions_context(request, task, answer=answer, answer_error=error, asked=op.op_key)
    return _page(request, "console/reconcile/actions.html", context, status)


@require_http_methods(["GET", "HEAD", "POST"])
def temp_reset(request: HttpRequest, task_id: int, temp_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    temp = TempResource.objects.filter(task=task, pk=temp_id).first()
    if temp is None:
        raise Http404("No such temp resource on this task.")
    form: DangerForm = TempResetForm(request.POST or None, expected=str(task.pk), initial={"version": task.version})
    outcome = _confirmed(
        request,
        task,
        form,
        lambda data: temp_resource_reset(
            actor=principal(request),
            task_id=task.pk,
            temp_id=temp.pk,
            expected_version=data["version"],
            reason=data["reason"],
        ),
        f"Temp resource {temp.locator} will be deleted again.",
    )
    if outcome.response:
        return outcome.response
    danger = Danger(
        title=f"Reset stuck temp resource {temp.locator}",
        action=reverse("temp-reset", args=[task.pk, temp.pk]),
        back=_actions_url(task),
        submit="Make it eligible for deletion again",
        consequences=consequences.temp_reset_consequences(temp, cleanup_tries(temp)),
        form=form,
        error=outcome.error,
    )
    return _danger(request, danger, task, outcome.status)


urlpatterns = [
    path("tasks/<id:task_id>/actions/", task_actions, name="task-actions"),
    path("tasks/<id:task_id>/actions/status/", task_actions_status, name="task-actions-status"),
    path("tasks/<id:task_id>/cancel/", task_cancel, name="task-cancel"),
    path("tasks/<id:task_id>/force-release/", force_release, name="force-release"),
    path("tasks/<id:task_id>/operations/<str:op_key>/settle/", operation_settle, name="operation-settle"),
    path("tasks/<id:task_id>/operations/<str:op_key>/query/", operation_query, name="operation-query"),
    path("tasks/<id:task_id>/temp/<id:temp_id>/reset/", temp_reset, name="temp-reset"),
]
