"""The agent protocol as MCP tools: an agent that speaks MCP drives a Reckon task one instruction at a time.

    reckon_create_task(kind, title, plan, …)  → the task (keyed: the same idempotency_key answers the same task)
    reckon_next(task_id)                      → what to do now: an instruction, or how the run ended
    reckon_report(task_id, op_key, result, …) → what your system answered; → the next instruction
    reckon_report_version(task_id, locator, version)   (after a person handed the task back)
    reckon_release(task_id) · reckon_cancel(task_id, reason) · reckon_get_task(task_id)

Each task the agent drives is one suspended run of the client's own protocol (``reckon_client.protocol.steps``, the
code ``Reckon.run`` drives): this process holds the lease and renews it in the background, and where ``run`` would
call a connector, the run stops and hands the agent an **instruction** — ``submit`` (send this request once, with
this op key as its idempotency key: the operation is registered before the agent ever sees the key), ``lookup`` or
``fence`` (ask your system what became of this op key — never send it again), ``delete`` (a temp resource of an
ended task), ``compensate``, ``current_version``. The agent's report is the connector's answer, and the run goes on
to the next instruction or its end: ``done``, ``stopped`` (with the reason: a cancel, a person taking over, an
approval awaited, a budget spent, …) or ``wait`` (ask again at ``until``).

A report must answer the instruction pending for that task (the same op key): anything else is refused by name
(``ReportRefused``) and changes nothing. If this process dies, its lease lapses after its TTL and grace; the next
``reckon_next`` (from a new process) takes the lease and — because the server's directive puts reconcile first —
hands out a ``lookup`` of any operation that was in flight, never a second ``submit``.
"""

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from reckon_client import protocol
from reckon_client.errors import ApiError
from reckon_client.outcomes import Accepted, Committed, Failed, FailureClass, Fenced, NotFound, Outcome, Unprovable
from reckon_client.protocol import Call, LeaseState, Remote, RunResult, Sleep, Steps
from reckon_client.sync import Reckon, Renewer

type Result = Literal["committed", "accepted", "failed", "not_found", "fenced", "unprovable"]
RESULTS: tuple[Result, ...] = ("committed", "accepted", "failed", "not_found", "fenced", "unprovable")
FAILURE_CLASSES: tuple[FailureClass, ...] = (
    "invalid_params",
    "permission_revoked",
    "dependency_unavailable",
    "connection_interrupted",
    "conflict",
)
# What the agent is told to do for each of the protocol's connector calls.
SAY = {
    "submit": "Send request['input'] for request['action'] to your system ONCE, passing op_key as its idempotency "
    "key, then report what it answered (reckon_report). If no answer came back, report failed "
    "connection_interrupted: Reckon will have you look it up, never send it again.",
    "compensate": "Undo: send request (the node's declared compensation) ONCE with op_key as its idempotency key, "
    "then report what it answered.",
    "lookup": "Do NOT send anything. Ask your system what became of op_key and report it: committed (with its "
    "remote_id), accepted (still running), not_found (no trace), unprovable (your system cannot tell), or failed "
    "connection_interrupted if you could not ask.",
    "fence": "Do NOT send anything. Ask your system what became of op_key and, if nothing, to refuse op_key from now "
    "on: report committed / accepted if it took effect, fenced if it is now refused, or answer as for a lookup if "
    "your system cannot fence.",
    "delete": "Delete exactly the object at locator (never a prefix) with op_key as the idempotency key, then report "
    "committed (count = how many were removed, 0 if it was already gone).",
    "current_version": "Read the current version of the source at locator and report it (reckon_report_version).",
}


class ReportRefused(ValueError):
    """A report that does not answer the instruction pending for the task: nothing was sent to Reckon."""


@dataclass
class _Run:
    """One task's suspended run: its lease (renewed in the background) and the connector call it waits on."""

    state: LeaseState
    steps: Steps[RunResult]
    renewer: Renewer
    pending: Remote | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class AgentRuns:
    """The runs this process drives, one per task, for agents that report over MCP (or any other caller)."""

    def __init__(self, reckon: Reckon, *, ttl_seconds: int = 120, lease_wait: float = 0.0, max_wait: float = 2.0):
        self._reckon = reckon
        self._ttl, self._lease_wait, self._max_wait = ttl_seconds, lease_wait, max_wait
        self._runs: dict[int, _Run] = {}
        self._guard = threading.Lock()  # over the table of runs; each run has its own lock for its steps

    def next(self, task_id: int) -> dict[str, Any]:
        """What the agent must do now for ``task_id``: the pending instruction again if there is one (asking twice
        is harmless), else the run is started or moved on until it needs the agent or ends."""
        run = self._runs.get(task_id) or self._start(task_id)
        if isinstance(run, RunResult):
            return _ended(task_id, run)
        with run.lock:
            if run.pending is not None:
                return _instruction(task_id, run.pending)
            return self._advance(task_id, run)

    def report(self, task_id: int, op_key: str, outcome: Outcome) -> dict[str, Any]:
        """The agent's answer to the pending submit, compensate, lookup, fence or delete of ``op_key``."""
        run = self._pending_run(task_id)
        with run.lock:
            pending = run.pending
            if pending is None or pending.name == "current_version" or pending.args[0] != op_key:
                raise ReportRefused(f"task {task_id} waits for {_waiting_for(pending)}, not a report on {op_key}")
            if pending.name != "fence" and isinstance(outcome, Fenced):
                raise ReportRefused(f"fenced answers a fence; {op_key} was handed out to {pending.name}")
            return self._answer(task_id, run, outcome)

    def report_version(self, task_id: int, locator: str, version: str | None) -> dict[str, Any]:
        """The agent's answer to a pending current_version of ``locator``; ``None``: the source could not be read."""
        run = self._pending_run(task_id)
        with run.lock:
            pending = run.pending
            if pending is None or pending.name != "current_version" or pending.args[0] != locator:
                raise ReportRefused(f"task {task_id} waits for {_waiting_for(pending)}, not a version of {locator}")
            if version is None:
                return self._throw(task_id, run, ConnectionError(f"the source at {locator} could not be read"))
            return self._answer(task_id, run, version)

    def release(self, task_id: int) -> dict[str, Any]:
        """Stop driving the task and give its lease back. An operation handed out and not reported stays open: the
        next holder looks it up by op key."""
        with self._guard:
            run = self._runs.pop(task_id, None)
        if run is None:
            return {"task_id": task_id, "released": False}
        with run.lock:
            self._let_go(run)
        return {"task_id": task_id, "released": True}

    def close(self) -> None:
        for task_id in list(self._runs):
            self.release(task_id)

    # ---------------------------------------------------------------------------------------------- the driver

    def _start(self, task_id: int) -> _Run | RunResult:
        with self._guard:
            if task_id in self._runs:
                return self._runs[task_id]
            ttl = self._ttl
            acquired = self._reckon.drive(protocol.acquire(task_id, ttl_seconds=ttl, lease_wait=self._lease_wait))
            if isinstance(acquired, RunResult):
                return acquired
            steps = protocol.steps(acquired, max_wait=self._max_wait, compensate=True, fences=True, deletes=True)
            run = _Run(acquired, steps, Renewer(self._reckon, acquired))
            self._runs[task_id] = run
            return run

    def _pending_run(self, task_id: int) -> _Run:
        run = self._runs.get(task_id)
        if run is None:
            raise ReportRefused(f"task {task_id} has no run here: ask reckon_next first")
        return run

    def _answer(self, task_id: int, run: _Run, value: Any) -> dict[str, Any]:
        run.pending = None
        return self._advance(task_id, run, value)

    def _throw(self, task_id: int, run: _Run, error: BaseException) -> dict[str, Any]:
        run.pending = None
        return self._advance(task_id, run, error=error)

    def _advance(
        self, task_id: int, run: _Run, value: Any = None, error: BaseException | None = None
    ) -> dict[str, Any]:
        """Drive the run's steps — requests to Reckon and short sleeps here — until a connector call (handed to the
        agent as an instruction) or the end (the lease given back)."""
        while True:
            try:
                effect = run.steps.throw(error) if error is not None else run.steps.send(value)
            except StopIteration as stop:
                self._end(task_id, run)
                return _ended(task_id, stop.value)
            except BaseException:
                self._end(task_id, run)
                raise
            if isinstance(effect, Remote):
                run.pending = effect
                return _instruction(task_id, effect)
            value, error = None, None
            try:
                if isinstance(effect, Call):
                    value = self._reckon.send(effect)
                elif isinstance(effect, Sleep):
                    time.sleep(min(effect.seconds, self._max_wait))
            except Exception as exc:  # handed to the protocol, which decides (most end the run)
                error = exc

    def _end(self, task_id: int, run: _Run) -> None:
        with self._guard:
            if self._runs.get(task_id) is run:
                del self._runs[task_id]
        self._let_go(run)

    def _let_go(self, run: _Run) -> None:
        run.renewer.stop()
        run.steps.close()
        if not run.state.lost:
            with contextlib.suppress(httpx.HTTPError, ApiError):  # else it lapses by itself after its ttl
                self._reckon.drive(protocol.release(run.state))


def outcome_of(
    result: str,
    *,
    remote_id: str = "",
    remote_version: str = "",
    count: int | None = None,
    digest: str = "",
    failure_class: str = "",
    detail: str = "",
    data: Mapping[str, Any] | None = None,
) -> Outcome:
    """The agent's report as an Outcome; a report that names no valid one is refused (``ReportRefused``)."""
    match result:
        case "committed":
            if not remote_id:
                raise ReportRefused("a committed report names the remote_id your system gave the write")
            return Committed(remote_id, remote_version, count, digest, dict(data or {}))
        case "accepted":
            if not remote_id:
                raise ReportRefused("an accepted report names the remote_id of the write still running")
            return Accepted(remote_id)
        case "failed":
            if failure_class not in FAILURE_CLASSES:
                raise ReportRefused(f"failure_class must be one of {', '.join(FAILURE_CLASSES)}")
            return Failed(failure_class, detail)  # checked against FAILURE_CLASSES above
        case "not_found":
            return NotFound()
        case "fenced":
            return Fenced()
        case "unprovable":
            return Unprovable(detail)
    raise ReportRefused(f"result must be one of {', '.join(RESULTS)}, not {result!r}")


def _instruction(task_id: int, effect: Remote) -> dict[str, Any]:
    told: dict[str, Any] = {"task_id": task_id, "do": effect.name, "say": SAY[effect.name]}
    if effect.name == "current_version":
        return told | {"locator": effect.args[0]}
    told["op_key"] = effect.args[0]
    if effect.name in ("submit", "compensate"):
        told["request"] = effect.args[1]
    elif effect.name == "delete":
        told["locator"] = effect.args[1]
    return told


def _ended(task_id: int, result: RunResult) -> dict[str, Any]:
    """How a run ended: ``done``, ``stopped`` (the reason) or ``wait`` (call reckon_next again at ``until``)."""
    do = "wait" if result.status == "waiting" else result.status
    ended: dict[str, Any] = {"task_id": task_id, "do": do, "reason": result.reason, "steps": result.steps}
    if result.until is not None:
        ended["until"] = result.until.isoformat()
    if result.detail:
        ended["detail"] = result.detail
    return ended


def _waiting_for(pending: Remote | None) -> str:
    if pending is None:
        return "no report (ask reckon_next)"
    return f"a report on the {pending.name} of {pending.args[0]}"
