"""The admin page "Agent tokens": list the agent API tokens, issue one (its plaintext shown once, on the answer
to the POST, never cached, never put in a message or the session) and revoke one with a reason."""

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST, require_safe

from api.tokens import TokenError, api_token_issue, api_token_list, api_token_revoke
from audit.errors import Refused
from console.access import require_admin_role
from console.errors import message_for

TEMPLATE = "console/api_tokens/tokens.html"


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.replace("\n", ",").split(",") if name.strip()]


class IssueForm(forms.Form):
    agent_id = forms.CharField(label="Agent id", max_length=200)
    name = forms.CharField(label="Name (what it is for)", max_length=200, required=False)
    kinds = forms.CharField(label="Task kinds (comma separated)", max_length=5000, required=False)
    projects = forms.CharField(label="Projects (comma separated)", max_length=5000, required=False)


class RevokeForm(forms.Form):
    reason = forms.CharField(label="Reason", max_length=500)


@require_safe
def tokens(request: HttpRequest) -> HttpResponse:
    require_admin_role(request)
    return render(request, TEMPLATE, {"tokens": api_token_list(), "form": IssueForm()})


@require_POST
def token_issue_view(request: HttpRequest) -> HttpResponse:
    who = require_admin_role(request)
    form = IssueForm(request.POST)
    if not form.is_valid():
        return _with_errors(request, form)
    data = form.cleaned_data
    try:
        row, plaintext = api_token_issue(
            actor=who,
            agent_id=data["agent_id"],
            name=data["name"],
            kinds=_names(data["kinds"]),
            projects=_names(data["projects"]),
        )
    except (Refused, TokenError) as error:
        messages.error(request, _message(error))
        return redirect("api-tokens")
    response = render(request, "console/api_tokens/token_shown.html", {"token": row, "plaintext": plaintext})
    add_never_cache_headers(response)  # Cache-Control: no-store among others: the plaintext exists only here
    return response


@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    who = require_admin_role(request)
    form = RevokeForm(request.POST)
    if not form.is_valid():
        return _with_errors(request, form)
    try:
        row = api_token_revoke(actor=who, token_id=token_id, reason=form.cleaned_data["reason"])
    except (Refused, TokenError) as error:
        messages.error(request, _message(error))
    else:
        messages.success(request, f"Token {row.pk} of agent {row.agent_id} is revoked.")
    return redirect("api-tokens")


def _message(error: Refused | TokenError) -> str:
    return message_for(error) if isinstance(error, Refused) else str(error)


def _with_errors(request: HttpRequest, form: forms.Form) -> HttpResponse:
    for field, errors in form.errors.items():
        label = "" if field == "__all__" else f"{form.fields[field].label}: "
        messages.error(request, label + " ".join(str(e) for e in errors))
    return redirect("api-tokens")


urlpatterns = [
    path("api-tokens/", tokens, name="api-tokens"),
    path("api-tokens/issue/", token_issue_view, name="api-token-issue"),
    path("api-tokens/<id:token_id>/revoke/", token_revoke_view, name="api-token-revoke"),
]
