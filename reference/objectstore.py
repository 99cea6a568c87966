"""The object-store connector: a stdlib HTTP client for the store (harness/simulator.py speaks its API).

Two ways to be idempotent (DESIGN §6), chosen per store:

    ObjectStoreConnector(url)                     # "remote": the store dedupes by op key; lookup = GET /ops/<op_key>
    ObjectStoreConnector(url, idempotency="tag")  # "tag": it does not; every write is tagged with its op key, lookup
                                                  # queries by tag, and a write first asks whether its op key already
                                                  # committed: only a definite "not found" lets it send

Either way a store that cannot be queried (501) makes an unknown operation Unprovable: a person decides.

A final "not found": ``fence(op_key)`` (POST /fence/<op_key>) asks the store to refuse op_key from now on unless it
already took effect; every write carries its deadline as the header ``Reckon-Not-After``, and the store refuses a
write that reaches it later. A write refused as fenced answers ``Fenced``; one refused for its deadline is a
``dependency_unavailable`` failure: it took no effect, and it is retried on the budget, not sent again for free — a
store whose clock runs ahead of the database's by more than the deadline refuses every copy, and must not loop.
"""

import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any, Literal
from urllib.parse import quote

from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Accepted, Committed, Failed, Fenced, NotFound, Outcome, Unprovable
from tasks.engine.connectors import SourceNotFound

ACTION_PREFIX = "store."
type Idempotency = Literal["remote", "tag"]

# DESIGN §6: a write's HTTP refusal → its failure class. Anything else after sending is an unknown outcome.
_SUBMIT_FAILURES = {
    400: FailureClass.INVALID_PARAMS,
    422: FailureClass.INVALID_PARAMS,
    401: FailureClass.PERMISSION_REVOKED,
    403: FailureClass.PERMISSION_REVOKED,
    409: FailureClass.CONFLICT,
    429: FailureClass.DEPENDENCY_UNAVAILABLE,
    503: FailureClass.DEPENDENCY_UNAVAILABLE,
}
_LATE = (
    "HTTP 409 deadline_passed: the store refused the write as arriving after its deadline (Reckon-Not-After), with no "
    "effect: it was held in flight, or the store's clock runs ahead of the database's by more than "
    "RECKON_REQUEST_DEADLINE_SECONDS"
)


class _Interrupted(Exception):
    """The request may have reached the remote, but no answer came back."""


class _Unreachable(Exception):
    """The request never left: nothing can have happened remotely."""


class ObjectStoreConnector:
    """Talks to the object store at ``base_url``. Satisfies tasks.engine.connectors.Connector."""

    def __init__(self, base_url: str, *, timeout: float = 5.0, idempotency: Idempotency = "remote") -> None:
        if idempotency not in ("remote", "tag"):
            raise ValueError(f"idempotency is 'remote' or 'tag', not {idempotency!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.idempotency = idempotency

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self._request(op_key, request)

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self._request(op_key, request)

    def delete(self, op_key: str, locator: str) -> Outcome:
        return self._write(op_key, "delete", {"locator": locator})

    def fence(self, op_key: str) -> Outcome:
        """What became of ``op_key``, final (tasks.engine.connectors.Fencing): Committed / Accepted, or Fenced. A
        store that cannot fence (501) is asked as ``lookup`` asks: its not found waits for the deadline."""
        try:
            status, answer = self._call("POST", "/fence/" + quote(op_key, safe=""), {})
        except (_Unreachable, _Interrupted) as exc:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, f"fence failed: {exc}")
        if status == 200 and answer.get("state") == "fenced":
            return Fenced()
        if status == 200:
            return _outcome(answer)
        if status == 501:
            return self.lookup(op_key)
        return Failed(FailureClass.CONNECTION_INTERRUPTED, f"fence failed: HTTP {status}")

    def lookup(self, op_key: str) -> Outcome:
        route = "/ops/" if self.idempotency == "remote" else "/ops-by-tag/"
        try:
            status, answer = self._call("GET", route + quote(op_key, safe=""))
        except (_Unreachable, _Interrupted) as exc:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, f"lookup failed: {exc}")
        if status == 200:
            return _outcome(answer)
        if status == 404:
            return NotFound()
        if status == 501:
            how = "by op key" if self.idempotency == "remote" else "by tag"
            return Unprovable(f"the object store cannot be queried {how}")
        # The query failed, not the write: its outcome is still unknown.
        return Failed(FailureClass.CONNECTION_INTERRUPTED, f"lookup failed: HTTP {status}")

    def current_version(self, locator: str) -> str:
        try:
            status, answer = self._call("GET", f"/versions/{quote(locator, safe='')}")
        except (_Unreachable, _Interrupted) as exc:
            raise ConnectionError(f"version of {locator}: {exc}") from exc
        if status == 404:
            raise SourceNotFound(locator)
        if status != 200 or not isinstance(answer.get("version"), str):
            raise ConnectionError(f"version of {locator}: HTTP {status}")
        return str(answer["version"])

    def max_batch(self) -> int:
        """The store's transaction boundary: the most objects one copy may span. Batches are sized by this."""
        try:
            status, answer = self._call("GET", "/limits")
        except (_Unreachable, _Interrupted) as exc:
            raise ConnectionError(f"limits: {exc}") from exc
        limit = answer.get("max_batch")
        if status != 200 or not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ConnectionError(f"limits: HTTP {status}")
        return limit

    def _request(self, op_key: str, request: dict[str, Any]) -> Outcome:
        action = str(request.get("action", ""))
        if not action.startswith(ACTION_PREFIX):
            return Failed(FailureClass.INVALID_PARAMS, f"the object store has no action {action!r}")
        deadline = request.get("not_after")
        not_after = deadline if isinstance(deadline, str) else ""
        return self._write(op_key, action.removeprefix(ACTION_PREFIX), request.get("input", {}), not_after)

    def _write(self, op_key: str, action: str, params: Any, not_after: str = "") -> Outcome:
        """POST the action once under ``op_key``; in tag mode only after the tag query proved it never committed."""
        if self.idempotency == "tag":
            prior = self.lookup(op_key)
            if isinstance(prior, Failed):
                return Failed(FailureClass.CONNECTION_INTERRUPTED, f"not sent: {prior.detail}")
            if not isinstance(prior, NotFound):
                return prior  # committed (or running) already, or unprovable: never send blindly
        body = {"action": action, "params": params}
        headers = {"Reckon-Not-After": not_after} if not_after else {}
        try:
            status, answer = self._call("POST", f"/ops/{quote(op_key, safe='')}", body, headers)
        except _Unreachable as exc:
            return Failed(FailureClass.DEPENDENCY_UNAVAILABLE, f"not sent: {exc}")
        except _Interrupted as exc:
            return Failed(FailureClass.CONNECTION_INTERRUPTED, str(exc))
        if status == 200:
            return _outcome(answer)
        if status == 409 and answer.get("error") == "fenced":
            return Fenced()  # refused for ever: op_key never takes effect
        if status == 409 and answer.get("error") == "deadline_passed":
            # It took no effect. Not a "not found" to send again for free: a store whose clock runs ahead of the
            # database's by more than the deadline refuses every copy, so each one is a retry on the budget.
            return Failed(FailureClass.DEPENDENCY_UNAVAILABLE, _LATE)
        detail = f"HTTP {status}: {answer.get('detail') or answer.get('error') or ''}".rstrip(": ")
        failure = _SUBMIT_FAILURES.get(status)
        if failure is None:
            # A 5xx other than 503 (or an unexpected status) says nothing about whether the write happened.
            failure = FailureClass.INVALID_PARAMS if 400 <= status < 500 else FailureClass.CONNECTION_INTERRUPTED
        return Failed(failure, detail)

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        sent = {"Content-Type": "application/json"} | (headers or {})
        req = urllib.request.Request(  # noqa: S310 - base_url is configuration, not user input
            self.base_url + path, data=data, method=method, headers=sent
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:  # noqa: S310
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, _json(exc.read())
        except urllib.error.URLError as exc:
            # Raised while connecting or sending: refused means the request never left.
            if isinstance(exc.reason, ConnectionRefusedError | socket.gaierror):
                raise _Unreachable(str(exc.reason)) from exc
            raise _Interrupted(str(exc.reason)) from exc
        except (TimeoutError, http.client.HTTPException, OSError) as exc:
            # Raised while waiting for the answer: the remote may have committed.
            raise _Interrupted(f"{type(exc).__name__}: {exc}") from exc


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _outcome(answer: dict[str, Any]) -> Outcome:
    receipt = answer.get("receipt") or {}
    if answer.get("state") == "accepted":
        return Accepted(remote_id=str(receipt.get("remote_id", "")))
    if answer.get("state") != "committed":
        return Failed(FailureClass.CONNECTION_INTERRUPTED, f"unexpected answer {answer.get('state')!r}")
    count, temp = receipt.get("count"), receipt.get("temp")
    return Committed(
        remote_id=str(receipt.get("remote_id", "")),
        remote_version=str(receipt.get("remote_version") or ""),
        count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        digest=str(receipt.get("digest") or ""),
        # Staging objects the write created, for the caller to register for cleanup.
        data={"temp": [str(locator) for locator in temp]} if isinstance(temp, list) and temp else {},
    )
