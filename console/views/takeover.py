"""Take a task over, keep it, decide: claim — or request it from the agent and wait — renew,
release, submit a result (staged: review, then confirm), approve an approval node, re-plan as a person.

Every view: access (console.access.operable_task: 404 if the task is not visible, 403 if only visible), a form, one
service, render. Every refusal is a service's named error, told as a sentence (console.errors.message_for); it
wrote nothing. Forms carry the version (and lease epoch) the page showed, so a stale page is refused by name.
"""

import json
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import path, reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRefresh, HttpResponseStopPolling
from django_htmx.middleware import HtmxDetails

from audit.errors import Refused
from audit.principals import Principal
from console.access import operable_task, principal
from console.errors import message_for, status_for
from console.forms.takeover import (
    ApproveForm,
    ReleaseForm,
    RenewForm,
    ReplanAcceptForm,
    ReplanProposeForm,
    ResultForm,
    posted_steps,
    stored_field_value,
)
from leases.errors import LeaseError
from tasks.access.permissions import PermissionDenied
from tasks.core.errors import VersionConflict
from tasks.core.lifecycle import NOT_ENDED
from tasks.models import Task
from tasks.people.approvals import node_approve, node_approve_and_resume
from tasks.people.replan import plan_accept_by_person, plan_effect, plan_propose_by_person, replan_draft
from tasks.people.takeover import (
    takeover_claim,
    takeover_lease_of,
    takeover_preview,
    takeover_release,
    takeover_renew,
    takeover_submit,
    takeover_withdraw,
)
from tasks.reads.takeover import TakeoverState, takeover_state

PAGE = "console/takeover/takeover.html"
REPLAN = "console/takeover/replan.html"
WAIT_POLL_SECONDS = 3  # while an agent finishes its step, the page claims again this often

type Refusal = Refused | LeaseError


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it (the typing django-htmx documents)."""

    htmx: HtmxDetails


def _page_url(task: Task) -> str:
    return reverse("takeover", args=[task.pk])


def _vary(response: HttpResponse) -> HttpResponse:
    patch_vary_headers(response, ("HX-Request",))
    return response


def _render_page(
    request: HtmxHttpRequest,
    task: Task,
    who: Principal,
    *,
    status: int = 200,
    steps: list[str] | None = None,
    **extra: Any,
) -> HttpResponse:
    """The page; ``steps``: the steps asked for by key (a link's ``?step=``, or those a posted form carried)."""
    state = takeover_state(actor=who, task=task, steps=steps or [])
    context: dict[str, Any] = {
        "state": state,
        "task": task,
        "wait_poll": WAIT_POLL_SECONDS,
    }
    context.update(extra)
    panel = bool(request.htmx and request.htmx.target == "lease-panel")
    if state.holding and not panel:  # the result form (its steps read) is shown only to whoever holds the task
        context.setdefault("result_form", _result_form(state))
    context.setdefault("release_form", ReleaseForm(initial={"epoch": state.lease.epoch if state.lease else 1}))
    template = f"{PAGE}#lease-panel" if panel else PAGE
    return _vary(render(request, template, context, status=status))


def _result_form(state: TakeoverState, data: Any = None, files: Any = None) -> ResultForm:
    initial = {"expected_version": state.task.version, "epoch": state.lease.epoch if state.lease else 1}
    return ResultForm(
        data,
        files,
        initial=initial,
        nodes=state.resultable,
        all_nodes=state.input_nodes,
        offered=state.to_submit,
        unreadable=state.step_problems,
    )


def _after_action(request: HtmxHttpRequest, task: Task, message: str, *, error: Refusal | None = None) -> HttpResponse:
    """Post/redirect/get: the page is read again and shows the message. An HTMX request refreshes the page."""
    (messages.error if error is not None else messages.success)(request, message)
    if request.htmx:
        return _vary(HttpResponseClientRefresh())
    return _vary(HttpResponseRedirect(_page_url(task), status=303))


# --- the page and its lease panel --------------------------------------------------------------------------------


@require_safe
def takeover_page(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """The page; ``?step=<key>`` (repeated) opens the result fields of steps past the first ones listed."""
    task = operable_task(request, task_id)
    return _render_page(request, task, principal(request), steps=request.GET.getlist("step"))


@require_safe
def lease_panel(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """The lease panel alone, for HTMX (the page's own panel polls by POSTing its claim or renewal); stops polling once
    the task has ended."""
    task = operable_task(request, task_id)
    if not request.htmx:  # a person following the link gets the whole page
        return _vary(HttpResponseRedirect(_page_url(task)))
    if task.status not in NOT_ENDED:
        return _vary(HttpResponseStopPolling())
    state = takeover_state(actor=principal(request), task=task)
    return _vary(render(request, f"{PAGE}#lease-panel", {"state": state, "task": task, "wait_poll": WAIT_POLL_SECONDS}))


@require_POST
def claim(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """Take the task over, or — an agent holds it — ask for it and wait (the panel claims again until granted)."""
    task = operable_task(request, task_id)
    who = principal(request)
    try:
        result = takeover_claim(actor=who, task_id=task.pk)
    except (Refused, LeaseError) as error:
        if request.htmx and request.htmx.target == "lease-panel":
            if task.status not in NOT_ENDED:  # nothing to wait for any more
                return _vary(HttpResponseStopPolling())
            return _render_page(request, task, who, status=status_for(error), panel_error=message_for(error))
        return _after_action(request, task, message_for(error), error=error)
    if request.htmx and request.htmx.target == "lease-panel":
        if not result.granted:  # still waiting: the panel polls on
            return _render_page(request, task, who)
        return _after_action(request, task, "You hold the task now.")
    if result.granted:
        return _after_action(request, task, "You hold the task now: the page keeps your lease while it is open.")
    return _after_action(
        request, task, f"Takeover requested: {result.waiting_for} finishes its step first; this page waits for it."
    )


@require_POST
def withdraw(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """Stop waiting for the agent's lease: agents may go on."""
    task = operable_task(request, task_id)
    try:
        takeover_withdraw(actor=principal(request), task_id=task.pk)
    except (Refused, LeaseError) as error:
        return _after_action(request, task, message_for(error), error=error)
    return _after_action(request, task, "Takeover request withdrawn: the agent may go on.")


@require_POST
def renew(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """The page's heartbeat: renew the takeover lease with the renewal seq it was given (a stale one is refused)."""
    task = operable_task(request, task_id)
    who = principal(request)
    form = RenewForm(request.POST)
    if not form.is_valid():
        return _render_page(request, task, who, status=400, panel_error="The renewal carried no lease: reload.")
    try:
        lease = takeover_lease_of(actor=who, task_id=task.pk, epoch=form.cleaned_data["epoch"])
        takeover_renew(actor=who, lease=lease, expected_renewal_seq=form.cleaned_data["renewal_seq"])
    except (Refused, LeaseError) as error:
        return _render_page(request, task, who, status=status_for(error), panel_error=message_for(error))
    return _render_page(request, task, who)


@require_POST
def release(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    who = principal(request)
    form = ReleaseForm(request.POST)
    if not form.is_valid():
        return _render_page(request, task, who, status=400, release_form=form)
    try:
        lease = takeover_lease_of(actor=who, task_id=task.pk, epoch=form.cleaned_data["epoch"])
        takeover_release(actor=who, lease=lease, reason=form.cleaned_data["reason"])
    except (Refused, LeaseError) as error:
        return _after_action(request, task, message_for(error), error=error)
    return _after_action(request, task, "Released: the task stays with people for another operator.")


# --- submit a result: review, then confirm ------------------------------------------------------------------------


@require_POST
def submit(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    who = principal(request)
    steps = posted_steps(request.POST)
    state = takeover_state(actor=who, task=task, steps=steps)
    form = _result_form(state, request.POST, request.FILES)
    if not form.is_valid():
        return _render_page(request, task, who, status=400, steps=steps, result_form=form)
    data = form.cleaned_data
    try:
        lease = takeover_lease_of(actor=who, task_id=task.pk, epoch=data["epoch"])
        stored = form.stored_attachments()
        arguments: dict[str, Any] = {
            "actor": who,
            "lease": lease,
            "based_on_version": data["expected_version"],
            "decision": data["decision"],
            "results": form.results(stored),
            "note": data["note"],
            "end_status": data["end_status"],
            "replan_reason": data["replan_reason"],
        }
        if data["stage"] == "review":
            preview = takeover_preview(**arguments)
            return _render_page(
                request, task, who, steps=steps, result_form=_reviewed(state, request, form, stored), preview=preview
            )
        takeover_submit(**arguments)
    except (Refused, LeaseError) as error:
        if isinstance(error, VersionConflict):  # the form is based on the version now, for a new review
            form = _rebased(state, request, error)
        return _render_page(
            request, task, who, status=status_for(error), steps=steps, result_form=form, error=message_for(error)
        )
    return _after_action(request, task, _submitted(data["decision"]))


def _rebased(state: TakeoverState, request: HtmxHttpRequest, error: VersionConflict) -> ResultForm:
    """After a stale-form refusal: the person's entries again, on the version the task is at now (they read what
    changed, then review again: no confirm button until they do)."""
    data = request.POST.copy()
    data["expected_version"] = str(error.details.get("actual") or state.task.version)
    rebased = _result_form(state, data)
    rebased.is_valid()
    return rebased


def _reviewed(
    state: TakeoverState, request: HtmxHttpRequest, form: ResultForm, stored: dict[str, list[tuple[str, str]]]
) -> ResultForm:
    """The reviewed form again, carrying the files it stored by digest (the confirm re-sends no bytes)."""
    data = request.POST.copy()
    for nf in form.node_fields:
        data[nf.names["stored"]] = stored_field_value(stored.get(nf.node.key, []))
    reviewed = _result_form(state, data)
    reviewed.is_valid()
    return reviewed


def _submitted(decision: str) -> str:
    return {
        "resume_agent": "Result recorded and the task handed back: the agent is woken to go on.",
        "end_task": "Result recorded and the task ended.",
        "replan": "Result recorded: the task waits for a new plan.",
    }[decision]


# --- approve ------------------------------------------------------------------------------------------------------


@require_POST
def approve(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    who = principal(request)
    form = ApproveForm(request.POST)
    if not form.is_valid():
        return _after_action(request, task, "The approval form was incomplete: nothing was approved.")
    data = form.cleaned_data
    approve_with = node_approve_and_resume if data["resume"] else node_approve
    try:
        approve_with(
            actor=who,
            task_id=task.pk,
            node_key=data["node_key"],
            expected_version=data["expected_version"],
            approving=data["approving"],
            ttl=timedelta(minutes=data["valid_minutes"]) if data["valid_minutes"] else None,
            note=data["note"],
        )
    except (Refused, LeaseError) as error:
        return _render_page(request, task, who, status=status_for(error), error=message_for(error))
    if data["resume"]:
        return _after_action(request, task, f"Approved {data['node_key']} and handed the task back: the agent goes on.")
    return _after_action(request, task, f"Approved {data['node_key']}. Hand the task back to let the agent go on.")


# --- re-plan as a person -----------------------------------------------------------------------------------------


@require_http_methods(["GET", "HEAD", "POST"])
def replan(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """GET: a plan to start from (the current one, with changed inputs updated: the unchanged part is kept).
    POST: propose it as this person (audited); it is accepted on the next step, after its effect is shown."""
    task = operable_task(request, task_id)
    who = principal(request)
    draft = replan_draft(task.pk)
    if request.method != "POST":
        initial = {"expected_version": task.version, "plan": json.dumps(draft.document, indent=2)}
        return _render_replan(request, task, who, ReplanProposeForm(initial=initial), draft=draft)
    form = ReplanProposeForm(request.POST)
    if not form.is_valid():
        return _render_replan(request, task, who, form, draft=draft, status=400)
    data = form.cleaned_data
    try:
        plan_propose_by_person(
            actor=who,
            task_id=task.pk,
            plan=data["plan"],
            expected_version=data["expected_version"],
            reason=data["reason"],
        )
    except (Refused, LeaseError) as error:
        return _render_replan(request, task, who, form, draft=draft, status=status_for(error), error=message_for(error))
    messages.success(request, "Plan proposed. Review what it keeps and redoes, then accept it.")
    return _vary(HttpResponseRedirect(reverse("takeover-replan", args=[task.pk]), status=303))


def _render_replan(
    request: HtmxHttpRequest, task: Task, who: Principal, form: ReplanProposeForm, *, status: int = 200, **extra: Any
) -> HttpResponse:
    state = takeover_state(actor=who, task=task)
    proposals = []
    for revision in state.proposals[:3]:
        superseded_by = state.superseded.get(revision.pk)
        effect = None
        if superseded_by is None:  # a superseded proposal cannot be accepted: nothing to review
            try:
                effect = plan_effect(task.pk, revision.document)
            except Refused as error:
                extra.setdefault("error", message_for(error))
        accept = ReplanAcceptForm(initial={"expected_version": task.version, "revision_id": revision.pk})
        proposals.append({"revision": revision, "effect": effect, "form": accept, "superseded_by": superseded_by})
    context = {"state": state, "task": task, "form": form, "proposals": proposals, **extra}
    return _vary(render(request, REPLAN, context, status=status))


@require_POST
def replan_accept(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    task = operable_task(request, task_id)
    who = principal(request)
    form = ReplanAcceptForm(request.POST)
    if not form.is_valid():
        return _after_action(request, task, "The acceptance form was incomplete: nothing was accepted.")
    try:
        revision = next(
            (r for r in takeover_state(actor=who, task=task).proposals if r.pk == form.cleaned_data["revision_id"]),
            None,
        )
        if revision is None:
            raise PermissionDenied("that plan revision is not a proposal for this task")
        plan_accept_by_person(
            actor=who, revision_id=revision.pk, expected_version=form.cleaned_data["expected_version"]
        )
    except (Refused, LeaseError) as error:
        return _after_action(request, task, message_for(error), error=error)
    return _after_action(request, task, "Plan accepted and the task handed back: the agent is woken to run it.")


urlpatterns = [
    path("tasks/<id:task_id>/takeover/", takeover_page, name="takeover"),
    path("tasks/<id:task_id>/takeover/lease/", lease_panel, name="takeover-lease"),
    path("tasks/<id:task_id>/takeover/claim/", claim, name="takeover-claim"),
    path("tasks/<id:task_id>/takeover/withdraw/", withdraw, name="takeover-withdraw"),
    path("tasks/<id:task_id>/takeover/renew/", renew, name="takeover-renew"),
    path("tasks/<id:task_id>/takeover/release/", release, name="takeover-release"),
    path("tasks/<id:task_id>/takeover/submit/", submit, name="takeover-submit"),
    path("tasks/<id:task_id>/takeover/approve/", approve, name="takeover-approve"),
    path("tasks/<id:task_id>/replan/", replan, name="takeover-replan"),
    path("tasks/<id:task_id>/replan/accept/", replan_accept, name="takeover-replan-accept"),
]
