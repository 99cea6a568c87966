"""HTTP APIs with an ``Idempotency-Key`` header (httpx), one write per op key, configured per API.

    from reckon_client.connectors.http import HttpApi, HttpConnector, Route

    api = HttpApi(
        actions={"transfer": Route("POST", "/v1/transfers"), "reverse": Route("POST", "/v1/transfers/{id}/reversal")},
        lookup=Route("GET", "/v1/idempotency/{op_key}"),
        fence=Route("POST", "/v1/idempotency/{op_key}/fence"),
        version=Route("GET", "/v1/sources/{locator}"),
    )
    with HttpConnector("https://payments.internal", api, headers={"Authorization": "Bearer …"}) as payments:
        payments.submit(op_key, {"action": "transfer", "input": {"amount": 100, "to": "acct_1"}, "not_after": "…"})

A write is the action's route with the request's input as its JSON body, the op key as ``Idempotency-Key`` and the
deadline as ``Reckon-Not-After``. What the API must do — the idempotency-key draft of the IETF httpapi group, as Stripe
implements it — and what each answer means here:

- same key, same body: the stored answer again, no second effect (→ the same ``Committed``);
- same key, another body: ``422`` (→ ``invalid_params``, nothing written);
- the key's first request still in flight: ``409`` (→ ``connection_interrupted``: unknown, settled by ``lookup``);
- past the deadline: refused, no effect and nothing stored (``412`` by default → ``dependency_unavailable``); the
  connector also refuses to send a request already past it;
- ``lookup`` by key: the stored answer (``200``/``201``), ``404`` never seen, ``409`` in flight, ``410`` fenced. An API
  without one cannot say what became of a lost answer: ``lookup`` answers ``Unprovable`` and a person decides;
- ``fence`` by key (optional): the stored answer if it took effect, else ``410`` — the key refused from now on. Without
  a fence route, ``fence`` answers as ``lookup`` (a "not found" is then final only past the deadline).

Other answers (``HttpApi.failures``): DESIGN §7's classes — 400/422 ``invalid_params``, 401/403
``permission_revoked``, 429/503 ``dependency_unavailable`` — any other 4xx ``invalid_params``, and a 5xx, a timeout or
a connection lost after sending ``connection_interrupted`` (the write may have happened: settled by ``lookup``). A
connection that never opened is ``dependency_unavailable``. ``202`` is ``Accepted`` (running at the remote).
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from reckon_client.connectors.common import (
    InvalidRequest,
    SourceNotFound,
    WriteRequest,
    op_key_problem,
    utc_now,
)
from reckon_client.outcomes import Accepted, Committed, Failed, FailureClass, Fenced, NotFound, Outcome, Unprovable

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)

DEFAULT_FAILURES: Mapping[int, FailureClass] = {
    400: "invalid_params",
    422: "invalid_params",
    401: "permission_revoked",
    403: "permission_revoked",
    412: "dependency_unavailable",  # the deadline passed: refused with no effect
    429: "dependency_unavailable",
    503: "dependency_unavailable",
}


@dataclass(frozen=True)
class Route:
    """A method and a path template: ``{op_key}``, ``{locator}`` or a field of the request's input, URL-quoted."""

    method: str
    path: str

    def url(self, values: Mapping[str, Any]) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            found = values.get(name)
            if not isinstance(found, str | int) or isinstance(found, bool) or found == "":
                raise InvalidRequest(f"the route {self.path} needs {name!r}, a non-empty string or integer")
            return quote(str(found), safe="")

        return _FIELD.sub(value, self.path)


def default_receipt(body: Mapping[str, Any]) -> Committed:
    """The receipt from a success's JSON body: ``id`` (required), ``version``, ``count``, ``digest``."""
    remote_id, count = body.get("id"), body.get("count")
    if not isinstance(remote_id, str | int) or isinstance(remote_id, bool) or remote_id == "":
        raise ValueError("the answer names no id")
    return Committed(
        remote_id=str(remote_id),
        remote_version=str(body.get("version") or ""),
        count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        digest=str(body.get("digest") or ""),
    )


@dataclass(frozen=True)
class HttpApi:
    """One API's routes and how its answers map to outcomes."""

    actions: Mapping[str, Route]
    lookup: Route | None = None
    fence: Route | None = None
    delete: Route | None = None  # {locator}: delete one temp resource, under its own op key
    version: Route | None = None  # {locator}: the JSON answer's ``version_field`` is the version now
    version_field: str = "version"
    failures: Mapping[int, FailureClass] = field(default_factory=lambda: dict(DEFAULT_FAILURES))
    in_flight_status: int = 409
    fenced_status: int = 410
    key_header: str = "Idempotency-Key"
    deadline_header: str = "Reckon-Not-After"
    receipt: Callable[[Mapping[str, Any]], Committed] = default_receipt


class HttpConnector:
    """An HTTP API configured by ``HttpApi``. Satisfies ``reckon_client.Connector``, ``Fencing`` and ``Deleting``."""

    def __init__(
        self,
        base_url: str,
        api: HttpApi,
        *,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.api = api
        self.http = client or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, headers=dict(headers or {}))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "HttpConnector":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # -- the contract ---------------------------------------------------------------------------------------------

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        try:
            parsed = WriteRequest.parse(request)
            route = self.api.actions.get(parsed.action)
            if route is None:
                known = ", ".join(sorted(self.api.actions))
                raise InvalidRequest(f"this API has no action {parsed.action!r:.80} ({known})")
            url = route.url(dict(parsed.input) | {"op_key": op_key})
            if problem := op_key_problem(op_key):
                raise InvalidRequest(problem)
        except InvalidRequest as exc:
            return Failed("invalid_params", str(exc))
        if parsed.late(utc_now()):
            return Failed("dependency_unavailable", "the request is past its deadline (not_after): not sent")
        headers = {self.api.deadline_header: parsed.not_after.isoformat()} if parsed.not_after else {}
        return self._write(route.method, url, op_key, dict(parsed.input), headers)

    def compensate(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        """A compensation is one of the API's actions (a reversal, a refund) under its own op key, as ``submit``."""
        return self.submit(op_key, request)

    def delete(self, op_key: str, locator: str) -> Outcome:
        if self.api.delete is None:
            return Failed("invalid_params", "this API has no delete route")
        try:
            url = self.api.delete.url({"locator": locator, "op_key": op_key})
            if problem := op_key_problem(op_key):
                raise InvalidRequest(problem)
        except InvalidRequest as exc:
            return Failed("invalid_params", str(exc))
        return self._write(self.api.delete.method, url, op_key, None, {})

    def lookup(self, op_key: str) -> Outcome:
        if self.api.lookup is None:
            return Unprovable("this API cannot be asked what became of an idempotency key (no lookup route)")
        if op_key_problem(op_key):
            return NotFound()  # a key submit refuses never took effect
        return self._ask(self.api.lookup, op_key)

    def fence(self, op_key: str) -> Outcome:
        """Final: the stored answer if the key took effect, else ``Fenced`` (refused from now on). Without a fence
        route, as ``lookup``."""
        if self.api.fence is None:
            return self.lookup(op_key)
        if op_key_problem(op_key):
            return Fenced()  # submit refuses such a key: it can never take effect
        return self._ask(self.api.fence, op_key)

    def current_version(self, locator: str) -> str:
        """The ``version_field`` of the version route's answer. ``SourceNotFound`` on 404; ``ConnectionError`` when
        the API cannot be asked (or has no version route)."""
        if self.api.version is None:
            raise ConnectionError("this API has no version route")
        try:
            response = self.http.request(self.api.version.method, self.api.version.url({"locator": locator}))
        except (httpx.TransportError, InvalidRequest) as exc:
            raise ConnectionError(f"version of {locator}: {exc}") from exc
        if response.status_code == 404:
            raise SourceNotFound(f"the API has no source {locator!r}")
        version = _json(response).get(self.api.version_field)
        if response.status_code != 200 or not isinstance(version, str | int) or isinstance(version, bool):
            raise ConnectionError(f"version of {locator}: HTTP {response.status_code}")
        return str(version)

    # -- requests -------------------------------------------------------------------------------------------------

    def _write(
        self, method: str, url: str, op_key: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> Outcome:
        headers[self.api.key_header] = op_key
        try:
            response = self.http.request(method, url, json=body, headers=headers)
        except _NOT_SENT as exc:
            return Failed("dependency_unavailable", f"not sent: {type(exc).__name__}: {exc}")
        except httpx.TransportError as exc:
            return Failed("connection_interrupted", f"sent, no answer: {type(exc).__name__}: {exc}")
        status = response.status_code
        if status in (200, 201, 202):
            return self._success(response)
        if status == self.api.in_flight_status:
            return Failed("connection_interrupted", f"HTTP {status}: a request under this key is still in flight")
        if status == self.api.fenced_status:
            return Fenced()
        failure = self.api.failures.get(status)
        if failure is None:
            failure = "invalid_params" if 400 <= status < 500 else "connection_interrupted"
        return Failed(failure, f"HTTP {status}: {response.text[:200]}")

    def _ask(self, route: Route, op_key: str) -> Outcome:
        """A lookup or a fence: any failure leaves the operation unknown (ask again)."""
        try:
            response = self.http.request(route.method, route.url({"op_key": op_key}))
        except httpx.TransportError as exc:
            return Failed("connection_interrupted", f"not answered: {type(exc).__name__}: {exc}")
        status = response.status_code
        if status in (200, 201, 202):
            return self._success(response)
        if status == 404:
            return NotFound()
        if status == self.api.fenced_status:
            return Fenced()
        if status == self.api.in_flight_status:
            return Failed("connection_interrupted", "the key's request is still in flight: ask again")
        return Failed("connection_interrupted", f"not answered: HTTP {status}")

    def _success(self, response: httpx.Response) -> Outcome:
        body = _json(response)
        try:
            receipt = self.api.receipt(body)
        except (ValueError, KeyError, TypeError) as exc:
            return Unprovable(f"HTTP {response.status_code} without a receipt ({exc}): settle the operation by hand")
        return Accepted(remote_id=receipt.remote_id) if response.status_code == 202 else receipt


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["DEFAULT_FAILURES", "HttpApi", "HttpConnector", "Route", "default_receipt"]
