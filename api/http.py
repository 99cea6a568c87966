"""What the agent API reads from a request's headers: the version a write is conditional on (``If-Match``), the
lease it is made under (``Reckon-Lease``), and how answers carry the version back (``ETag``)."""

from collections.abc import Sequence
from functools import cache
from typing import Any, Literal

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Schema

from api.models import ApiToken
from leases.models import HolderKind, Lease
from tasks.core.parsing import ascii_int


class ApiError(Exception):
    """A refusal of the API layer itself (not of a service): answered as the problem its ``code`` maps to."""

    code = "api_error"


class TempResourceNotFound(ApiError):
    """The temp resource id is not one of the task in the path."""

    code = "temp_resource_not_found"


class NodeNotFound(ApiError):
    """The node key is not a node of the task's current plan."""

    code = "node_not_found"


class ReceiptNotFound(ApiError):
    """The node exists, but no effect of it has a receipt yet."""

    code = "receipt_not_found"


class OperationNotFound(ApiError):
    """The op key is not an operation of the task in the path."""

    code = "operation_not_found"


class KindNotFound(ApiError):
    """The task kind in the path is outside the token's scope, or no task could be of it: the same answer either way
    (api.tokens.require_kind_scope)."""

    code = "kind_not_found"


class HeaderError(ApiError):
    """A header the operation needs is missing or is not what it should be."""

    code = "precondition_required"


class PreconditionRequired(HeaderError):
    code = "precondition_required"


class InvalidHeader(HeaderError):
    code = "invalid_header"


class LeaseNotHeld(HeaderError):
    """``Reckon-Lease`` names no lease of this agent on this task (never granted to it, or another task's)."""

    code = "lease_not_held"


LEASE_HEADER = "Reckon-Lease"


def expected_version(request: HttpRequest, *, required: bool = True) -> int | None:
    """The task version of ``If-Match`` (``"7"``, ``7`` or ``W/"7"``); PreconditionRequired if absent and needed."""
    raw = request.headers.get("If-Match")
    if raw is None:
        if required:
            raise PreconditionRequired("This write is a compare-and-set: send the task version as If-Match.")
        return None
    value = ascii_int(raw.strip().removeprefix("W/").strip('"'))
    if value is None:
        raise InvalidHeader(f"If-Match must be one task version (an ETag of this API), not {raw[:40]!r}.")
    return value


def held_lease(request: HttpRequest, token: ApiToken, task_id: int) -> Lease:
    """The lease ``Reckon-Lease`` names, if it was granted to this token's agent on this task (open or not: a
    lapsed one is refused by the write itself, as lease_lost or lease_expired)."""
    lease = optional_lease(request, token, task_id)
    if lease is None:
        raise PreconditionRequired(f"Send the lease this write is made under as {LEASE_HEADER}: <lease_id>.")
    return lease


def optional_lease(request: HttpRequest, token: ApiToken, task_id: int) -> Lease | None:
    raw = request.headers.get(LEASE_HEADER)
    if raw is None:
        return None
    lease_id = ascii_int(raw.strip())
    if lease_id is None:
        raise InvalidHeader(f"{LEASE_HEADER} is a lease id (a number), not {raw[:40]!r}.")
    lease = prefetched_lease(token, lease_id, task_id)
    if lease is False:
        found = list(Lease.objects.raw(_lease_sql(), [lease_id, task_id, HolderKind.AGENT.value, token.agent_id]))
        lease = found[0] if found else None
    if lease is None:
        raise LeaseNotHeld(f"Lease {lease_id} is not a lease of agent {token.agent_id} on task {task_id}.")
    return lease


def prefetched_lease(token: ApiToken, lease_id: int, task_id: int) -> Lease | Literal[False] | None:
    """The lease read with the token (``api_token_authenticate(…, lease_id=…)``): the Lease, None when it is not this
    agent's lease on that task, or False when it was not read with the token (ask the database)."""
    read = token.task_read
    if read is None or (read.task_id, read.lease_id) != (task_id, lease_id):
        return False
    return read.lease


@cache
def _lease_sql() -> str:
    """A lease by id, if it is of this task and held by this agent: SQL made once (the ORM compiled the query again
    on every request)."""
    q = connection.ops.quote_name
    return (
        f"SELECT * FROM {q(Lease._meta.db_table)} WHERE {q('id')} = %s AND {q('task_id')} = %s"  # noqa: S608
        f" AND {q('holder_kind')} = %s AND {q('holder_id')} = %s"
    )


def with_version(response: HttpResponse, version: int) -> HttpResponse:
    response["ETag"] = f'"{version}"'
    return response


def answer(body: Schema, status: int = 200, *, version: int | None = None) -> HttpResponse:
    """``body`` as the JSON answer, with the task version as its ETag when given (the Idempotency-Key record keeps
    exactly this response: api/idempotency.py)."""
    response = JsonResponse(body.model_dump(mode="json"), status=status)
    return with_version(response, version) if version is not None else response


# The key of an operation's ``openapi_extra`` that names the codes its services may refuse it with (documented()).
REFUSES = "x-reckon-refuses"


def documented(*parameters: dict[str, Any], refuses: Sequence[str] = ()) -> dict[str, Any]:
    """An operation's ``openapi_extra``: the headers it reads, and the codes its services may refuse it with. The
    document declares each operation's problem statuses from these and from what the operation takes (its path,
    query, body and headers: api.errors.declared_problems), and from nothing else."""
    return {"parameters": list(parameters), REFUSES: list(refuses)}


def header_parameter(name: str, description: str, *, required: bool, pattern: str | None = None) -> dict[str, Any]:
    """A header the OpenAPI document names for an operation (read by the handler from ``request.headers``), with the
    pattern of what the handler reads from it: a value outside it is refused (400 invalid_header, 422 for an
    Idempotency-Key), a value inside it is read."""
    schema = {"type": "string", **({"pattern": pattern} if pattern is not None else {})}
    return {"in": "header", "name": name, "required": required, "description": description, "schema": schema}


# What ascii_int reads (a version or a lease id; 18 digits stay within a 64-bit column), and ascii_token's key
# (printable ASCII; the spaces around a header's value are not part of it).
VERSION_PATTERN = r'^(W/)?"?[0-9]{1,18}"?$'
ID_PATTERN = r"^[0-9]{1,18}$"
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]([ -~]{0,198}[!-~])?$"

LEASE = header_parameter(
    LEASE_HEADER, "The lease_id of the lease this request is made under.", required=True, pattern=ID_PATTERN
)
IF_MATCH = header_parameter(
    "If-Match",
    'The task version this write is conditional on (an ETag, e.g. "7").',
    required=True,
    pattern=VERSION_PATTERN,
)
IDEMPOTENCY = header_parameter(
    "Idempotency-Key",
    "Replays the first answer to the same request.",
    required=False,
    pattern=IDEMPOTENCY_KEY_PATTERN,
)
