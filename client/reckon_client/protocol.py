"""The step protocol over HTTP (docs/api.md), written once for the sync and the async client.

Each exchange is a generator that yields *effects* — an HTTP call to Reckon, a call to the author's connector, a
sleep — and receives their results; ``Reckon`` drives it with blocking I/O, ``AsyncReckon`` with ``await``. So the
rules (intent before call, the stop flag checked before each side effect, reconcile first, 412 → re-read, a lookup
that cannot reach the remote ends the run) live here only, and the drivers only move bytes.

What the loop follows is the server's directive: reconcile comes before execute in it, so a run that starts after a
crash (SIGKILL anywhere) asks the remote what became of the operation in flight before it sends anything new. The
lease is asked for, and each outcome posted, with ``start_next``: the answer carries the next directive — when that
is to execute a node, with its operation already registered and marked sent (in the receipt's commit, after an
outcome) — so a node in steady state is one request, and a task of n nodes n + 2 (docs/api.md, "A step in one
request").
"""

import base64
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import quote

from reckon_client.errors import ApiError
from reckon_client.outcomes import OUTCOME_TYPES, Accepted, Committed, Failed, NotFound, Outcome, outcome_json

# --------------------------------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Call:
    """One request to Reckon (``path`` under /api/v1). The driver retries it on 429/503 and transport errors: safe,
    since every write carries If-Match and an Idempotency-Key."""

    method: str
    path: str
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: Any


@dataclass(frozen=True)
class Remote:
    """A call to the connector (or, for ``recreate``, to the caller's Recreator). An exception it raises is thrown
    back into the generator."""

    name: Literal["submit", "compensate", "lookup", "fence", "delete", "current_version", "recreate"]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Sleep:
    seconds: float


type Effect = Call | Remote | Sleep
type Steps[T] = Generator[Effect, Any, T]

# --------------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Task:
    """A task as Reckon reads it (``raw`` holds the whole body: nodes, open operations, …)."""

    id: int
    kind: str
    project: str
    title: str
    status: str
    status_reason: str
    version: int
    cancel_requested: bool
    raw: dict[str, Any]

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> "Task":
        return cls(
            id=int(body["id"]),
            kind=str(body.get("kind", "")),
            project=str(body.get("project", "")),
            title=str(body.get("title", "")),
            status=str(body.get("status", "")),
            status_reason=str(body.get("status_reason", "")),
            version=int(body.get("version", 0)),
            cancel_requested=bool(body.get("cancel_requested", False)),
            raw=dict(body),
        )


@dataclass(frozen=True)
class RunResult:
    """How a run ended. ``done``: the task completed (``reason`` ``cleanup_unsupported``: its temp resources are
    left, the connector has no ``delete``). ``stopped``: ``reason`` says why (a directive's reason —
    cancel_requested, takeover_requested, awaiting_approval, budget_exhausted, a pause — or a refusal's code:
    lease_held, lease_lost, …). ``waiting``: run again at ``until`` (a backoff longer than the run's ``max_wait``,
    a remote that could not be asked, an operation the remote still runs)."""

    status: Literal["done", "stopped", "waiting"]
    reason: str = ""
    until: datetime | None = None
    steps: int = 0  # operations sent or settled by this run
    detail: str = ""

    @property
    def done(self) -> bool:
        return self.status == "done"


@dataclass(frozen=True)
class RetainedRef:
    """An object Reckon retained for a task. A checkpoint keeps ``as_checkpoint()`` — ``{"retained": id, "version":
    n}`` — never the content; ``of_checkpoint`` reads one back."""

    task_id: int
    id: int
    version: int

    def as_checkpoint(self) -> dict[str, int]:
        return {"retained": self.id, "version": self.version}

    @classmethod
    def of_checkpoint(cls, task_id: int, checkpoint: Mapping[str, Any]) -> "RetainedRef":
        return cls(task_id=task_id, id=int(checkpoint["retained"]), version=int(checkpoint["version"]))


@dataclass(frozen=True)
class Retained:
    """A retained object as read: ``content`` is a debug artifact's fields (a dict), the bytes of any other kind.
    ``ref`` is the reference to keep (after ``fetch_or_recreate``, the re-created object's)."""

    ref: RetainedRef
    kind: str
    name: str
    expires_at: datetime | None
    content: bytes | dict[str, Any]


@dataclass(frozen=True)
class NodeReceipt:
    """The last receipt Reckon recorded for a node's effect — once the node succeeded, the one that advanced it:
    ``receipt`` is what the remote said it committed under ``op_key``, with its data as reported."""

    node: str
    node_status: str
    op_key: str
    action: str
    receipt: Committed
    received_at: datetime | None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> "NodeReceipt":
        count = body.get("count")
        return cls(
            node=str(body["node"]),
            node_status=str(body.get("node_status", "")),
            op_key=str(body["op_key"]),
            action=str(body.get("action", "")),
            receipt=Committed(
                remote_id=str(body["remote_id"]),
                remote_version=str(body.get("remote_version") or ""),
                count=int(count) if count is not None else None,
                digest=str(body.get("digest") or ""),
                data=dict(body.get("data") or {}),
            ),
            received_at=parse_time(body.get("received_at")),
        )


type Content = bytes | Mapping[str, Any]


@dataclass(frozen=True)
class Recreator:
    """What ``fetch_or_recreate`` calls when the object is gone: the caller's function, which reads the external
    facts again (the source by its versioned ref) and returns the content (bytes; a debug artifact: a dict)."""

    recreate: Callable[[], Any]


@dataclass
class LeaseState:
    """The lease a run holds, shared with its background renewer: the renewer moves ``renewal_seq`` and raises
    ``stop_reason`` (cancel_requested, takeover_requested, or the lease lost); the loop reads it before each side
    effect."""

    task_id: int
    lease_id: str
    epoch: int
    ttl_seconds: float
    renewal_seq: int
    stop_reason: str = ""
    lost: bool = False
    # The first directive the grant's answer carried (start_next), for the loop to follow before reading any.
    first: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> "LeaseState":
        following = body.get("next")
        state = cls(
            task_id=int(body["task_id"]),
            lease_id=str(body["lease_id"]),
            epoch=int(body.get("epoch", 0)),
            ttl_seconds=float(body.get("ttl_seconds") or 30),
            renewal_seq=int(body.get("renewal_seq", 0)),
            first=following if isinstance(following, Mapping) else None,
        )
        state.heard(body)
        return state

    def heard(self, body: Mapping[str, Any]) -> None:
        """A lease answer (acquire or renew): the next renewal_seq, and whether to stop starting side effects."""
        self.renewal_seq = int(body.get("renewal_seq", self.renewal_seq))
        if body.get("cancel_requested"):
            self.stop_reason = self.stop_reason or "cancel_requested"
        elif body.get("takeover_requested"):
            self.stop_reason = self.stop_reason or "takeover_requested"

    @property
    def renew_every(self) -> float:
        return max(self.ttl_seconds / 3, 0.1)


# --------------------------------------------------------------------------------------------------- helpers

LOST = frozenset({"lease_lost", "lease_expired"})
BUSY = frozenset({"lease_held", "lease_reserved", "takeover_held", "takeover_requested"})
MAX_CONFLICTS = 20  # 412s in a row before a run gives up (someone else keeps moving the task)
OBSERVE_EVERY = 2.0  # seconds between two lookups of an operation the remote still runs
MIN_WAIT = 0.5  # seconds: the least a wait sleeps, so a clock ahead of the database's never spins


def ok(reply: Reply) -> Any:
    """The body of a 2xx; ApiError otherwise."""
    if 200 <= reply.status < 300:
        return reply.body
    raise ApiError.of(reply.status, reply.body)


def etag_version(reply: Reply) -> int | None:
    tag = reply.headers.get("etag", "").removeprefix("W/").strip('"')
    return int(tag) if tag.isdigit() else None


def _lease_headers(state: LeaseState, *, version: int | None = None, body: Any = None) -> dict[str, str]:
    headers = {"Reckon-Lease": state.lease_id}
    if version is not None:
        headers["If-Match"] = f'"{version}"'
        # One key per lease, task version and body: a write retried after a lost answer replays its first answer
        # (instead of a 412 for its own change), and a different write can never reuse a key.
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
        headers["Idempotency-Key"] = f"rk-client:{state.lease_id}:{version}:{digest}"
    return headers


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------------------- exchanges


def create_task(
    kind: str,
    title: str,
    plan: Mapping[str, Any],
    *,
    project: str = "",
    attempt_budget: int | None = None,
    idempotency_key: str | None = None,
) -> Steps[Task]:
    body: dict[str, Any] = {"kind": kind, "title": title, "plan": plan}
    if project:
        body["project"] = project
    if attempt_budget is not None:
        body["attempt_budget"] = attempt_budget
    # Always keyed, so a retried create (an answer lost on the way back) never makes a second task.
    key = idempotency_key or f"rk-client:create:{uuid.uuid4()}"
    reply = yield Call("POST", "/tasks", body, {"Idempotency-Key": key})
    return Task.of(ok(reply))


def get_task(task_id: int) -> Steps[Task]:
    return Task.of(ok((yield Call("GET", f"/tasks/{task_id}"))))


def node_receipt(task_id: int, node_key: str) -> Steps[NodeReceipt]:
    """The receipt of a node's effect as Reckon holds it. ApiError ``receipt_not_found`` (404) while it has none,
    ``node_not_found`` (404) when the task's current plan has no such node."""
    return NodeReceipt.of(ok((yield Call("GET", f"/tasks/{task_id}/nodes/{quote(node_key, safe='')}/receipt"))))


def cancel(task_id: int, reason: str, *, version: int | None = None) -> Steps[Task]:
    """Ask Reckon to cancel (the creator may, without a lease). In-flight work settles; nothing new starts."""
    headers = {"If-Match": f'"{version}"'} if version is not None else {}
    reply = yield Call("POST", f"/tasks/{task_id}/cancel", {"reason": reason}, headers)
    return Task.of(ok(reply))


def retain(
    task_id: int,
    kind: str,
    name: str,
    content: Content,
    *,
    ttl_seconds: int | None = None,
    idempotency_key: str | None = None,
) -> Steps[RetainedRef]:
    """Retain ``content`` as the next version of ``name`` (sealed, expiring); the answer is what a checkpoint keeps.
    Always keyed, so a retry after a lost answer answers the same reference instead of retaining twice."""
    body: dict[str, Any] = {"kind": kind, "name": name, "content": _content_json(content)}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    key = idempotency_key or f"rk-client:retain:{uuid.uuid4()}"
    reply = yield Call("POST", f"/tasks/{task_id}/retained", body, {"Idempotency-Key": key})
    ref = ok(reply)
    return RetainedRef(task_id=task_id, id=int(ref["retained"]), version=int(ref["version"]))


def fetch(ref: RetainedRef) -> Steps[Retained]:
    """The object's content while its retention lasts. Gone (410 ``retention_expired``): ApiError — re-create it
    from external facts (``fetch_or_recreate``); corrupt (409 ``retention_corrupt``): ApiError, never re-created."""
    body = ok((yield Call("GET", f"/tasks/{ref.task_id}/retained/{ref.id}/versions/{ref.version}")))
    content = body.get("content")
    return Retained(
        ref=ref,
        kind=str(body.get("kind", "")),
        name=str(body.get("name", "")),
        expires_at=parse_time(body.get("expires_at")),
        content=dict(content) if isinstance(content, dict) else base64.b64decode(str(content or ""), validate=True),
    )


def fetch_or_recreate(ref: RetainedRef) -> Steps[Retained]:
    """The object, or — when its retention has ended — the content the Recreator re-reads from external facts,
    retained again as the next version of the same kind and name (the 410 names them). The answer's ``ref`` is the
    one to keep in the checkpoint: never a reference to something that is gone. Anything else (not found, corrupt)
    is an ApiError: re-creating over a corrupt object would hide what is wrong."""
    try:
        return (yield from fetch(ref))
    except ApiError as refusal:
        if refusal.code != "retention_expired":
            raise
        kind, name = refusal.problem.get("kind"), refusal.problem.get("name")
        if not isinstance(kind, str) or not isinstance(name, str):
            raise
    content = yield Remote("recreate", ())
    new = yield from retain(ref.task_id, kind, name, content)
    return (yield from fetch(new))


def _content_json(content: Content) -> Any:
    """A debug artifact's fields as the JSON object they are; bytes as base64 text."""
    if isinstance(content, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(content)).decode()
    if isinstance(content, Mapping):
        return dict(content)
    raise TypeError(f"retained content is bytes (or, for a debug artifact, a dict), not {type(content).__name__}")


def acquire(task_id: int, *, ttl_seconds: int | None, lease_wait: float) -> Steps[LeaseState | RunResult]:
    """The lease, or why not: another holder (retried for up to ``lease_wait`` seconds: a crashed holder's lease
    lapses after its ttl and grace), a person taking the task over, a status agents may not hold."""
    key = f"rk-client:lease:{uuid.uuid4()}"  # a lost answer retried replays the grant, not "held by you"
    waited = 0.0
    while True:
        # start_next: the answer carries the first directive, and a node it says to execute is already started.
        body = ({"ttl_seconds": round(ttl_seconds)} if ttl_seconds else {}) | {"start_next": True}
        reply = yield Call("POST", f"/tasks/{task_id}/lease", body, {"Idempotency-Key": key})
        if 200 <= reply.status < 300:
            return LeaseState.of(reply.body)
        refusal = ApiError.of(reply.status, reply.body)
        if refusal.code not in BUSY and refusal.code != "lease_refused":
            raise refusal
        if refusal.code not in BUSY or waited >= lease_wait:
            return RunResult("stopped", refusal.code, detail=refusal.detail)
        pause = min(1.0, lease_wait - waited)
        waited += pause
        yield Sleep(pause)


def renew(state: LeaseState) -> Steps[None]:
    """One renewal (the background renewer's step). A lease lost or lapsed raises the stop flag for good."""
    seq = state.renewal_seq
    # Keyed by lease and seq (the contract: every POST honours Idempotency-Key): a retry replays the renewal.
    headers = _lease_headers(state) | {"Idempotency-Key": f"rk-client:renew:{state.lease_id}:{seq}"}
    reply = yield Call("POST", f"/tasks/{state.task_id}/lease/renew", {"renewal_seq": seq}, headers)
    if 200 <= reply.status < 300:
        state.heard(reply.body)
        return
    refusal = ApiError.of(reply.status, reply.body)
    if refusal.code in LOST:
        state.lost = True
        state.stop_reason = refusal.code
        return
    if refusal.code == "renewal_out_of_order":
        # A renewal whose answer was lost did land (the server moved the seq): go on from the server's seq.
        current = refusal.problem.get("renewal_seq")
        found = re.search(r"lease is at (\d+)", refusal.detail)
        if isinstance(current, int):
            state.renewal_seq = current
        else:
            state.renewal_seq = int(found.group(1)) if found else state.renewal_seq + 1
        return
    raise refusal


def release(state: LeaseState) -> Steps[None]:
    reply = yield Call("DELETE", f"/tasks/{state.task_id}/lease", None, _lease_headers(state))
    if reply.status >= 300 and ApiError.of(reply.status, reply.body).code not in LOST:
        raise ApiError.of(reply.status, reply.body)


def steps(
    state: LeaseState, *, max_wait: float, compensate: bool, fences: bool = False, deletes: bool = False
) -> Steps[RunResult]:
    """Follow the directive until done, stop, or a wait longer than ``max_wait`` seconds. ``fences``: the connector
    has ``fence``, asked instead of ``lookup`` when the directive says so (a cancel is recorded). ``deletes``: the
    connector has ``delete(op_key, locator)``, called when the ended task's temp resources are to be deleted (the
    directive ``cleanup``); without it the run stops there (``cleanup_unsupported``) and they wait for a person."""
    base = f"/tasks/{state.task_id}"
    done = conflicts = 0
    # The next directive an answer carried (start_next): the grant's first, then each outcome's.
    following, state.first = state.first, None
    while True:
        if state.lost:
            return RunResult("stopped", state.stop_reason, steps=done)
        try:
            d = (
                following
                if following is not None
                else ok((yield Call("GET", f"{base}/directive", None, _lease_headers(state))))
            )
            following = None
            kind, version = str(d["kind"]), int(d["task_version"])
            op_key, reason = str(d.get("op_key") or ""), str(d.get("reason") or "")
            if kind == "done":
                return RunResult("done", steps=done)
            if kind == "stop":
                return RunResult("stopped", reason, steps=done)
            if kind == "wait":
                until = parse_time(d.get("until")) or _now()
                pause = (until - _now()).total_seconds()
                if pause > max_wait:
                    return RunResult("waiting", reason, until=until, steps=done)
                yield Sleep(max(pause, MIN_WAIT))  # at least a little: our clock is not the database's
            elif kind == "reconcile" and op_key:
                ask: Literal["fence", "lookup"] = "fence" if fences and d.get("fence") else "lookup"
                asked_at = str(d.get("asked_at") or "")
                ended, following = yield from _reconcile(state, base, op_key, version, max_wait, ask, asked_at)
                done += 1
                if ended is not None:
                    return RunResult(ended.status, ended.reason, ended.until, done, ended.detail)
            elif kind == "reconcile":
                yield from _recheck_inputs(state, base, d.get("input_refs") or {}, version)
            elif kind == "cleanup":
                if not deletes:  # the task has ended (reason: how); its temp resources are left for a person
                    detail = "the connector has no delete(op_key, locator): the task's temp resources are left"
                    ended_as: Literal["done", "stopped"] = "done" if reason == "completed" else "stopped"
                    return RunResult(ended_as, "cleanup_unsupported", steps=done, detail=detail)
                ended = yield from _cleanup(state, base, d.get("cleanup") or {}, version)
                done += 1
                if ended is not None:
                    return RunResult(ended.status, ended.reason, ended.until, done, ended.detail)
            elif kind == "execute":
                if state.stop_reason and not d.get("started"):  # cancel or takeover asked: start no side effect
                    return RunResult("stopped", state.stop_reason, steps=done)
                sent, following = yield from _execute(state, base, d, version, compensate)
                done += sent
            else:
                return RunResult("stopped", f"unknown_directive:{kind}", steps=done)
            conflicts = 0
        except ApiError as refusal:
            if refusal.status == 412 and conflicts < MAX_CONFLICTS:  # the task moved: re-read, never blind-retry
                conflicts += 1
                continue
            return RunResult("stopped", refusal.code, steps=done, detail=refusal.detail)
        except _Unreachable as unreachable:
            until = _now() + timedelta(seconds=OBSERVE_EVERY)
            return RunResult("waiting", "remote_unreachable", until=until, steps=done, detail=str(unreachable))


class _Unreachable(Exception):
    """The connector could not reach the remote for a query: nothing was written; ask again later."""


def _execute(
    state: LeaseState, base: str, d: Mapping[str, Any], version: int, compensate: bool
) -> Steps[tuple[bool, Mapping[str, Any] | None]]:
    """Intent, call, outcome: whether the call was made (not when a stop came in between the intent and the call),
    and the next directive the outcome's answer carried. A directive ``started`` by the previous outcome's answer
    needs no intent: its operation was registered and marked sent in that answer's commit."""
    if d.get("started") and isinstance(d.get("operation"), Mapping):
        op = d["operation"]
    else:
        # Commit 1: the intent, recorded and marked sent before the call (the op key exists before anything can
        # happen).
        body = {"node_key": str(d["node_key"])}
        headers = _lease_headers(state, version=version, body=["operations", body])
        reply = yield Call("POST", f"{base}/operations", body, headers)
        op = ok(reply)
        version = etag_version(reply) or version + 1
    if state.stop_reason:
        # Asked to stop while the intent was recorded: nothing is sent. The operation is open, so the next directive
        # is to look it up by op key (not found: settled as never sent), then to stop.
        return False, None
    send: Literal["submit", "compensate"] = (
        "compensate" if compensate and op.get("purpose") == "compensation" else "submit"
    )
    request = dict(op.get("request") or {})
    if op.get("not_after"):  # the deadline the remote refuses the request after (docs/api.md, a final not found)
        request["not_after"] = str(op["not_after"])
    outcome = _checked((yield Remote(send, (str(op["op_key"]), request))))
    # Commit 2: the receipt, and with it the next node's start when that is the next directive.
    answer = yield from _post_outcome(state, base, str(op["op_key"]), outcome, version)
    return True, _next_of(answer)


def _reconcile(
    state: LeaseState,
    base: str,
    op_key: str,
    version: int,
    max_wait: float,
    ask: Literal["fence", "lookup"],
    asked_at: str = "",
) -> Steps[tuple[RunResult | None, Mapping[str, Any] | None]]:
    try:
        outcome = _checked((yield Remote(ask, (op_key,))))
    except OSError as exc:  # a connector that raised instead of answering Failed(connection_interrupted)
        raise _Unreachable(f"{ask} of {op_key}: {exc}") from exc
    if isinstance(outcome, Failed) and outcome.failure_class == "connection_interrupted":
        raise _Unreachable(outcome.detail or f"{ask} of {op_key} failed")
    # A not found tells when the remote was asked: after this directive was read (the server's clock).
    extra = {"asked_at": asked_at} if isinstance(outcome, NotFound) and asked_at else {}
    answer = yield from _post_outcome(state, base, op_key, outcome, version, extra)
    if isinstance(outcome, Accepted):  # the remote still runs it: observe it, holding the lease, and ask again
        if max_wait < OBSERVE_EVERY:
            return RunResult("waiting", "observing", until=_now() + timedelta(seconds=OBSERVE_EVERY)), None
        yield Sleep(OBSERVE_EVERY)
        return None, None  # the directive is read again after the pause
    task = answer.get("task") or {}
    if int(task.get("version", version + 1)) == version:  # nothing new to record (still unprovable)
        return RunResult("waiting", "inconclusive", until=_now() + timedelta(seconds=OBSERVE_EVERY)), None
    return None, _next_of(answer)


def _cleanup(state: LeaseState, base: str, work: Mapping[str, Any], version: int) -> Steps[RunResult | None]:
    """Delete exactly the temp resource's locator under the op key Reckon registered (``ask: delete``), or ask the
    remote what became of a delete that may have been sent (``ask: lookup``: never sent again blindly); report the
    answer. A remote that cannot be asked ends the run (nothing was written); the next one asks again."""
    op_key, locator, temp_id = str(work["op_key"]), str(work["locator"]), int(work["temp_id"])
    ask: Literal["delete", "lookup"] = "delete" if work.get("ask") == "delete" else "lookup"
    try:
        outcome = _checked((yield Remote(ask, (op_key, locator) if ask == "delete" else (op_key,))))
    except OSError as exc:  # a connector that raised instead of answering
        if ask == "delete":  # it may have reached the remote: report it unknown, the next directive asks
            outcome = Failed("connection_interrupted", f"delete of {locator}: {exc}")
        else:
            raise _Unreachable(f"lookup of {op_key}: {exc}") from exc
    if ask == "lookup" and isinstance(outcome, Failed) and outcome.failure_class == "connection_interrupted":
        raise _Unreachable(outcome.detail or f"lookup of {op_key} failed")
    body = outcome_json(outcome) | {"op_key": op_key}
    path = f"{base}/temp-resources/{temp_id}/cleanup"
    answer = ok((yield Call("POST", path, body, _lease_headers(state, version=version, body=[path, body]))))
    if isinstance(outcome, Accepted):  # the remote still deletes it: ask again a little later
        return RunResult("waiting", "observing", until=_now() + timedelta(seconds=OBSERVE_EVERY))
    if int((answer.get("task") or {}).get("version", version + 1)) == version:  # nothing new (still unprovable)
        return RunResult("waiting", "inconclusive", until=_now() + timedelta(seconds=OBSERVE_EVERY))
    return None


def _recheck_inputs(state: LeaseState, base: str, refs: Mapping[str, Any], version: int) -> Steps[None]:
    """Handed back by a person: read each input ref's version now and report them (a change pauses the task)."""
    versions: dict[str, str] = {}
    for name, ref in refs.items():
        ref = ref.get("ref", ref) if isinstance(ref, Mapping) else {}
        try:
            versions[name] = str((yield Remote("current_version", (str(ref.get("locator", "")),))))
        except OSError as exc:
            raise _Unreachable(f"version of {name}: {exc}") from exc
    body = {"current_versions": versions}
    ok((yield Call("POST", f"{base}/inputs", body, _lease_headers(state, version=version, body=["inputs", body]))))


def _post_outcome(
    state: LeaseState, base: str, op_key: str, outcome: Outcome, version: int, extra: Mapping[str, Any] | None = None
) -> Steps[Any]:
    # start_next: the answer carries the next directive, and a fresh node's start is written with the receipt.
    body = outcome_json(outcome) | dict(extra or {}) | {"start_next": True}
    path = f"{base}/operations/{quote(op_key, safe='')}/outcome"
    return ok((yield Call("POST", path, body, _lease_headers(state, version=version, body=[path, body]))))


def _next_of(answer: Any) -> Mapping[str, Any] | None:
    """The next directive an outcome's answer carries (null from a server that does not offer it: read it)."""
    following = answer.get("next") if isinstance(answer, Mapping) else None
    return following if isinstance(following, Mapping) else None


def _checked(value: Any) -> Outcome:
    if not isinstance(value, OUTCOME_TYPES):
        raise TypeError(f"a connector must return an Outcome, not {type(value).__name__}")
    return value
