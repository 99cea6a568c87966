"""One side-effecting tool call of an agent framework as its own small Reckon task: registered (intent, op key)
before the tool runs, its output kept as the receipt's, and after a crash reconciled by op key — never run again.

    calls = ToolCalls(reckon, session="thread-42", journal="tool-calls.sqlite3")
    pay = Tool("pay", send=send_payment, lookup=find_payment, approval=True)
    output = calls.call(pay, call_id="call_abc", arguments={"to": "bob", "amount": 5})

``send(op_key, arguments)`` does the side effect, passing the op key on as the remote's idempotency key when it can,
and returns the output (JSON, or ``ToolReceipt(output, remote_id)`` to name the remote's id). ``lookup(op_key)``
asks the remote what became of the op key: the output, ``NotFound()`` (no trace: sent again under the same key) or
``Unprovable()``; it raises ``OSError`` when the remote cannot be asked (the run waits and asks again). A tool
without ``lookup`` is unprovable once its outcome is unknown: a person decides on the console, it is never run again
blindly. ``send`` raising anything means "it may or may not have happened" (looked up, never re-sent blindly);
``send`` returning ``Failed("invalid_params", …)`` is a definite refusal (the call fails, nothing was done).

How a call finds its task again: the task is created with an Idempotency-Key derived from (session, tool name, the
framework's call id), so an agent that restarts and re-issues the same call gets the same task, whose open
operation the client reconciles by op key before anything is sent. The same call id with other arguments is
refused (``ToolCallConflict``): never the approved call's task run with another call's arguments.

Where the output lives: sealed in Reckon as a retained object of the task (``sensitive_input``, never in the log),
named by the receipt (``data: {"output": {"retained", "version"}}``, ``digest``: the output's sha256), and, when
``journal`` names one, by an entry on the agent's side (a SQLite file beside the framework's checkpoint: call → task,
op key, retained reference). A restarted agent finds the output of a call that completed before its framework could
record it through the journal's reference, or without one through the receipt Reckon answers
(``GET …/nodes/call/receipt``); once the retention has ended it asks the tool's lookup by op key, and where the tool
has none that output is lost — ``ToolOutputLost`` — and the tool is still not run again.

End states of ``call``: the output (done), or one of the exceptions below, each naming the task: ``ApprovalRequired``
and ``ToolCallUnprovable`` (a person must act on the console; both are ``PersonNeeded``, which a framework turns into
its interrupt), ``ToolCallStopped`` (cancelled or stopped by an operator), ``ToolCallFailed`` (the tool refused for
good), ``ToolCallHeld`` (a person or another process holds it now, or it waits: call again later),
``ToolCallConflict``, ``ToolOutputLost``.
"""

import hashlib
import json
import sqlite3
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from reckon_client.errors import ApiError
from reckon_client.outcomes import (
    OUTCOME_TYPES,
    Committed,
    Failed,
    NotFound,
    Outcome,
    Unprovable,
)
from reckon_client.protocol import RetainedRef, Task
from reckon_client.sync import Reckon

ACTION = "tool.call"  # registered on the server by integrations/apps.py
KIND = "tool_call"
CALL_NODE = "call"
APPROVAL_NODE = "approve"
OUTPUT_KIND = "sensitive_input"
ENDED_STOPPED = frozenset({"stopped", "stopping", "stopped_pending"})


@dataclass(frozen=True)
class ToolReceipt:
    """What ``send`` or ``lookup`` may return to name the remote's own id for the write (the receipt's remote id;
    the op key otherwise)."""

    output: Any
    remote_id: str = ""


@dataclass(frozen=True)
class Tool:
    """A side-effecting tool: ``send(op_key, arguments)`` → output; ``lookup(op_key)`` → output | ``NotFound()`` |
    ``Unprovable()`` (None: the tool cannot be asked). ``approval``: a person approves each call, bound to its exact
    arguments, before it runs."""

    name: str
    send: Callable[[str, dict[str, Any]], Any]
    lookup: Callable[[str], Any] | None = None
    approval: bool = False


# --------------------------------------------------------------------------------------------------- end states


class ToolCallError(Exception):
    """A tool call that did not give its output now. ``task_id``: its Reckon task (the console's page for it)."""

    def __init__(self, message: str, *, tool: str, call_id: str, task_id: int | None, reason: str = "") -> None:
        super().__init__(message)
        self.tool, self.call_id, self.task_id, self.reason = tool, call_id, task_id, reason


class PersonNeeded(ToolCallError):
    """A person must act on the console before the call can go on: a framework pauses here (LangGraph:
    ``interrupt()``) and calls again once they have."""

    def payload(self) -> dict[str, Any]:
        return {
            "reckon": type(self).__name__,
            "reason": self.reason,
            "tool": self.tool,
            "call_id": self.call_id,
            "task_id": self.task_id,
            "detail": str(self),
        }


class ApprovalRequired(PersonNeeded):
    """The call waits for a person's approval of its exact request. ``approval``: what the task's Approval says
    (``awaited.digest``: the digest the person approves; ``code``: why it is awaited)."""

    def __init__(self, message: str, *, approval: Mapping[str, Any], arguments: Mapping[str, Any], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.approval, self.arguments = dict(approval), dict(arguments)

    def payload(self) -> dict[str, Any]:
        awaited = self.approval.get("awaited") or {}
        return super().payload() | {
            "arguments": self.arguments,
            "code": self.approval.get("code", ""),
            "digest": awaited.get("digest", ""),
        }


class ToolCallUnprovable(PersonNeeded):
    """The call's outcome is unknown and the tool cannot be asked: a person settles it on the console (it took
    effect, or it did not). It is never run again blindly."""


class ToolCallStopped(ToolCallError):
    """An operator cancelled or stopped the call's task: nothing more is sent."""


class ToolCallFailed(ToolCallError):
    """The tool refused the call for good (or its task failed): nothing took effect that Reckon knows of."""


class ToolCallHeld(ToolCallError):
    """The call cannot go on now (a person holds its task, another process holds its lease, a backoff, a remote that
    cannot be asked): call again later. ``until``: when, if known."""

    def __init__(self, message: str, *, until: datetime | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.until = until


class ToolCallConflict(ToolCallError):
    """The same call id (same session, same tool) came with other arguments than the call Reckon registered: it is
    not that call, and it is not run."""


class ToolOutputLost(ToolCallError):
    """The call completed (its effect is recorded once) but its output cannot be read back: no journal entry, or
    its retention ended and the tool has no lookup. It is not run again."""


# --------------------------------------------------------------------------------------------------- the journal


class Journal:
    """The agent's own record of its calls, one SQLite file (keep it beside the framework's checkpoint): call key →
    task, op key, the retained output's reference. Written before the outcome is reported, so a call that completed
    before the framework recorded it finds its output again. Holds references, never the output."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with closing(sqlite3.connect(self.path)) as db, db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, task_id INTEGER, op_key TEXT, output TEXT)"
            )

    def sent(self, key: str, task_id: int, op_key: str) -> None:
        with closing(sqlite3.connect(self.path)) as db, db:
            db.execute(
                "INSERT INTO calls (key, task_id, op_key) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET task_id = excluded.task_id, op_key = excluded.op_key",
                (key, task_id, op_key),
            )

    def kept(self, key: str, ref: RetainedRef) -> None:
        with closing(sqlite3.connect(self.path)) as db, db:
            db.execute("UPDATE calls SET output = ? WHERE key = ?", (json.dumps(ref.as_checkpoint()), key))

    def entry(self, key: str) -> tuple[int, str, dict[str, Any] | None] | None:
        with closing(sqlite3.connect(self.path)) as db:
            row = db.execute("SELECT task_id, op_key, output FROM calls WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return int(row[0]), str(row[1] or ""), json.loads(row[2]) if row[2] else None


# --------------------------------------------------------------------------------------------------- the calls


def call_key(session: str, tool: str, call_id: str) -> str:
    """The Idempotency-Key of the call's task: stable for (session, tool, call id), printable ASCII, ≤ 200."""
    digest = hashlib.sha256(json.dumps([session, tool, call_id]).encode()).hexdigest()
    return f"rk-tool:{digest[:48]}"


def call_input(tool: str, call_id: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tool.call`` node's input: what the operation's request carries, and what an approval binds."""
    return {"tool": tool, "call_id": call_id, "arguments": {"kwargs": dict(arguments)}}


def call_plan(tool: Tool, call_id: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """One ``tool.call`` node, behind an ``approval`` node when the tool needs a person's approval. A definite
    refusal fails the task (the framework gets ``ToolCallFailed``) instead of pausing it for a re-plan."""
    node: dict[str, Any] = {
        "key": CALL_NODE,
        "action": ACTION,
        "input": call_input(tool.name, call_id, arguments),
        "evidence": {"remote_id": True},
        "on_failure": {"invalid_params": "fail_task"},
    }
    if not tool.approval:
        return {"nodes": [node]}
    gate = {"key": APPROVAL_NODE, "action": "approval", "evidence": {"remote_id": True}}
    return {"nodes": [gate, node | {"depends_on": [APPROVAL_NODE]}]}


class ToolCalls:
    """The tool calls of one agent session (``session``: the framework's thread or run id; the tasks' project, so
    the console groups them). ``journal``: a path for the agent's journal (see the module's docstring).
    ``lease_ttl``/``lease_wait``: a restarted agent waits up to ``lease_wait`` seconds for its crashed predecessor's
    lease to lapse (its ttl plus the server's grace)."""

    def __init__(
        self,
        reckon: Reckon,
        *,
        session: str,
        kind: str = KIND,
        journal: str | Path | None = None,
        lease_ttl: int = 30,
        lease_wait: float | None = None,
        max_wait: float = 30.0,
    ) -> None:
        self.reckon, self.session, self.kind = reckon, session, kind
        self.journal = Journal(journal) if journal is not None else None
        self.lease_ttl, self.max_wait = lease_ttl, max_wait
        self.lease_wait = lease_wait if lease_wait is not None else lease_ttl + 5.0

    def register(self, tool: Tool, call_id: str, arguments: Mapping[str, Any]) -> Task:
        """The call's task as it stands: created the first time, found again after (keyed by session, tool and call
        id); ``ToolCallConflict`` if that call was registered with other arguments. Runs nothing."""
        try:
            created = self.reckon.create_task(
                self.kind,
                f"{tool.name} {call_id}"[:200],
                call_plan(tool, call_id, arguments),
                project=self.session[:100],
                idempotency_key=call_key(self.session, tool.name, call_id),
            )
        except ApiError as refusal:
            if refusal.code == "idempotency_key_reused":
                raise ToolCallConflict(
                    f"call {call_id} of {tool.name} was registered with other arguments: not run",
                    task_id=None,
                    reason=refusal.code,
                    tool=tool.name,
                    call_id=call_id,
                ) from refusal
            raise
        return self.reckon.get_task(created.id)  # a replayed create answers the task as it was first made

    def call(self, tool: Tool, call_id: str, arguments: Mapping[str, Any]) -> Any:
        """Run the call once, whatever crashes came before, and answer its output; or raise its end state."""
        key = call_key(self.session, tool.name, call_id)
        task = self.register(tool, call_id, arguments)
        if task.status == "completed":
            return self._recorded(tool, call_id, key, task)
        if task.status not in ENDED_STOPPED | {"failed", "quarantined"}:
            connector = _ToolConnector(self, tool, key, task.id)
            result = self.reckon.run(
                task.id, connector, ttl_seconds=self.lease_ttl, max_wait=self.max_wait, lease_wait=self.lease_wait
            )
            if result.done:
                return connector.output if connector.answered else self._recorded(tool, call_id, key, task)
            task = self.reckon.get_task(task.id)
            reason, until = result.reason, result.until
        else:
            reason, until = task.status, None
        raise self._end_state(tool, call_id, arguments, task, reason, until)

    def _end_state(
        self, tool: Tool, call_id: str, arguments: Mapping[str, Any], task: Task, reason: str, until: datetime | None
    ) -> ToolCallError:
        """What a run that did not finish the call says, read with the task as it stands after it (a run that asked
        an unprovable operation again ends "inconclusive": the task's pause says why)."""
        named: dict[str, Any] = {"tool": tool.name, "call_id": call_id, "task_id": task.id, "reason": reason}
        if task.status in ENDED_STOPPED or reason in ("cancel_requested", "stopped") or task.cancel_requested:
            return ToolCallStopped(f"{tool.name} {call_id}: task {task.id} was stopped ({reason})", **named)
        if task.status in ("failed", "quarantined"):
            return ToolCallFailed(f"{tool.name} {call_id}: task {task.id} is {task.status}", **named)
        if reason == "awaiting_approval":
            approval: dict[str, Any] = next(iter(task.raw.get("approvals") or []), {})
            why = approval.get("why") or "a person's approval of this exact call"
            return ApprovalRequired(
                f"{tool.name} {call_id} waits for approval on task {task.id}: {why}",
                approval=approval,
                arguments=arguments,
                **named,
            )
        if reason == "unprovable" or (task.status == "paused" and task.status_reason == "unprovable"):
            named["reason"] = "unprovable"
            return ToolCallUnprovable(
                f"{tool.name} {call_id}: whether the call took effect is unknown and the tool cannot be asked; a "
                f"person settles task {task.id} on the console",
                **named,
            )
        return ToolCallHeld(f"{tool.name} {call_id}: task {task.id} cannot go on now ({reason})", until=until, **named)

    def _recorded(self, tool: Tool, call_id: str, key: str, task: Task) -> Any:
        """The output of a call whose task completed before this process saw it: the retained output the receipt
        names (the journal's reference, else the receipt as Reckon recorded it), or once that retention has ended by
        asking the tool again by op key. Never by running it."""
        named: dict[str, Any] = {"tool": tool.name, "call_id": call_id, "task_id": task.id, "reason": "output_lost"}
        entry = self.journal.entry(key) if self.journal is not None else None
        if entry is not None:
            _, op_key, output = entry
        else:
            try:
                recorded = self.reckon.node_receipt(task.id, CALL_NODE)
            except ApiError as refusal:
                if refusal.code not in ("receipt_not_found", "node_not_found"):
                    raise
                lost = f"{tool.name}: task {task.id} completed; no receipt names its output"
                raise ToolOutputLost(lost, **named) from refusal
            op_key, output = recorded.op_key, recorded.receipt.data.get("output")
        if isinstance(output, Mapping):
            try:
                read = self.reckon.fetch(RetainedRef.of_checkpoint(task.id, output))
                return json.loads(bytes(read.content) if isinstance(read.content, bytes) else b"null")
            except ApiError as refusal:
                if refusal.code != "retention_expired":
                    raise
        if tool.lookup is not None and op_key:
            found = tool.lookup(op_key)
            if not isinstance(found, OUTCOME_TYPES):
                return found.output if isinstance(found, ToolReceipt) else found
        raise ToolOutputLost(f"{tool.name}: task {task.id} completed; its output can no longer be read", **named)


@dataclass
class _ToolConnector:
    """The connector of one call's task: ``submit`` runs the tool (given the op key) on the request Reckon
    registered — the arguments approved, not the caller's copy — and ``lookup`` asks the tool."""

    calls: ToolCalls
    tool: Tool
    key: str
    task_id: int
    output: Any = None
    answered: bool = False

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        given = request.get("input") or {}
        arguments = (given.get("arguments") or {}).get("kwargs")
        if given.get("tool") != self.tool.name or not isinstance(arguments, dict):
            return Failed("invalid_params", f"not a call of {self.tool.name}: {sorted(given)}")
        if self.calls.journal is not None:
            self.calls.journal.sent(self.key, self.task_id, op_key)
        try:
            said = self.tool.send(op_key, dict(arguments))
        except Exception as exc:  # it may or may not have happened: looked up by op key, never re-sent blindly
            return Failed("connection_interrupted", f"{type(exc).__name__}: {exc}"[:500])
        return self._answer(op_key, said)

    def lookup(self, op_key: str) -> Outcome:
        if self.tool.lookup is None:
            return Unprovable(f"the tool {self.tool.name} cannot be asked what became of a call")
        if self.calls.journal is not None:
            self.calls.journal.sent(self.key, self.task_id, op_key)
        return self._answer(op_key, self.tool.lookup(op_key))  # an OSError: the run waits and asks again

    def current_version(self, locator: str) -> str:
        return ""  # a tool call reads no versioned input

    def _answer(self, op_key: str, said: Any) -> Outcome:
        if isinstance(said, NotFound | Unprovable | Failed):
            return said
        if isinstance(said, OUTCOME_TYPES):
            return Failed("connection_interrupted", f"the tool answered {type(said).__name__}: looked up again")
        receipt = said if isinstance(said, ToolReceipt) else ToolReceipt(said)
        text = json.dumps(receipt.output, sort_keys=True, default=str)
        digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        self.output, self.answered = json.loads(text), True
        data: dict[str, Any] = {}
        try:
            ref = self.calls.reckon.retain(
                self.task_id,
                OUTPUT_KIND,
                f"output of {self.tool.name}"[:200],
                text.encode(),
                idempotency_key=f"rk-tool:output:{op_key}:{digest[7:39]}",
            )
        except (
            ApiError,
            httpx.HTTPError,
        ):  # the effect happened: its receipt is recorded all the same, without the copy
            ref = None
        if ref is not None:
            data["output"] = ref.as_checkpoint()
            if self.calls.journal is not None:
                self.calls.journal.kept(self.key, ref)
        return Committed(remote_id=(receipt.remote_id or op_key)[:200], digest=digest, data=data)
