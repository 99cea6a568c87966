"""/api/v1/tasks/{id}/retained: what an agent keeps of a task outside its checkpoints — a sensitive input, a debug
artifact (minimal fields), temp material — sealed at rest and expiring (retention/services.py). Thin: one service,
the answer (the token's scope is checked before: a task outside it is not found, api/auth.py).

A checkpoint keeps only what a retain answers, ``{"retained": id, "version": n}``. An object whose retention has
ended answers 410 ``retention_expired`` with its kind and name (api/api.py): the agent re-creates the content from
external facts and retains it again, as the next version of the same name, and keeps the new reference — never a
reference to something that is gone. The Python client's ``fetch_or_recreate`` does exactly that."""

import base64
import json
from datetime import datetime, timedelta
from typing import Annotated, Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema
from pydantic import ConfigDict, Field

from api.auth import token_of
from api.http import IDEMPOTENCY, answer, documented
from api.idempotency import idempotent
from api.schemas import Integral, Problem
from retention.models import RetainedKind
from retention.services import NAME_MAX, Ref, Retained, fetch, retain

router = Router(tags=["retained"])

# A retained object's key (RECKON_RETENTION_KEY) an admin must fix: answered 503 to every read and write.
KEY_REFUSALS = ("retention_key_invalid", "retention_key_missing")

# Standard base64 (RFC 4648 §4), padded: exactly what the server decodes, so the document's pattern is the rule.
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
Base64Text = Annotated[str, Field(pattern=BASE64, description="The bytes, base64 (RFC 4648, padded).")]
# Only so that a ttl is a time at all: the service refuses any past RECKON_RETENTION_MAX_EXTENSION (30 days).
TTL_MAX_SECONDS = 10 * 366 * 24 * 3600


def _as_retain_takes_it(schema: dict[str, Any]) -> None:
    """RetainIn's JSON Schema states what retain() takes: a debug artifact's content is a JSON object, any other
    kind's is base64 text, and a ttl is at most RECKON_RETENTION_MAX_EXTENSION (read when the document is made). A
    body the document calls valid is then one the service takes (but for what its content holds: secrets)."""
    ttl = next(s for s in schema["properties"]["ttl_seconds"]["anyOf"] if s.get("type") == "integer")
    ttl["maximum"] = int(settings.RECKON_RETENTION_MAX_EXTENSION.total_seconds())
    content = schema["properties"]["content"]["anyOf"]
    fields = next(s for s in content if s.get("type") == "object")
    text = next(s for s in content if s.get("type") == "string")
    others = [k.value for k in RetainedKind if k != RetainedKind.DEBUG_ARTIFACT]
    schema["oneOf"] = [
        {"properties": {"kind": {"const": RetainedKind.DEBUG_ARTIFACT.value}, "content": fields}},
        {"properties": {"kind": {"enum": others}, "content": text}},
    ]


class RetainIn(Schema):
    model_config = ConfigDict(json_schema_extra=_as_retain_takes_it)

    kind: RetainedKind
    # The next version of this name is retained; stored in the clear beside the reference: no credential in it.
    name: Annotated[str, Field(min_length=1, max_length=NAME_MAX)]
    # A debug_artifact: a JSON object of minimal fields (ids, status codes, a short excerpt; credential-like data is
    # refused). Any other kind: its bytes, base64.
    content: dict[str, Any] | Base64Text
    # Default: the kind's retention (RECKON_RETENTION_TTL); at most RECKON_RETENTION_MAX_EXTENSION.
    ttl_seconds: Annotated[int, Field(strict=True, ge=1, le=TTL_MAX_SECONDS), Integral] | None = None

    def content_value(self) -> bytes | dict[str, Any]:
        if isinstance(self.content, dict):
            return self.content
        return base64.b64decode(self.content, validate=True)

    def ttl(self) -> timedelta | None:
        return timedelta(seconds=self.ttl_seconds) if self.ttl_seconds is not None else None


class RetainedRef(Schema):
    """What a checkpoint keeps of a retained object: its id and version, nothing else."""

    retained: int
    version: int


class RetainedOut(RetainedRef):
    kind: RetainedKind
    name: str
    # Readable until then (the database clock); from then on, 410.
    expires_at: datetime
    # A debug_artifact: its fields. Any other kind: its bytes, base64.
    content: dict[str, Any] | str


class GoneProblem(Problem):
    """410 retention_expired: the object's retention has ended. Re-create ``kind`` ``name`` from external facts and
    retain it again (the next version); keep the new reference instead of this one."""

    retained: int | None = None
    version: int | None = None
    kind: str | None = None
    name: str | None = None


def retained_out(read: Retained) -> RetainedOut:
    """A debug artifact's plaintext is the canonical JSON of its fields: answered as them. Other kinds: base64."""
    content: dict[str, Any] | str
    if read.kind == RetainedKind.DEBUG_ARTIFACT:
        content = json.loads(read.content)
    else:
        content = base64.b64encode(read.content).decode()
    return RetainedOut(
        retained=read.ref.id,
        version=read.ref.version,
        kind=RetainedKind(read.kind),
        name=read.name,
        expires_at=read.expires_at,
        content=content,
    )


@router.post(
    "/tasks/{task_id}/retained",
    response={201: RetainedRef},
    summary="Retain an object of the task (sealed, expiring)",
    openapi_extra=documented(IDEMPOTENCY, refuses=("retention_refused", "secret_in_payload", *KEY_REFUSALS)),
)
def retained_new(request: HttpRequest, task_id: int, payload: RetainIn) -> HttpResponse:
    """Seal ``content`` as the next version of ``name`` and answer the reference a checkpoint keeps,
    ``{"retained": id, "version": n}`` (``Location``: where to read it). Refused before anything is written:
    422 secret_in_payload (a debug artifact or a name holding something credential-like), 422 retention_refused (a
    debug artifact that is not an object, bytes sent as an object, a ttl past the bound), 413 payload_too_large."""
    token = token_of(request)

    def run() -> HttpResponse:
        ref = retain(
            task_id=task_id,
            kind=payload.kind.value,
            name=payload.name,
            content=payload.content_value(),
            ttl=payload.ttl(),
        )
        response = answer(RetainedRef(retained=ref.id, version=ref.version), 201)
        response["Location"] = f"/api/v1/tasks/{task_id}/retained/{ref.id}/versions/{ref.version}"
        return response

    # retain writes its file outside any transaction, then its row: the key's record follows it.
    return idempotent(request, token.agent_id, run, atomic=False)


@router.get(
    "/tasks/{task_id}/retained/{retained_id}/versions/{version}",
    response={200: RetainedOut, 410: GoneProblem},
    summary="Read a retained object",
    openapi_extra=documented(
        refuses=(
            "retention_not_found",
            "retention_expired",
            "retention_corrupt",
            "retention_key_mismatch",
            *KEY_REFUSALS,
        )
    ),
)
def retained_read(request: HttpRequest, task_id: int, retained_id: int, version: int) -> Any:
    """The content, checked against its digest, while the object's retention lasts. 410 retention_expired once it
    has ended (purged or not yet): re-create it from external facts and retain it again; 404 retention_not_found
    (no such object of this task); 409 retention_corrupt (altered or missing: never re-create over it)."""
    return retained_out(fetch(Ref(retained_id, version), task_id=task_id))
