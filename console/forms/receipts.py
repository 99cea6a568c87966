"""The receipt's fields as the forms ask for them (settling by hand, a takeover's result): one form field per name of
tasks.core.outcomes.RECEIPT_FIELDS, in that order, each as the receipt row holds it — its length, its type — and none
required (which one is, each form decides)."""

from typing import Any

from django import forms
from django.db import models

from tasks.core.outcomes import RECEIPT_FIELDS
from tasks.models import Receipt


def receipt_form_fields(**help_texts: str) -> dict[str, forms.Field]:
    """A new form field for each receipt field, by name; ``help_texts`` by name. The count is zero or more, as the
    row's check constraint wants."""
    fields: dict[str, forms.Field] = {}
    for name in RECEIPT_FIELDS:
        extra: dict[str, Any] = {"min_value": 0} if name == "count" else {}
        column = Receipt._meta.get_field(name)
        field = None
        if isinstance(column, models.Field):
            field = column.formfield(required=False, help_text=help_texts.get(name, ""), **extra)
        if field is None:  # every receipt field is a column a form can ask for
            raise TypeError(f"the receipt field {name} has no form field")
        fields[name] = field
    return fields
