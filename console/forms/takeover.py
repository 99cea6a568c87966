"""The takeover screen's forms: renew, release, approve, the result (built from the nodes' evidence specs) and the
re-plan. Every form that changes a task carries the version the page showed (``expected_version``): the service
refuses a stale one. Forms check shapes only; every rule is the services'."""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core.files.uploadedfile import UploadedFile

from audit.reasons import MIN_REASON
from console.forms.receipts import receipt_form_fields
from tasks.core.errors import NodeNotReady
from tasks.core.outcomes import RECEIPT_FIELDS
from tasks.core.parsing import MAX_BIGINT, UnreadableInput, strict_json
from tasks.decide.decisions import resolved_input
from tasks.decide.evidence import expected_values
from tasks.models import Node
from tasks.people.attachments import (
    ATTACHMENT_CAP_BYTES,
    AttachmentIn,
    attachment_path,
    read_attachment,
    store_attachment,
)
from tasks.people.takeover import NodeResult

DECISIONS = [
    ("resume_agent", "Resume the agent — it re-reads its inputs and open operations first"),
    ("end_task", "End the task"),
    ("replan", "Re-plan — the task pauses for a new plan"),
]
END_STATUSES = [("", "—"), ("completed", "completed (every step has a receipt)"), ("failed", "failed")]
STAGES = [("review", "review"), ("confirm", "confirm")]


class VersionedForm(forms.Form):
    expected_version = forms.IntegerField(max_value=MAX_BIGINT, min_value=1, widget=forms.HiddenInput)


class LeaseForm(forms.Form):
    """Identifies the lease the page was rendered with (its epoch): a page from an older grant writes nothing."""

    epoch = forms.IntegerField(max_value=MAX_BIGINT, min_value=1, widget=forms.HiddenInput)


class RenewForm(LeaseForm):
    renewal_seq = forms.IntegerField(max_value=MAX_BIGINT, min_value=0, widget=forms.HiddenInput)


class ReleaseForm(LeaseForm):
    reason = forms.CharField(
        max_length=500,
        required=False,
        label="Reason (optional)",
        help_text="Why you give the task back without a decision; it stays with people for another operator.",
    )


class ApproveForm(VersionedForm):
    node_key = forms.CharField(max_length=100, widget=forms.HiddenInput)
    # The digest of the requests the page showed: the approval permits exactly those (a stale page is refused).
    approving = forms.CharField(max_length=71, widget=forms.HiddenInput)
    # How long the approval binds, in minutes; empty: the deployment's default (the service bounds it).
    valid_minutes = forms.IntegerField(required=False, min_value=1, max_value=1_000_000, label="Valid for (minutes)")
    note = forms.CharField(max_length=2000, required=False, label="Note", widget=forms.Textarea(attrs={"rows": 2}))
    # Approve and hand the task back to the agent in one step (the usual case), or only approve and keep it.
    resume = forms.BooleanField(required=False)


class ReplanProposeForm(VersionedForm):
    plan = forms.CharField(label="Plan (JSON)", widget=forms.Textarea(attrs={"rows": 18, "spellcheck": "false"}))
    reason = forms.CharField(min_length=MIN_REASON, max_length=500, label="Why re-plan")

    def clean_plan(self) -> Any:
        try:
            return strict_json(self.cleaned_data["plan"])
        except UnreadableInput as error:
            raise forms.ValidationError(str(error)) from None


class ReplanAcceptForm(VersionedForm):
    revision_id = forms.IntegerField(max_value=MAX_BIGINT, min_value=1, widget=forms.HiddenInput)


@dataclass(frozen=True)
class NodeFields:
    """The fields of one node's result in the result form, and what its evidence spec expects."""

    node: Node
    expects: dict[str, Any]  # evidence field → the value the spec pins (None: read from a step not done yet)
    names: dict[str, str]  # receipt field / "evidence" / "file" / "stored" → form field name


def _field(key: str, name: str) -> str:
    return f"n-{key}-{name}"


_REMOTE_ID_FIELD = re.compile(r"n-(.+)-remote_id")


def posted_steps(data: Iterable[str]) -> list[str]:
    """The step keys a posted result form carries fields for (each step's fieldset posts its remote id field, empty
    or not), in the order posted: the form is read for those steps, whichever page listed them. Only the shape is
    read here: tasks.reads.takeover checks the keys and caps how many are read."""
    return [m.group(1) for name in data if (m := _REMOTE_ID_FIELD.fullmatch(name)) is not None]


class ResultForm(VersionedForm, LeaseForm):
    """A takeover result: a receipt per node the person did by hand — typed fields from that node's evidence
    spec — evidence items, attachments and a note, and one decision. Two stages: ``review`` validates and shows
    what will change (nothing written, files stored by digest only), ``confirm`` applies it."""

    stage = forms.ChoiceField(choices=STAGES, initial="review")  # the button pressed: review, or confirm
    decision = forms.ChoiceField(choices=DECISIONS, widget=forms.RadioSelect, label="Decision")
    end_status = forms.ChoiceField(choices=END_STATUSES, required=False, label="If you end the task, it ends")
    replan_reason = forms.CharField(
        max_length=500, required=False, label="If you re-plan: why (10 characters at least)"
    )
    note = forms.CharField(max_length=4000, required=False, label="Note", widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(
        self,
        *args: Any,
        nodes: list[Node],
        all_nodes: list[Node],
        offered: list[Node] | None = None,
        unreadable: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``nodes``: the steps the form reads (tasks.reads.takeover.TakeoverState.resultable: a bounded page of
        those a result could name, and those asked for by key); ``all_nodes``: the nodes their inputs are resolved
        from; ``offered``: those the page shows (all of them unless given); ``unreadable``: step key → why no result
        can be given for it. A result posted for a step not offered — a page from before its approval lapsed, a
        forged one — is still read, so the service refuses it by name instead of the form dropping it unseen; one
        posted for an unreadable step is refused by the form, by its sentence."""
        super().__init__(*args, **kwargs)
        self.node_fields = [self._add_node(node, all_nodes) for node in nodes]
        self.offered = {n.key for n in (nodes if offered is None else offered)}
        self.unreadable = unreadable or {}

    def _add_node(self, node: Node, all_nodes: list[Node]) -> NodeFields:
        try:
            expects = expected_values(node, {"input": resolved_input(all_nodes, node)})
        except NodeNotReady:
            expects = {name: None for name in node.evidence if name != "remote_id"}
        # The remote id always; each other receipt field the node's evidence spec pins, with what it must be.
        hints = {"remote_id": "The id the external system gave the result."} | {
            name: f"Must be {expects[name]!r}." if expects.get(name) is not None else "Pinned by the step's input."
            for name in RECEIPT_FIELDS
            if name in node.evidence and name != "remote_id"
        }
        names: dict[str, str] = {}
        for name, field in receipt_form_fields(**hints).items():
            if name in hints:
                names[name] = _field(node.key, name)
                self.fields[names[name]] = field
        names["evidence"] = _field(node.key, "evidence")
        self.fields[names["evidence"]] = forms.CharField(
            max_length=4000,
            required=False,
            label="Evidence items",
            help_text="One per line, as kind: value — e.g. console_url: https://store.example/batches/7",
            widget=forms.Textarea(attrs={"rows": 2}),
        )
        names["file"] = _field(node.key, "file")
        self.fields[names["file"]] = forms.FileField(
            required=False, label="Attachment", help_text=f"At most {ATTACHMENT_CAP_BYTES // (1024 * 1024)} MiB."
        )
        names["stored"] = _field(node.key, "stored")
        self.fields[names["stored"]] = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)
        return NodeFields(node=node, expects=expects, names=names)

    def node_rows(self) -> list[tuple[NodeFields, list[forms.BoundField]]]:
        """Each node's fields, bound, in the order the template shows them."""
        return [
            (nf, [self[name] for name in nf.names.values()]) for nf in self.node_fields if nf.node.key in self.offered
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for key, why in self.unreadable.items():
            if str(self.data.get(_field(key, "remote_id"), "")).strip():
                self.add_error(None, f"No result can be recorded here: {why}.")
        for nf in self.node_fields:
            given = [cleaned.get(nf.names[n]) for n in RECEIPT_FIELDS if n != "remote_id" and n in nf.names]
            if not cleaned.get(nf.names["remote_id"]) and any(v not in (None, "") for v in given):
                self.add_error(nf.names["remote_id"], "A result for this step needs the remote id.")
            for line in (cleaned.get(nf.names["evidence"]) or "").splitlines():
                if line.strip() and ":" not in line:
                    self.add_error(nf.names["evidence"], f"Write each item as kind: value ({line.strip()[:40]!r}).")
            upload: UploadedFile[bytes] | None = cleaned.get(nf.names["file"])
            if upload is not None and (upload.size or 0) > ATTACHMENT_CAP_BYTES:  # refused before it is read
                self.add_error(
                    nf.names["file"],
                    f"The file is {upload.size} bytes, over the {ATTACHMENT_CAP_BYTES // (1024 * 1024)} MiB cap: "
                    "attach a smaller file, or a reference to where it is kept.",
                )
        return cleaned

    def stored_attachments(self) -> dict[str, list[tuple[str, str]]]:
        """Store each uploaded file by its digest (the bytes only, outside any transaction: no database row until
        the result is confirmed) and return node key → [(name, sha256)], with those a review already stored."""
        stored: dict[str, list[tuple[str, str]]] = {}
        for nf in self.node_fields:
            items = _parse_stored(self.cleaned_data.get(nf.names["stored"]) or "")
            upload: UploadedFile[bytes] | None = self.cleaned_data.get(nf.names["file"])
            if upload is not None:
                content = upload.read(ATTACHMENT_CAP_BYTES + 1)  # clean() refused a larger one by its size
                sha256, _size = store_attachment(AttachmentIn(name=upload.name or "attachment", content=content))
                items.append((upload.name or "attachment", sha256))
            if items:
                stored[nf.node.key] = items
        return stored

    def results(self, stored: dict[str, list[tuple[str, str]]]) -> list[NodeResult]:
        results = []
        for nf in self.node_fields:
            remote_id = (self.cleaned_data.get(nf.names["remote_id"]) or "").strip()
            if not remote_id:
                continue
            evidence = [
                {"kind": kind.strip(), "value": value.strip()}
                for kind, _sep, value in (
                    line.partition(":") for line in (self.cleaned_data.get(nf.names["evidence"]) or "").splitlines()
                )
                if kind.strip()
            ]
            # The receipt fields this node's form asks for; the others stay as NodeResult leaves them (empty).
            receipt = {name: self.cleaned_data.get(nf.names[name]) for name in RECEIPT_FIELDS if name in nf.names}
            results.append(
                NodeResult(
                    node_key=nf.node.key,
                    **(receipt | {"remote_id": remote_id}),
                    evidence=evidence,
                    attachments=[
                        AttachmentIn(name=name, content=read_attachment(sha256))
                        for name, sha256 in stored.get(nf.node.key, [])
                    ],
                )
            )
        return results


def stored_field_value(items: list[tuple[str, str]]) -> str:
    return "\n".join(f"{sha256} {name}" for name, sha256 in items)


def _parse_stored(text: str) -> list[tuple[str, str]]:
    items = []
    for line in text.splitlines():
        sha256, _sep, name = line.strip().partition(" ")
        if len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256) and attachment_path(sha256).exists():
            items.append((name or "attachment", sha256))
    return items
