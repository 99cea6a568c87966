"""An external object store, run as its own process, that a migration agent copies into (DESIGN §9).

    python -m harness.simulator --port 0 --state /path/state.json

Stdlib only. Prints ``listening on http://127.0.0.1:PORT`` once it accepts connections. Every mutation is
persisted before it is answered, so a SIGKILL never loses a committed write: what it changed (the keys it wrote or
deleted) is appended to a journal beside the state file (``<state>.journal``, one JSON line, fsynced) — the cost of a
write is its own size, not the store's, at a million objects as at ten. The state file is a snapshot (temp file +
``os.replace``) written at start-up, on reset and every ``COMPACT_EVERY`` writes; loading replays the journal over it
(a torn last line is a write that was never answered, dropped).

API (JSON bodies):
    POST /ops/<op_key>          {"action", "params"} → {"state": "committed", "receipt": {...}}; once per op key
    GET  /ops/<op_key>          → the committed receipt, or 404 {"state": "not_found"} (501 without idempotency)
    GET  /ops-by-tag/<op_key>   → {"state": "committed", "receipt": <the latest>, "count": <how many commits>}, or
                                  404 {"state": "not_found"} (501 in ``no_idempotency_no_query``)
    POST /fence/<op_key>        → what became of op_key, final: {"state": "committed" | "accepted", "receipt"} when
                                  it took effect; otherwise a tombstone: {"state": "fenced"}, and every later write
                                  under op_key is refused, 409 {"error": "fenced"}, in the same locked step as a
                                  perform (501 in ``no_idempotency_no_query``: this store cannot fence then)
    GET  /limits → {"max_batch"}: the most objects one copy may span (the store's transaction boundary)
    GET  /versions/<locator>, POST /_sources {"locator", "version", "digest"}
    POST /_faults {"mode", "times", "ms", "every", "action", "match"}, GET /_stats, GET /_state, POST /_reset

Actions: prepare_target, copy_batch (its receipt lists the staging object it created in ``"temp"``), verify_digests,
switch_reference, restore_reference, delete_objects {"target", "prefix"} and delete {"locator"} (exactly that one
object key; an empty locator or one containing ``..`` is refused with 400 ``invalid_locator``).

A write may carry a deadline, the header ``Reckon-Not-After`` (ISO 8601): one that reaches the perform after it (by
this store's clock) is refused, 409 {"error": "deadline_passed"}, with no effect — so a request still in flight when
its caller gave up cannot land once the caller's "not found" is final. ``/_stats`` counts both refusals
(``refused_fenced``, ``refused_late``).

Every committed write is journalled under its op key as a tag, with or without idempotency, so a client of a store
that does not dedupe can still ask what became of an op key.

Faults apply to the next ``times`` requests outside ``/_*`` (``accept_then_drop`` to the next ``times`` writes: a
query has nothing to accept; ``run_async`` makes the next writes answer ``accepted`` and report themselves running,
to ``GET /ops`` and the tag query, for ``ms`` more, then committed). ``every: n`` makes a fault hit only every n-th
request it applies to; ``action`` limits it to writes of that action (``"switch_reference"``); ``match`` limits it
to requests (writes and queries) whose op key contains that text — one task's op keys, or one node's. ``drop``
closes the connection without an answer, for a query too: the client cannot tell what happened. ``no_idempotency``
(no dedupe by op key, ``GET /ops`` answers 501) and ``no_idempotency_no_query`` (no dedupe, and both queries answer
501) hold for the whole run, until reset or ``{"mode": "clear"}``, and so does ``ignore_fence`` (a store that breaks
the fence's contract: it answers "fenced" but records no tombstone — for the tests that prove a late request is then
caught).
"""

import argparse
import contextlib
import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

STAGING_PREFIX = "tmp/"  # temporary copies live under <target>/tmp/; the plan's cleanup deletes them
MAX_BATCH = 500  # the store's transaction boundary: a copy never spans more objects than this
FAULT_MODES = frozenset(
    {
        "latency",
        "dependency_unavailable",
        "permission_revoked",
        "invalid_params",
        "version_conflict",
        "accept_then_drop",
        "run_async",
        "no_idempotency",
        "no_idempotency_no_query",
        "drop",
    }
)
_WRITE_ONLY_FAULTS = frozenset({"accept_then_drop", "run_async"})
_FAULT_STATUS = {
    "dependency_unavailable": HTTPStatus.SERVICE_UNAVAILABLE,
    "permission_revoked": HTTPStatus.FORBIDDEN,
    "invalid_params": HTTPStatus.BAD_REQUEST,
    "version_conflict": HTTPStatus.CONFLICT,
}


class Refused(Exception):
    """The store refuses a request; nothing was written."""

    def __init__(self, status: HTTPStatus, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# The state's collections, each a mapping by key that a mutation writes key by key (journalled by key), and the
# statistics' own mappings; every other field is a scalar, journalled whole.
COLLECTIONS = ("objects", "targets", "references", "sources", "ops", "tags", "fenced", "running")
STAT_MAPS = ("by_op_key", "by_action")
COMPACT_EVERY = 5000


class Tracked(dict[str, Any]):
    """A collection that remembers every key a mutation reached since it was last journalled: written, deleted, or
    read to change what it holds (``get`` then a change in place). Reads are kept too — journalling a value that did
    not change costs its size and is never wrong."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.touched: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.touched.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.touched.add(key)
        return super().get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.touched.add(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.touched.add(key)
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.touched.add(key)
        return super().setdefault(key, default)

    def changes(self) -> tuple[dict[str, Any], list[str]]:
        """(key → value now, keys gone) for every key reached since the last call."""
        written = {key: dict.__getitem__(self, key) for key in self.touched if dict.__contains__(self, key)}
        gone = [key for key in self.touched if not dict.__contains__(self, key)]
        self.touched = set()
        return written, gone


def tracked(state: dict[str, Any]) -> dict[str, Any]:
    for name in COLLECTIONS:
        state[name] = Tracked(state.get(name, {}))
    for name in STAT_MAPS:
        state["stats"][name] = Tracked(state["stats"].get(name, {}))
    return state


def apply_entry(state: dict[str, Any], entry: dict[str, Any]) -> None:
    """Replay one journal line over ``state`` (a mapping of plain dicts)."""
    for name, (written, gone) in entry["collections"].items():
        target = state.setdefault(name, {})
        target.update(written)
        for key in gone:
            target.pop(key, None)
    stats = state["stats"]
    for name, (written, gone) in entry["stat_maps"].items():
        stats.setdefault(name, {}).update(written)
        for key in gone:
            stats[name].pop(key, None)
    stats.update(entry["stats"])
    state.update(entry["scalars"])


def empty_state() -> dict[str, Any]:
    return {
        "objects": {},  # key → {"version", "digest", "size"}
        "targets": {},  # target id → {"project"}
        "references": {},  # locator → {"target", "version", "history": [previous targets]}
        "sources": {},  # locator → {"version", "digest"}
        "ops": {},  # op key → receipt (only while the store dedupes)
        "tags": {},  # op key → {"receipt": the latest, "count": commits under it}, always
        "fenced": {},  # op key → when it was fenced: refused from then on
        "jobs": 0,
        "stats": {"side_effects": 0, "by_op_key": {}, "by_action": {}, "refused_fenced": 0, "refused_late": 0},
    }


class Store:
    """The store's state and its actions. One lock: the simulator is small, correctness beats throughput."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + ".journal")
        self.lock = threading.Lock()
        state = json.loads(path.read_text()) if path.exists() else empty_state()
        state["stats"].setdefault("refused_fenced", 0)
        state["stats"].setdefault("refused_late", 0)
        if self.journal_path.exists():
            with self.journal_path.open() as journal:
                for line in journal:
                    try:
                        entry = json.loads(line)
                    except ValueError:  # a torn last line: its write was never answered
                        break
                    apply_entry(state, entry)
        self.state = tracked(state)
        self.journal: Any = None
        self.journalled = 0
        self.compact()
        self.faults: list[dict[str, Any]] = []  # per-request faults, consumed in order
        self.no_idempotency = False
        self.no_query = False  # with no_idempotency: the tag journal cannot be queried either
        self.ignore_fence = False  # sabotage: a fence is answered but not kept

    def persist(self) -> None:
        """Journal what the mutation just made changed (the module's docstring), before it is answered."""
        entry = {
            "collections": {name: self.state[name].changes() for name in COLLECTIONS},
            "stat_maps": {name: self.state["stats"][name].changes() for name in STAT_MAPS},
            "stats": {k: v for k, v in self.state["stats"].items() if k not in STAT_MAPS},
            "scalars": {k: v for k, v in self.state.items() if k not in COLLECTIONS and k != "stats"},
        }
        self.journal.write(json.dumps(entry, sort_keys=True) + "\n")
        self.journal.flush()
        os.fsync(self.journal.fileno())
        self.journalled += 1
        if self.journalled >= COMPACT_EVERY:
            self.compact()

    def compact(self) -> None:
        """Write the whole state as the snapshot, then start an empty journal. A crash between the two replays the
        journal over a snapshot that holds it already: each line sets values, so that changes nothing."""
        for name in COLLECTIONS:
            self.state[name].touched = set()
        for name in STAT_MAPS:
            self.state["stats"][name].touched = set()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self.journal is not None:
            self.journal.close()
        self.journal = self.journal_path.open("w")
        os.fsync(self.journal.fileno())
        self.journalled = 0

    def take_fault(self, *, write: bool, action: str = "", op_key: str = "") -> dict[str, Any] | None:
        """Consume the first pending fault that applies to this request (a write, or a query; its action when the
        fault names one; an op key containing its ``match`` when it names one; every n-th such request when it
        says ``every``)."""
        with self.lock:
            for position, fault in enumerate(self.faults):
                if not write and (fault["mode"] in _WRITE_ONLY_FAULTS or fault["action"]):
                    continue
                if fault["action"] and fault["action"] != action:
                    continue
                if fault["match"] and fault["match"] not in op_key:
                    continue
                fault["seen"] += 1
                if fault["seen"] % fault["every"]:
                    return None  # this one passes untouched
                fault["times"] -= 1
                if fault["times"] <= 0:
                    self.faults.pop(position)
                return fault
            return None

    def set_fault(self, body: dict[str, Any]) -> None:
        mode = body.get("mode")
        with self.lock:
            if mode == "clear":
                self.faults.clear()
                self.no_idempotency = self.no_query = self.ignore_fence = False
            elif mode == "no_idempotency":
                self.no_idempotency, self.no_query = bool(body.get("enabled", True)), False
            elif mode == "no_idempotency_no_query":
                self.no_idempotency = self.no_query = bool(body.get("enabled", True))
            elif mode == "ignore_fence":
                self.ignore_fence = bool(body.get("enabled", True))
            elif mode in FAULT_MODES:
                times = body.get("times", 1)
                if not isinstance(times, int) or times < 1:
                    raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "times must be a positive integer")
                every, action, match = body.get("every", 1), body.get("action", ""), body.get("match", "")
                if not isinstance(every, int) or every < 1 or not isinstance(action, str) or not isinstance(match, str):
                    raise Refused(
                        HTTPStatus.BAD_REQUEST,
                        "invalid_params",
                        "every must be a positive integer, action and match strings",
                    )
                fault = {"mode": mode, "times": times, "ms": int(body.get("ms", 0)), "every": every, "action": action}
                fault["match"] = match
                self.faults.append(fault | {"seen": 0})
            else:
                known = ", ".join(sorted(FAULT_MODES | {"clear", "ignore_fence"}))
                raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", f"unknown fault mode {mode!r} ({known})")

    def reset(self) -> None:
        with self.lock:
            self.state = tracked(empty_state())
            self.faults.clear()
            self.no_idempotency = self.no_query = self.ignore_fence = False
            self.compact()

    def set_source(self, body: dict[str, Any]) -> None:
        locator, version = body.get("locator"), body.get("version")
        if not isinstance(locator, str) or not locator or not isinstance(version, str) or not version:
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "a source needs a locator and a version")
        with self.lock:
            self.state["sources"][locator] = {"version": version, "digest": str(body.get("digest", ""))}
            self.persist()

    def run_async(self, op_key: str, ms: int) -> None:
        """The write under ``op_key`` is accepted and reported as running for ``ms`` more milliseconds."""
        with self.lock:
            self.state["running"][op_key] = time.time() + ms / 1000
            self.persist()

    def state_of(self, op_key: str) -> str:
        """``accepted`` while a write started in ``run_async`` mode is still running, then ``committed``."""
        with self.lock:
            ready_at = self.state["running"].get(op_key)
        return "accepted" if ready_at is not None and time.time() < ready_at else "committed"

    def lookup(self, op_key: str) -> dict[str, Any] | None:
        with self.lock:
            receipt = self.state["ops"].get(op_key)
            return dict(receipt) if receipt is not None else None

    def lookup_tag(self, op_key: str) -> dict[str, Any] | None:
        """The journal entry for ``op_key``: ``{"receipt": the latest, "count": commits}``, or None."""
        with self.lock:
            entry = self.state["tags"].get(op_key)
            return json.loads(json.dumps(entry)) if entry is not None else None

    def fence(self, op_key: str) -> dict[str, Any]:
        """What became of ``op_key``, final: its journal entry if it took effect; otherwise a tombstone, in the same
        lock as every perform, so no request under ``op_key`` can take effect from now on."""
        with self.lock:
            entry = self.state["tags"].get(op_key)
            if entry is not None:
                return {"state": "committed", "receipt": json.loads(json.dumps(entry["receipt"]))}
            if op_key not in self.state["fenced"] and not self.ignore_fence:
                self.state["fenced"][op_key] = time.time()
                self.persist()
            return {"state": "fenced"}

    def perform(
        self, op_key: str, action: str, params: dict[str, Any], *, not_after: float | None = None
    ) -> dict[str, Any]:
        """Run ``action`` once per op key (unless idempotency is off) and return its receipt. An op key that was
        fenced, or a request past its deadline (``not_after``, epoch seconds), is refused with no effect."""
        handler = _ACTIONS.get(action)
        if handler is None:
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", f"unknown action {action!r}")
        with self.lock:
            if not self.no_idempotency and op_key in self.state["ops"]:
                return dict(self.state["ops"][op_key])
            if op_key in self.state["fenced"]:
                self.state["stats"]["refused_fenced"] += 1
                self.persist()
                raise Refused(HTTPStatus.CONFLICT, "fenced", f"op key {op_key} is fenced: it never takes effect")
            if not_after is not None and time.time() > not_after:
                self.state["stats"]["refused_late"] += 1
                self.persist()
                late = f"the request for {op_key} came after its deadline"
                raise Refused(HTTPStatus.CONFLICT, "deadline_passed", late)
            self._check_source_version(params)
            # Actions validate before they change anything; the job counter moves only once one succeeds.
            receipt = handler(self.state, params, f"job-{self.state['jobs'] + 1}")
            self.state["jobs"] += 1
            if not self.no_idempotency:
                self.state["ops"][op_key] = receipt
            tagged = self.state["tags"].get(op_key, {"count": 0})
            self.state["tags"][op_key] = {"receipt": receipt, "count": tagged["count"] + 1}
            stats = self.state["stats"]
            stats["side_effects"] += 1
            stats["by_op_key"][op_key] = stats["by_op_key"].get(op_key, 0) + 1
            stats["by_action"][action] = stats["by_action"].get(action, 0) + 1
            self.persist()
            return dict(receipt)

    def _check_source_version(self, params: dict[str, Any]) -> None:
        source = params.get("source")
        if not isinstance(source, dict):
            return
        known = self.state["sources"].get(source.get("locator"))
        if known is not None and known["version"] != str(source.get("version")):
            raise Refused(
                HTTPStatus.CONFLICT,
                "version_conflict",
                f"source {source.get('locator')} is at version {known['version']}, not {source.get('version')}",
            )


def _target(state: dict[str, Any], params: dict[str, Any]) -> str:
    target = params.get("target")
    if not isinstance(target, str) or target not in state["targets"]:
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", f"unknown target {target!r}")
    return target


def _source(params: dict[str, Any]) -> dict[str, Any]:
    source = params.get("source")
    if not isinstance(source, dict) or not source.get("locator") or not source.get("version"):
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "source must be a ref with a locator and a version")
    return source


def _object_digest(source: dict[str, Any], batch: int, index: int) -> str:
    return sha256(f"{source['locator']}@{source['version']}/{batch}/{index}")


def _receipt(remote_id: str, *, version: str = "", count: int | None = None, digest: str = "") -> dict[str, Any]:
    return {"remote_id": remote_id, "remote_version": version, "count": count, "digest": digest}


def prepare_target(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    project = params.get("project")
    if not isinstance(project, str) or not project:
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "prepare_target needs a project")
    target = f"tgt-{project}-{job}"
    state["targets"][target] = {"project": project}
    return _receipt(target)


def copy_batch(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    target, source = _target(state, params), _source(params)
    batch, limit = params.get("batch"), params.get("limit")
    if not isinstance(batch, int) or batch < 1 or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", f"batch >= 1 and 1 <= limit <= {MAX_BATCH}")
    digests = []
    for index in range(limit):
        digest = _object_digest(source, batch, index)
        key = f"{target}/objects/{batch}/{index}"
        state["objects"][key] = {"version": source["version"], "digest": digest, "size": 1}
        digests.append(digest)
    # The staging manifest is a temporary copy: the receipt names it so the caller can register it for cleanup.
    staging = f"{target}/{STAGING_PREFIX}batch-{batch}"
    state["objects"][staging] = {"version": source["version"], "digest": "", "size": limit}
    version = str(source["version"])
    receipt = _receipt(f"{target}/batch-{batch}", version=version, count=limit, digest=sha256("".join(digests)))
    return receipt | {"temp": [staging]}


def verify_digests(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    target, source = _target(state, params), _source(params)
    prefix = f"{target}/objects/"
    verified = bad = 0
    for key, obj in state["objects"].items():
        if key.startswith(prefix):
            batch, index = key[len(prefix) :].split("/")
            ok = obj["version"] == source["version"] and obj["digest"] == _object_digest(source, int(batch), int(index))
            verified, bad = verified + ok, bad + (not ok)
    # Every object matches the source snapshot: the copy carries the source's manifest digest.
    digest = str(source.get("digest", "")) if bad == 0 else sha256(f"mismatch:{bad}")
    return _receipt(job, version=str(source["version"]), count=verified, digest=digest)


def switch_reference(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    target, source = _target(state, params), _source(params)
    ref = state["references"].setdefault(source["locator"], {"target": "", "version": "", "history": []})
    ref["history"].append({"target": ref["target"], "version": ref["version"]})
    ref["target"], ref["version"] = target, str(source["version"])
    return _receipt(f"ref:{source['locator']}", version=ref["version"], count=1)


def restore_reference(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    source = _source(params)
    ref = state["references"].get(source["locator"])
    if ref is None or not ref["history"]:
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", f"reference {source['locator']} has nothing to restore")
    previous = ref["history"].pop()
    ref["target"], ref["version"] = previous["target"], previous["version"]
    return _receipt(f"ref:{source['locator']}", version=ref["version"], count=1)


def delete_objects(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    target = _target(state, params)
    prefix = params.get("prefix")
    if not isinstance(prefix, str) or not prefix:
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "delete_objects needs a non-empty prefix")
    doomed = [key for key in state["objects"] if key.startswith(f"{target}/{prefix}")]
    for key in doomed:
        del state["objects"][key]
    return _receipt(job, count=len(doomed))


def delete(state: dict[str, Any], params: dict[str, Any], job: str) -> dict[str, Any]:
    """Remove exactly the object key ``locator`` (never a prefix); an absent key removes nothing."""
    locator = params.get("locator")
    if not isinstance(locator, str) or not locator.strip():
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_locator", "delete needs a non-empty locator")
    if ".." in locator:
        raise Refused(HTTPStatus.BAD_REQUEST, "invalid_locator", f"locator {locator!r} contains '..'")
    removed = state["objects"].pop(locator, None) is not None
    return _receipt(locator, count=int(removed))


_ACTIONS = {
    f.__name__: f
    for f in (prepare_target, copy_batch, verify_digests, switch_reference, restore_reference, delete_objects, delete)
}


class Handler(BaseHTTPRequestHandler):
    server: "SimulatorServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up waiting (its timeout): what was committed stays committed, as in a real store.
            self.close_connection = True

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "the body is not JSON") from exc
        if not isinstance(body, dict):
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "the body must be a JSON object")
        return body

    def _not_after(self) -> float | None:
        """The request's deadline (header ``Reckon-Not-After``, ISO 8601 with its offset), in epoch seconds."""
        value = self.headers.get("Reckon-Not-After")
        if not value:
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError as exc:
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "Reckon-Not-After is not an ISO 8601 time") from exc
        if moment.tzinfo is None:
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "Reckon-Not-After needs its UTC offset")
        return moment.timestamp()

    def _drop(self) -> None:
        """Close the connection without an answer: the client cannot tell whether the write happened."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        try:
            self._route(method)
        except Refused as refused:
            self._send(refused.status, {"error": refused.error, "detail": refused.detail})

    def _answer(self, op_key: str, receipt: dict[str, Any]) -> dict[str, Any]:
        if self.server.store.state_of(op_key) == "accepted":
            return {"state": "accepted", "receipt": {"remote_id": receipt.get("remote_id", "")}}
        return {"state": "committed", "receipt": receipt}

    def _route(self, method: str) -> None:
        store = self.server.store
        path = self.path.split("?", 1)[0]
        body = self._body() if method == "POST" else {}
        if path.startswith("/_"):
            self._control(method, path, body)
            return
        write = method == "POST" and not path.startswith("/fence/")  # a fence is a query to the faults
        fault = store.take_fault(write=write, action=str(body.get("action", "")), op_key=_op_key_of(path))
        mode = fault["mode"] if fault else ""
        if mode == "drop":
            self._drop()
            return
        if mode == "latency":
            time.sleep(fault["ms"] / 1000 if fault else 0)
        elif mode in _FAULT_STATUS:
            raise Refused(_FAULT_STATUS[mode], mode, f"simulated {mode}")
        if path.startswith("/ops/") and len(path) > len("/ops/"):
            op_key = unquote(path[len("/ops/") :])
            if method == "POST":
                params = body.get("params", {})
                if not isinstance(params, dict):
                    raise Refused(HTTPStatus.BAD_REQUEST, "invalid_params", "params must be an object")
                receipt = store.perform(op_key, str(body.get("action")), params, not_after=self._not_after())
                if mode == "accept_then_drop":
                    self._drop()
                    return
                if mode == "run_async" and fault is not None:
                    store.run_async(op_key, fault["ms"])
                self._send(HTTPStatus.OK, self._answer(op_key, receipt))
                return
            if store.no_idempotency:
                self._send(HTTPStatus.NOT_IMPLEMENTED, {"error": "unprovable", "detail": "no lookup by op key"})
                return
            found = store.lookup(op_key)
            if found is None:
                self._send(HTTPStatus.NOT_FOUND, {"state": "not_found"})
            else:
                self._send(HTTPStatus.OK, self._answer(op_key, found))
            return
        if path.startswith("/fence/") and len(path) > len("/fence/") and method == "POST":
            if store.no_query:
                self._send(HTTPStatus.NOT_IMPLEMENTED, {"error": "unprovable", "detail": "no fence by op key"})
                return
            fenced_key = unquote(path[len("/fence/") :])
            answer = store.fence(fenced_key)
            if answer["state"] == "committed":
                answer = self._answer(fenced_key, answer["receipt"])
            self._send(HTTPStatus.OK, answer)
            return
        if path.startswith("/ops-by-tag/") and len(path) > len("/ops-by-tag/") and method == "GET":
            if store.no_query:
                self._send(HTTPStatus.NOT_IMPLEMENTED, {"error": "unprovable", "detail": "no query by tag"})
                return
            entry = store.lookup_tag(unquote(path[len("/ops-by-tag/") :]))
            if entry is None:
                self._send(HTTPStatus.NOT_FOUND, {"state": "not_found"})
            else:
                self._send(HTTPStatus.OK, self._answer(unquote(path[len("/ops-by-tag/") :]), entry["receipt"]) | entry)
            return
        if path == "/limits" and method == "GET":
            self._send(HTTPStatus.OK, {"max_batch": MAX_BATCH})
            return
        if path.startswith("/versions/") and method == "GET":
            locator = unquote(path[len("/versions/") :])
            with store.lock:
                source = store.state["sources"].get(locator)
            if source is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": "not_found", "detail": f"no source {locator}"})
            else:
                self._send(HTTPStatus.OK, {"locator": locator, **source})
            return
        self._send(HTTPStatus.NOT_FOUND, {"error": "not_found", "detail": f"no route {method} {path}"})

    def _control(self, method: str, path: str, body: dict[str, Any]) -> None:
        store = self.server.store
        if method == "POST" and path == "/_faults":
            store.set_fault(body)
        elif method == "POST" and path == "/_sources":
            store.set_source(body)
        elif method == "POST" and path == "/_reset":
            store.reset()
        elif method == "GET" and path == "/_stats":
            with store.lock:
                self._send(HTTPStatus.OK, json.loads(json.dumps(store.state["stats"])))
            return
        elif method == "GET" and path == "/_state":
            with store.lock:
                snapshot = json.loads(json.dumps(store.state))
            self._send(HTTPStatus.OK, snapshot)
            return
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": "not_found", "detail": f"no route {method} {path}"})
            return
        self._send(HTTPStatus.OK, {"ok": True})


def _op_key_of(path: str) -> str:
    """The op key a request names (``/ops/<key>``, ``/ops-by-tag/<key>``), or ""."""
    for prefix in ("/ops/", "/ops-by-tag/", "/fence/"):
        if path.startswith(prefix):
            return unquote(path[len(prefix) :])
    return ""


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, *, verbose: bool = False) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.verbose = verbose


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--state", type=Path, required=True, help="JSON file the store persists to")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    server = SimulatorServer((args.host, args.port), Store(args.state), verbose=args.verbose)
    host, port = server.server_address[:2]
    print(f"listening on http://{host!s}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
