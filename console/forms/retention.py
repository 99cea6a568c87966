"""The form of the retention page: keep one live retained object longer, until a time, for a reason.

The object travels as ``id:version:extensions seen``, so that an object extended by someone else since the page was
read is refused by the service (changed meanwhile), not silently extended again. Every rule — the reason's length,
the bound from creation, the number of extensions, who may — is ``retention_extend``'s: the form only parses."""

import re

from django import forms

from audit.services import MAX_TEXT

_CHOSEN = re.compile(r"^(\d{1,18}):(\d{1,9}):(\d{1,5})$")


def chosen_token(retained_id: int, version: int, extensions: int) -> str:
    return f"{retained_id}:{version}:{extensions}"


class RetentionExtendForm(forms.Form):
    retained = forms.CharField(max_length=40, error_messages={"required": "Choose the object to keep longer."})
    until = forms.DateTimeField(
        label="Keep it until (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "60"}, format="%Y-%m-%dT%H:%M"),
        help_text="Later than it expires now, and no later than the bound shown for it.",
    )
    reason = forms.CharField(
        label="Why it must be kept longer",
        max_length=MAX_TEXT,
        required=False,  # the service refuses a reason that is missing or too short, in its own words
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="At least 10 characters, audited with your name. Never paste a credential: it is refused.",
    )

    def clean_retained(self) -> tuple[int, int, int]:
        match = _CHOSEN.match(self.cleaned_data.get("retained", ""))
        if match is None:
            raise forms.ValidationError("This choice is not one of the page's objects: open the page again.")
        retained_id, version, extensions = (int(part) for part in match.groups())
        return retained_id, version, extensions
