"""An HTTP API with ``Idempotency-Key`` semantics, for the tests of reckon_client.connectors.http: the IETF httpapi
idempotency-key draft as Stripe implements it, plus a lookup by key, a fence and a deadline header.

    with IdempotentApi() as api:        # 127.0.0.1, a free port, a thread per request
        api.url                         # http://127.0.0.1:<port>
        api.effects("ref-1")            # transfers made for that ref: a write applied twice shows as 2

Routes (JSON bodies; every write needs the header ``Idempotency-Key``):

    POST   /v1/transfers                {"ref": str, "amount": int > 0, "to": str}
                                        → 201 {"id": "tr_<n>", "ref", "amount", "to", "version": <n>}
    POST   /v1/transfers/<id>/reversal  → 201 {"id": "rv_<id>", "count": 1} (404 when no such transfer)
    DELETE /v1/transfers/<id>           → 200 {"id": <id>, "count": 1, or 0 when it was gone}
    GET    /v1/idempotency/<key>        → the key's stored answer | 404 never seen | 409 in flight | 410 fenced
    POST   /v1/idempotency/<key>/fence  → the stored answer if it took effect | 409 in flight | 410 fenced (from now on)
    GET    /v1/sources/<name>           → {"version": str} | 404

A write under a key: fenced → 410; in flight → 409; done → the same body's stored answer again (header
``Idempotent-Replayed: true``), another body → 422. A body that does not validate → 400; a request whose
``Reckon-Not-After`` has passed when it arrives → 412 — both with nothing stored, so the key stays free. Otherwise the
key is marked in flight, and the effect and its stored answer are made in one locked step that checks the deadline
again (a request held in flight past it is refused then, 412, with no effect): a lookup's 404 after the deadline is
final.

Faults, for the tests: ``pause()`` holds every write in flight (after its key is marked, before its effect) until
``resume()``; ``fail_after_effect(n)``: the next n writes make their effect, store their answer, and answer 500;
``stall_answers(seconds)``: writes make their effect, then wait before answering.
"""

import hashlib
import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import unquote

type Answer = tuple[int, dict[str, Any]]

_TRANSFER = re.compile(r"/v1/transfers/([^/]+)")
_REVERSAL = re.compile(r"/v1/transfers/([^/]+)/reversal")
_KEY = re.compile(r"/v1/idempotency/([^/]+)")
_FENCE = re.compile(r"/v1/idempotency/([^/]+)/fence")
_SOURCE = re.compile(r"/v1/sources/([^/]+)")


class Refused(Exception):
    """A request answered with an error and nothing stored."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(status, error)
        self.status, self.error = status, error


@dataclass
class _Key:
    state: Literal["in_flight", "done", "fenced"]
    fingerprint: str = ""
    answer: Answer | None = None


class IdempotentApi:
    """The API's state (under one lock) and its server."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.lock = threading.Lock()
        self.keys: dict[str, _Key] = {}
        self.transfers: dict[str, dict[str, Any]] = {}
        self.by_ref: Counter[str] = Counter()
        self.reversals: Counter[str] = Counter()
        self.sources: dict[str, str] = {}
        self.refused_late = 0
        self._made = 0
        self._gate = threading.Event()
        self._gate.set()
        self._held = 0
        self._fail_after_effect = 0
        self._stall = 0.0
        self.server = _Server((host, port), _handler(self))
        self._thread: threading.Thread | None = None

    # -- life -----------------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> "IdempotentApi":
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="idempotent-api")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._gate.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "IdempotentApi":
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- what the tests read and set ------------------------------------------------------------------------------

    def effects(self, ref: str) -> int:
        with self.lock:
            return self.by_ref[ref]

    def set_source(self, name: str, version: str) -> None:
        with self.lock:
            self.sources[name] = version

    def pause(self) -> None:
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def held(self) -> int:
        """Writes waiting at the pause."""
        with self.lock:
            return self._held

    def fail_after_effect(self, count: int = 1) -> None:
        with self.lock:
            self._fail_after_effect = count

    def stall_answers(self, seconds: float) -> None:
        with self.lock:
            self._stall = seconds

    # -- writes ---------------------------------------------------------------------------------------------------

    def write(self, method: str, path: str, key: str | None, body: dict[str, Any], deadline: datetime | None) -> Answer:
        """One write under ``key`` (the module's rule). Returns the answer; raises Refused for what is not stored."""
        if not key:
            raise Refused(HTTPStatus.BAD_REQUEST, "the Idempotency-Key header is required")
        fingerprint = hashlib.sha256(f"{method} {path} {json.dumps(body, sort_keys=True)}".encode()).hexdigest()
        with self.lock:
            known = self.keys.get(key)
            if known is not None:
                return self._known(known, fingerprint)
            self._refuse_late(deadline)
            effect = self._effect(method, path, body)  # validates before the key is taken
            self.keys[key] = _Key("in_flight", fingerprint)
            self._held += 1
        self._gate.wait(timeout=60)
        with self.lock:
            self._held -= 1
            try:
                self._refuse_late(deadline)
                answer = effect()
            except Refused:
                del self.keys[key]
                raise
            self.keys[key] = _Key("done", fingerprint, answer)
            stall, failing = self._stall, self._fail_after_effect > 0
            self._fail_after_effect -= failing
        if stall:
            time.sleep(stall)
        if failing:
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal", "detail": "made, then failed to answer"}
        return answer

    def lookup(self, key: str) -> Answer:
        with self.lock:
            known = self.keys.get(key)
            if known is None:
                return HTTPStatus.NOT_FOUND, {"error": "unknown_key"}
            return self._status(known)

    def fence(self, key: str) -> Answer:
        with self.lock:
            known = self.keys.setdefault(key, _Key("fenced"))
            return self._status(known)

    def _known(self, known: _Key, fingerprint: str) -> Answer:
        if known.state == "done" and known.fingerprint != fingerprint:
            return HTTPStatus.UNPROCESSABLE_ENTITY, {
                "error": "key_reused",
                "detail": "the key was used with another body",
            }
        if known.state == "done" and known.answer is not None:
            return known.answer[0], known.answer[1] | {"replayed": True}
        return self._status(known)

    def _status(self, known: _Key) -> Answer:
        if known.state == "fenced":
            return HTTPStatus.GONE, {"error": "fenced", "detail": "this key is fenced: it never takes effect"}
        if known.state == "in_flight" or known.answer is None:
            return HTTPStatus.CONFLICT, {"error": "in_flight", "detail": "a request under this key is in flight"}
        return known.answer

    def _refuse_late(self, deadline: datetime | None) -> None:
        if deadline is not None and datetime.now(UTC) > deadline:
            self.refused_late += 1
            raise Refused(HTTPStatus.PRECONDITION_FAILED, "deadline_passed")

    def _effect(self, method: str, path: str, body: dict[str, Any]) -> Callable[[], Answer]:
        """The write's effect as a function to run once the key is taken; Refused when the request is invalid."""
        if method == "POST" and path == "/v1/transfers":
            ref, amount, to = body.get("ref"), body.get("amount"), body.get("to")
            if not isinstance(ref, str) or not ref or not isinstance(to, str) or not to:
                raise Refused(HTTPStatus.BAD_REQUEST, "ref and to are non-empty strings")
            if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
                raise Refused(HTTPStatus.BAD_REQUEST, "amount is a positive integer")
            return lambda: self._transfer(ref, amount, to)
        if method == "POST" and (match := _REVERSAL.fullmatch(path)):
            reversed_id = unquote(match.group(1))
            return lambda: self._reverse(reversed_id)
        if method == "DELETE" and (match := _TRANSFER.fullmatch(path)):
            deleted_id = unquote(match.group(1))
            return lambda: self._delete(deleted_id)
        raise Refused(HTTPStatus.NOT_FOUND, "no such route")

    def _transfer(self, ref: str, amount: int, to: str) -> Answer:
        self._made += 1
        made = f"tr_{self._made}"
        transfer = {"id": made, "ref": ref, "amount": amount, "to": to, "version": str(self._made)}
        self.transfers[made] = transfer
        self.by_ref[ref] += 1
        return HTTPStatus.CREATED, dict(transfer)

    def _reverse(self, transfer: str) -> Answer:
        if transfer not in self.transfers:
            raise Refused(HTTPStatus.NOT_FOUND, "no such transfer")
        self.reversals[transfer] += 1
        return HTTPStatus.CREATED, {"id": f"rv_{transfer}", "count": 1}

    def _delete(self, transfer: str) -> Answer:
        removed = self.transfers.pop(transfer, None) is not None
        return HTTPStatus.OK, {"id": transfer, "count": int(removed)}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a test's fault proxy cut it) is not an error of the API's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(api: IdempotentApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # An answer leaves in one segment (buffered, flushed once per request): written as two, Nagle's algorithm and
        # a delayed ACK would hold the second for 40 ms.
        wbufsize = -1
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            try:
                body = self._body()
                status, answer = self._route(body)
            except Refused as refused:
                status, answer = refused.status, {"error": refused.error}
            self._send(status, answer)

        def _route(self, body: dict[str, Any]) -> Answer:
            path, method = self.path.split("?")[0], self.command
            if method == "GET" and (match := _KEY.fullmatch(path)):
                return api.lookup(unquote(match.group(1)))
            if method == "POST" and (match := _FENCE.fullmatch(path)):
                return api.fence(unquote(match.group(1)))
            if method == "GET" and (match := _SOURCE.fullmatch(path)):
                with api.lock:
                    version = api.sources.get(unquote(match.group(1)))
                if version is None:
                    return HTTPStatus.NOT_FOUND, {"error": "no_such_source"}
                return HTTPStatus.OK, {"version": version}
            return api.write(method, path, self.headers.get("Idempotency-Key"), body, self._deadline())

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                value = json.loads(raw or b"{}")
            except ValueError as exc:
                raise Refused(HTTPStatus.BAD_REQUEST, "the body is not JSON") from exc
            if not isinstance(value, dict):
                raise Refused(HTTPStatus.BAD_REQUEST, "the body is a JSON object")
            return value

        def _deadline(self) -> datetime | None:
            value = self.headers.get("Reckon-Not-After")
            if not value:
                return None
            try:
                deadline = datetime.fromisoformat(value)
            except ValueError as exc:
                raise Refused(HTTPStatus.BAD_REQUEST, "Reckon-Not-After is not an ISO 8601 time") from exc
            if deadline.tzinfo is None:
                raise Refused(HTTPStatus.BAD_REQUEST, "Reckon-Not-After needs its UTC offset")
            return deadline

        def _send(self, status: int, answer: dict[str, Any]) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if answer.get("replayed"):
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)

    return Handler
