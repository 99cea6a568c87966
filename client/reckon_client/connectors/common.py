"""What the connectors share: the write request they are handed, its deadline, the op key and a request's digest.

A request is ``{"action": str, "input": {...}, "not_after": "<ISO 8601 with its UTC offset>"}`` (``not_after``
optional). ``WriteRequest.parse`` reads it or raises ``InvalidRequest``, which a connector answers
``Failed("invalid_params")`` with nothing sent. The request's digest covers action and input, never the deadline: the
same write sent again under its op key (Reckon gives every send a new deadline) is the same request.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

# Reckon's op keys are short printable ASCII ("rk-<task>-p<plan>-<node>-<n>"); anything else is refused before it
# reaches a header, an object key or a ledger row.
_OP_KEY = re.compile(r"[\x21-\x7e]{1,255}")


class InvalidRequest(ValueError):
    """A request the connector refuses before sending anything: answered ``Failed("invalid_params")``."""


class SourceNotFound(LookupError):
    """The external system holds nothing at this locator (``current_version``)."""


@dataclass(frozen=True)
class WriteRequest:
    action: str
    input: Mapping[str, Any]
    not_after: datetime | None
    digest: str  # sha256 of the canonical {"action", "input"}: the same write sent again has the same digest

    @classmethod
    def parse(cls, request: object) -> "WriteRequest":
        if not isinstance(request, Mapping):
            raise InvalidRequest(f"a request is a mapping, not {type(request).__name__}")
        action, given = request.get("action"), request.get("input", {})
        if not isinstance(action, str) or not action:
            raise InvalidRequest("the request names no action")
        if not isinstance(given, Mapping):
            raise InvalidRequest(f"the input is a mapping, not {type(given).__name__}")
        return cls(
            action=action,
            input=given,
            not_after=parse_deadline(request.get("not_after")),
            digest=digest_of({"action": action, "input": given}),
        )

    def late(self, now: datetime) -> bool:
        """Past its deadline at ``now``: the request must take no effect."""
        return self.not_after is not None and now > self.not_after


def parse_deadline(value: object) -> datetime | None:
    """``not_after`` as an aware datetime (None when the request carries none)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidRequest(f"not_after {value!r} is not an ISO 8601 time") from exc
    else:
        raise InvalidRequest(f"not_after is an ISO 8601 string, not {type(value).__name__}")
    if moment.tzinfo is None:
        raise InvalidRequest(f"not_after {value!r} needs its UTC offset")
    return moment


def digest_of(value: object) -> str:
    """sha256 of the canonical JSON of ``value`` (sorted keys, no spaces): the same data, the same digest."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"the request is not JSON data: {exc}") from exc
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def op_key_problem(op_key: object) -> str | None:
    """Why ``op_key`` cannot be an idempotency key (None when it can): 1 to 255 printable ASCII characters."""
    if isinstance(op_key, str) and _OP_KEY.fullmatch(op_key):
        return None
    return f"an op key is 1 to 255 printable ASCII characters without spaces, not {op_key!r:.80}"


def utc_now() -> datetime:
    return datetime.now(UTC)


def seconds(value: float | timedelta) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def text_field(given: Mapping[str, Any], name: str, *, limit: int = 1024) -> str:
    value = given.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"input.{name} is a non-empty string")
    if len(value) > limit:
        raise InvalidRequest(f"input.{name} is longer than {limit} characters")
    return value


def optional_text(given: Mapping[str, Any], name: str, *, limit: int = 1024) -> str | None:
    return None if given.get(name) is None else text_field(given, name, limit=limit)
