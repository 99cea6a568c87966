"""What both drivers share about talking to Reckon: the base URL, the headers, and when and how long to back off.

429 (rate limited) and 503 (unavailable) are retried after ``Retry-After`` seconds (bounded, jittered); so are
transport errors (refused, reset, timed out). Retrying is safe because every write carries ``If-Match`` and an
``Idempotency-Key``: a write that did land answers its first response again, never a second change."""

import contextlib
import json
import random
from typing import Any

from reckon_client.protocol import Call, Reply

RETRY_STATUSES = frozenset({429, 503})
MAX_ATTEMPTS = 8
MAX_DELAY = 60.0  # seconds: a longer Retry-After is cut to this (the run holds a lease meanwhile)
USER_AGENT = "reckon-client/0.1"


def api_base(url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/api/v1`` → the API's root."""
    url = url.rstrip("/")
    return url if url.endswith("/api/v1") else url + "/api/v1"


def default_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": USER_AGENT}


def retry_delay(attempt: int, retry_after: str | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: the server's Retry-After when it gave one, else exponential
    from 0.25 s; capped at MAX_DELAY, plus up to 25 % jitter so that many agents do not come back together."""
    base: float = 0.25 * 2.0**attempt
    if retry_after:
        with contextlib.suppress(ValueError):  # an HTTP date: use our own backoff
            base = max(float(retry_after), 0.0)
    return min(base, MAX_DELAY) * (1 + random.random() / 4)  # noqa: S311 - jitter, not a secret


def request_args(call: Call) -> dict[str, Any]:
    args: dict[str, Any] = {"method": call.method, "url": call.path, "headers": dict(call.headers)}
    if call.body is not None:
        args["content"] = json.dumps(call.body).encode()
        args["headers"]["Content-Type"] = "application/json"
    return args


def reply_of(status: int, headers: Any, content: bytes) -> Reply:
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = {"code": f"http_{status}", "detail": content[:200].decode(errors="replace")}
    return Reply(status, {k.lower(): v for k, v in headers.items()}, body)
