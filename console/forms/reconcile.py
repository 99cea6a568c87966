"""The forms of the reconcile screens, and the one flow every dangerous action follows.

A dangerous action is a ``DangerForm``: the task version the person read the consequences on (a stale one is
refused by the service, nothing written), a typed reason where it matters, and a typed confirmation — the task id,
typed by hand. ``Danger`` is what ``templates/console/_danger.html`` renders: the consequence sentences computed from
live rows (tasks/reads/consequences.py), the live impact count, the form. The permission check and the audit event are
the service's, on the server; a keyboard shortcut may open the dialog, never submit it.
"""

from dataclasses import dataclass
from typing import Any

from django import forms

from audit.reasons import MIN_REASON
from console.forms.receipts import receipt_form_fields
from tasks.core.outcomes import RECEIPT_FIELDS, Committed
from tasks.core.parsing import MAX_BIGINT
from tasks.people.forced_release import MIN_FORCE_TEXT
from tasks.people.settlement import MIN_NOTE
from tasks.reads.consequences import Consequences

RESOLUTIONS = [
    ("done", "Done: it happened (give the receipt)"),
    ("not_done", "Not done: it never took effect"),
    ("compensate", "Compensate: it happened, and is to be undone"),
]


class DangerForm(forms.Form):
    """Version, typed reason (when ``reason_min`` > 0) and typed confirmation of a dangerous action."""

    reason_label = "Reason"
    reason_help = "Why, in words another person will read in the audit log."

    version = forms.IntegerField(max_value=MAX_BIGINT, widget=forms.HiddenInput, min_value=1)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=2000)
    confirm = forms.CharField(max_length=40, strip=True, widget=forms.TextInput(attrs={"autocomplete": "off"}))

    def __init__(self, *args: Any, expected: str, reason_min: int = MIN_REASON, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected = expected
        self.reason_min = reason_min
        self.fields["confirm"].label = f"Type {expected} to confirm"
        self.fields["reason"].label = self.reason_label
        self.fields["reason"].help_text = self.reason_help
        if reason_min:
            self.fields["reason"].required = True
            self.fields["reason"].widget.attrs["minlength"] = str(reason_min)
        else:
            del self.fields["reason"]

    def clean_confirm(self) -> str:
        typed: str = self.cleaned_data["confirm"]
        if typed != self.expected:
            raise forms.ValidationError(f"Type exactly {self.expected} to confirm; nothing was done.")
        return typed

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data.get("reason", "").strip()
        if len(reason) < self.reason_min:
            raise forms.ValidationError(f"Write at least {self.reason_min} characters; nothing was done.")
        return reason


class CancelForm(DangerForm):
    reason_label = "Why cancel"


class TempResetForm(DangerForm):
    reason_label = "What changed"
    reason_help = "What makes a delete possible now (a permission granted back, the remote fixed, …)."


class SettleForm(DangerForm):
    """Settle an operation by hand: the resolution, the note of what was checked, and the receipt when it happened."""

    reason_label = "What you checked"
    reason_help = "The evidence: where you looked and what it showed."
    field_order = ["version", "resolution", *RECEIPT_FIELDS, "temp_locators", "reason", "confirm"]

    # Chosen by the link the person followed (each shows its own consequences), carried as a hidden field.
    resolution = forms.ChoiceField(choices=RESOLUTIONS, widget=forms.HiddenInput)
    # What the operation left at the remote, one locator a line: recorded as the task's temp resources, deleted by
    # the cleanup once the task has ended (pre-filled from the remote's answer when it can be asked).
    temp_locators = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        required=False,
        max_length=20_000,
        label="Staging objects it created",
        help_text="One locator a line (e.g. tgt-acme-…/tmp/batch-2): each is deleted once the task has ended.",
    )

    def __init__(self, *args: Any, can_compensate: bool, **kwargs: Any) -> None:
        super().__init__(*args, reason_min=MIN_NOTE, **kwargs)
        self.fields.update(receipt_form_fields())
        self.order_fields(self.field_order)
        if not can_compensate:
            self.fields["resolution"].choices = [c for c in RESOLUTIONS if c[0] != "compensate"]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any] | None:
        data = super().clean() or {}
        resolution = data.get("resolution")
        receipt_given = any(data.get(f) not in (None, "") for f in RECEIPT_FIELDS)
        if resolution in ("done", "compensate") and not data.get("remote_id"):
            self.add_error("remote_id", "It happened: give the remote id the external system gave it.")
        if resolution == "not_done" and receipt_given:
            self.add_error("remote_id", "Not done comes without a receipt: clear the receipt fields.")
        if resolution == "not_done" and data.get("temp_locators"):
            self.add_error("temp_locators", "Not done left nothing behind: clear the staging objects.")
        return data

    def clean_temp_locators(self) -> list[str]:
        text: str = self.cleaned_data.get("temp_locators") or ""
        return [line.strip() for line in text.splitlines() if line.strip()]

    def receipt(self) -> Committed | None:
        data = self.cleaned_data
        if data["resolution"] == "not_done":
            return None
        return Committed(**{name: data[name] for name in RECEIPT_FIELDS})


class ForceReleaseForm(DangerForm):
    """Justification and impact (each MIN_FORCE_TEXT characters or more) besides the typed confirmation."""

    field_order = ["version", "justification", "impact", "confirm"]

    justification = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), min_length=MIN_FORCE_TEXT)
    impact = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), min_length=MIN_FORCE_TEXT)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, reason_min=0, **kwargs)
        self.fields["justification"].help_text = "Why the holder must be removed now."
        self.fields["impact"].help_text = "What the removal may leave unfinished, and who is told."


class QueryForm(forms.Form):
    """Ask the remote by op key: only the version the page showed (a stale page is refused)."""

    version = forms.IntegerField(max_value=MAX_BIGINT, widget=forms.HiddenInput, min_value=1)


@dataclass(frozen=True)
class Danger:
    """One dangerous action, as ``console/_danger.html`` shows it."""

    title: str
    action: str  # the URL the confirmed form posts to
    back: str  # where "Keep it as it is" goes
    submit: str  # the button's words
    consequences: Consequences
    form: DangerForm
    error: str = ""  # a service's refusal, as a sentence
    # Variants of the action, each with its own consequences: (label, url, chosen), e.g. settle as done / not done.
    variants: tuple[tuple[str, str, bool], ...] = ()
