"""Forms of the admin and auditor pages: the audit log's filters (a GET form, held in the URL), role and scope
grants, and the review of a forced release. They check shape only; every rule is the service's."""

from typing import Any

from django import forms
from django.contrib.auth.models import User

from audit.queries import AuditFilter
from tasks.access.permissions import ROLES
from tasks.core.parsing import MAX_BIGINT

ROLE_CHOICES = [(role, role) for role in ROLES]
# The actions the domain audits today, offered as suggestions; any other action can still be typed.
KNOWN_ACTIONS = (
    "cancel_requested",
    "forced_release_accepted",
    "forced_release_disputed",
    "lease_forced_release",
    "logs_verified",
    "operation_queried_by_person",
    "operation_resolved_by_person",
    "permission_granted",
    "permission_revoked",
    "plan_accepted_after_replan",
    "quarantined_beside_the_log",
    "retention_extended",
    "role_granted",
    "role_revoked",
    "takeover_expired",
    "takeover_released",
    "takeover_requested",
    "takeover_withdrawn",
)


class AuditFilterForm(forms.Form):
    actor = forms.CharField(
        required=False, max_length=210, help_text="user:ann, agent:worker-1, system:scheduler, or just the name"
    )
    action = forms.CharField(required=False, max_length=60, help_text="e.g. role_granted")
    task = forms.IntegerField(max_value=MAX_BIGINT, required=False, min_value=1, label="Task id")
    forced = forms.BooleanField(required=False, label="Forced releases only")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        self.fields["action"].widget.attrs["list"] = "known-actions"

    def to_filter(self) -> AuditFilter:
        """The filter the valid form describes (call after is_valid())."""
        data = self.cleaned_data
        return AuditFilter(
            actor=data["actor"].strip(),
            action=data["action"].strip(),
            task_id=data["task"],
            forced_releases_only=data["forced"],
        )


class UserField(forms.ModelChoiceField):  # type: ignore[type-arg]
    """A user named by user name (what an admin types), not by id."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(queryset=User.objects.all(), to_field_name="username", **kwargs)
        self.error_messages["invalid_choice"] = "There is no user with that name."


class RoleForm(forms.Form):
    username = UserField(label="User name", widget=forms.TextInput)
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class AccountForm(forms.Form):
    username = forms.CharField(label="User name", max_length=150)
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class ScopeForm(forms.Form):
    username = UserField(label="User name", widget=forms.TextInput)
    project = forms.CharField(max_length=100, initial="*", help_text="a project, or * for every project")
    kind = forms.CharField(max_length=100, initial="*", help_text="a task kind, or * for every kind")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("project", "").strip() == "*" and data.get("kind", "").strip() == "*":
            raise forms.ValidationError("Name a project or a kind: operating every task is what the admin role is for.")
        return data


class TaskGrantForm(forms.Form):
    username = UserField(label="User name", widget=forms.TextInput)
    task = forms.IntegerField(max_value=MAX_BIGINT, label="Task id", min_value=1)


class ReviewForm(forms.Form):
    verdict = forms.ChoiceField(
        choices=[("accepted", "Accept: the release was justified"), ("disputed", "Dispute: it was not")],
        widget=forms.RadioSelect,
    )
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        min_length=20,
        max_length=4000,
        help_text="Why, in at least 20 characters: it goes to the audit log.",
    )
