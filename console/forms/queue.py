"""The queues' filters, read from the URL's query string (a GET form: shareable, back-button safe), and the saved
view form."""

from typing import Any

from django import forms
from django.http import QueryDict

from tasks.core.lifecycle import PauseReason, TaskStatus
from tasks.querysets import Attention
from tasks.reads.queries import ATTENTION_ANY, ATTENTION_NONE, HOLDER_AGENT, HOLDER_NONE, HOLDER_PERSON, TaskFilter

# The query-string keys the filter form reads; anything else (the cursor, unknown keys) is not part of a view.
FILTER_KEYS = ("state", "reason", "exclude", "kind", "project", "holder", "attention", "q")

STATE_CHOICES = [(s.value, s.value.replace("_", " ")) for s in TaskStatus]
REASON_CHOICES = [(r.value, r.value.replace("_", " ")) for r in PauseReason]
ATTENTION_CHOICES = [
    ("", "any or none"),
    (ATTENTION_ANY, "needs attention (any reason)"),
    (ATTENTION_NONE, "needs nobody"),
    *[(reason.value, reason.label) for reason in Attention],
]
HOLDER_HELP = f"{HOLDER_AGENT}, {HOLDER_PERSON}, {HOLDER_NONE}, or a holder's id"


class QueueFilterForm(forms.Form):
    state = forms.MultipleChoiceField(choices=STATE_CHOICES, required=False, widget=forms.CheckboxSelectMultiple)
    reason = forms.MultipleChoiceField(
        choices=REASON_CHOICES, required=False, label="Pause reason", widget=forms.CheckboxSelectMultiple
    )
    exclude = forms.MultipleChoiceField(
        choices=STATE_CHOICES, required=False, label="Not in state", widget=forms.CheckboxSelectMultiple
    )
    kind = forms.CharField(max_length=100, required=False)
    project = forms.CharField(max_length=100, required=False)
    holder = forms.CharField(max_length=200, required=False, help_text=HOLDER_HELP)
    attention = forms.ChoiceField(choices=ATTENTION_CHOICES, required=False, label="Needs attention")
    q = forms.CharField(
        max_length=200, required=False, label="Text", help_text="in title, kind or project; #12 is task 12"
    )

    def line_fields(self) -> list[forms.BoundField]:
        """The one-value filters, shown on one line."""
        return [self[name] for name in ("q", "kind", "project", "holder", "attention")]

    def set_fields(self) -> list[forms.BoundField]:
        """The many-value filters, each a set of checkboxes."""
        return [self[name] for name in ("state", "reason", "exclude")]

    def task_filter(self) -> TaskFilter:
        """The validated filter (call after is_valid())."""
        data: dict[str, Any] = self.cleaned_data
        return TaskFilter(
            states=frozenset(data["state"]),
            pause_reasons=frozenset(data["reason"]),
            exclude_states=frozenset(data["exclude"]),
            kind=data["kind"].strip(),
            project=data["project"].strip(),
            holder=data["holder"].strip(),
            attention=data["attention"],
            text=data["q"].strip(),
        )


def filter_query(query: QueryDict) -> str:
    """The filter part of a query string, in a stable order (the cursor and unknown keys dropped): what a saved
    view stores and what the pages' links carry."""
    kept = QueryDict(mutable=True)
    for key in FILTER_KEYS:
        values = [value for value in query.getlist(key) if value.strip()]
        if values:
            kept.setlist(key, values)
    return kept.urlencode()


class SavedViewForm(forms.Form):
    name = forms.CharField(max_length=80, strip=True)
    screen = forms.ChoiceField(choices=[("task-list", "work queue"), ("attention", "needs attention")])
    query = forms.CharField(max_length=2000, required=False)
