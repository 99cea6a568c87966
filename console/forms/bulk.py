"""The forms of the bulk pages and of operator notes.

A bulk run is confirmed through the one flow of every dangerous action (console/forms/reconcile.py DangerForm,
templates/console/_danger.html): a typed reason, and the number of tasks that will change typed by hand. What the
preview saw travels with the form — each task's id, version and lease epoch — so the run changes only those tasks, and
only if they did not move; the server checks each one again (tasks/people/bulk.py), whatever the form says.
"""

import re
from typing import Any

from django import forms

from audit.reasons import MIN_REASON
from console.forms.reconcile import DangerForm
from tasks.models import BulkOperation
from tasks.people.bulk import MAX_TASKS, Seen
from tasks.people.notes import NOTE_MAX_CHARS

_SEEN = re.compile(r"^(\d{1,18}):(\d{1,18}):(\d{1,18}|-)$")


def seen_token(seen: list[Seen]) -> str:
    """The preview's tasks as the form carries them: ``id:version:epoch`` (``-`` for no lease), space-separated."""
    return " ".join(f"{s.task_id}:{s.version}:{s.epoch if s.epoch is not None else '-'}" for s in seen)


def parse_seen(token: str) -> list[Seen] | None:
    """The tasks of a ``seen_token``; None when it is not one (altered, or over MAX_TASKS)."""
    parts = token.split()
    if len(parts) > MAX_TASKS:
        return None
    seen = []
    for part in parts:
        match = _SEEN.match(part)
        if match is None:
            return None
        task_id, version, epoch = match.groups()
        seen.append(Seen(int(task_id), int(version), None if epoch == "-" else int(epoch)))
    return seen


class BulkConfirmForm(DangerForm):
    """Confirm a bulk run: the operation, the preview's tasks (hidden), the reason and the typed count."""

    reason_label = "Why"
    reason_help = "Why these tasks, in words another person will read in each task's audit trail."
    field_order = ["operation", "seen", "filter", "reason", "confirm"]

    operation = forms.ChoiceField(choices=BulkOperation.choices, widget=forms.HiddenInput)
    seen = forms.CharField(widget=forms.HiddenInput, max_length=MAX_TASKS * 60, required=False)
    filter = forms.CharField(widget=forms.HiddenInput, max_length=2000, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, reason_min=MIN_REASON, **kwargs)
        del self.fields["version"]  # each task carries its own, in ``seen``

    def clean_seen(self) -> list[Seen]:
        seen = parse_seen(self.cleaned_data.get("seen", ""))
        if not seen:
            raise forms.ValidationError("This preview is out of date or was altered: open it again.")
        return seen


class NoteForm(forms.Form):
    text = forms.CharField(
        label="Note",
        max_length=NOTE_MAX_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What you saw or did, for the next person. Never paste a credential: it is refused.",
    )
