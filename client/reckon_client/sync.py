"""``Reckon``: the blocking client. Its renewer is a thread."""

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Self

import httpx

from reckon_client import protocol
from reckon_client.connector import Connector
from reckon_client.errors import ApiError
from reckon_client.protocol import (
    Call,
    Content,
    LeaseState,
    NodeReceipt,
    Recreator,
    Remote,
    Retained,
    RetainedRef,
    RunResult,
    Sleep,
    Steps,
    Task,
)
from reckon_client.transport import (
    MAX_ATTEMPTS,
    RETRY_STATUSES,
    api_base,
    default_headers,
    reply_of,
    request_args,
    retry_delay,
)


class Reckon:
    """A client for one agent token.

    with Reckon("http://127.0.0.1:8000", token) as reckon:
        task = reckon.create_task("migrate_project_api", "Migrate acme", plan, project="acme")
        result = reckon.run(task.id, connector)     # RunResult: done / stopped (reason) / waiting (until)
    """

    def __init__(
        self, url: str, token: str, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._http = httpx.Client(
            base_url=api_base(url), headers=default_headers(token), timeout=timeout, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---------------------------------------------------------------------------------------------- the surface

    def create_task(
        self,
        kind: str,
        title: str,
        plan: Mapping[str, Any],
        *,
        project: str = "",
        attempt_budget: int | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        """Register a task with its plan. The same ``idempotency_key`` (and the same request) within 24 h answers the
        task made the first time: an agent that restarts can create "again" and resume its task."""
        steps = protocol.create_task(
            kind, title, plan, project=project, attempt_budget=attempt_budget, idempotency_key=idempotency_key
        )
        return self._drive(steps)

    def get_task(self, task_id: int) -> Task:
        return self._drive(protocol.get_task(task_id))

    def node_receipt(self, task_id: int, node_key: str) -> NodeReceipt:
        """What a step produced, as Reckon recorded it: the receipt of the node's effect (``ApiError``
        ``receipt_not_found`` while it has none)."""
        return self._drive(protocol.node_receipt(task_id, node_key))

    def cancel(self, task_id: int, reason: str, *, version: int | None = None) -> Task:
        return self._drive(protocol.cancel(task_id, reason, version=version))

    def run(
        self,
        task_id: int,
        connector: Connector,
        *,
        ttl_seconds: int | None = None,
        max_wait: float = 60.0,
        lease_wait: float = 0.0,
    ) -> RunResult:
        """Drive the task with ``connector`` until it is done, must stop, or must wait longer than ``max_wait``
        seconds. ``lease_wait``: how long to keep asking for a lease another holder has (a crashed agent's lapses
        after its ttl plus grace). The lease is renewed in the background and released at the end, whatever
        happens."""
        acquired = self._drive(protocol.acquire(task_id, ttl_seconds=ttl_seconds, lease_wait=lease_wait))
        if isinstance(acquired, RunResult):
            return acquired
        renewer = Renewer(self, acquired)
        try:
            compensate = callable(getattr(connector, "compensate", None))
            fences = callable(getattr(connector, "fence", None))
            deletes = callable(getattr(connector, "delete", None))
            steps = protocol.steps(acquired, max_wait=max_wait, compensate=compensate, fences=fences, deletes=deletes)
            return self._drive(steps, connector)
        finally:
            renewer.stop()
            if not acquired.lost:
                with contextlib.suppress(httpx.HTTPError, ApiError):  # else it lapses by itself after its ttl
                    self._drive(protocol.release(acquired))

    # ---------------------------------------------------------------------------------------------- retained objects

    def retain(
        self,
        task_id: int,
        kind: str,
        name: str,
        content: Content,
        *,
        ttl_seconds: int | None = None,
        idempotency_key: str | None = None,
    ) -> RetainedRef:
        """Seal ``content`` for the task as the next version of ``name``, expiring after ``ttl_seconds`` (default:
        the kind's retention). ``kind``: ``sensitive_input`` or ``temp_material`` (bytes), ``debug_artifact`` (a dict
        of minimal fields; credential-like data is refused). Keep ``ref.as_checkpoint()`` in the checkpoint."""
        steps = protocol.retain(task_id, kind, name, content, ttl_seconds=ttl_seconds, idempotency_key=idempotency_key)
        return self._drive(steps)

    def fetch(self, ref: RetainedRef) -> Retained:
        """The content while its retention lasts; ``ApiError`` ``retention_expired`` (410) once it has ended."""
        return self._drive(protocol.fetch(ref))

    def fetch_or_recreate(self, ref: RetainedRef, *, recreate: Callable[[], Content]) -> Retained:
        """The content, or — once its retention has ended — what ``recreate()`` reads again from external facts,
        retained as the next version. Keep the answer's ``ref`` in the checkpoint (it is new if it was re-created)."""
        return self._drive(protocol.fetch_or_recreate(ref), Recreator(recreate))

    # ---------------------------------------------------------------------------------------------- the driver

    def _drive[T](self, steps: Steps[T], connector: Any = None) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                result: T = stop.value
                return result
            value, error = None, None
            try:
                if isinstance(effect, Call):
                    value = self._send(effect)
                elif isinstance(effect, Remote):
                    value = getattr(connector, effect.name)(*effect.args)
                elif isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
            except Exception as exc:  # handed to the protocol, which decides (most propagate)
                error = exc

    def drive[T](self, steps: Steps[T]) -> T:
        """Run one of the protocol's exchanges that calls no connector (acquire, release, renew, …) to its end: for a
        driver of the protocol's steps other than ``run`` (the MCP server, reckon_client.mcp)."""
        return self._drive(steps)

    def send(self, call: Call) -> protocol.Reply:
        """One request to Reckon, with the client's retries (429, 503, transport errors): for a driver of the
        protocol's steps other than ``run`` (the MCP server, reckon_client.mcp)."""
        return self._send(call)

    def _send(self, call: Call) -> protocol.Reply:
        for attempt in range(MAX_ATTEMPTS):
            last = attempt == MAX_ATTEMPTS - 1
            try:
                response = self._http.request(**request_args(call))
            except httpx.TransportError:
                if last:
                    raise
                time.sleep(retry_delay(attempt))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(retry_delay(attempt, response.headers.get("Retry-After")))
                continue
            return reply_of(response.status_code, response.headers, response.content)
        raise AssertionError("unreachable")


class Renewer:
    """Renews the lease every ttl/3 until stopped; a renewal's answer may raise the run's stop flag."""

    def __init__(self, reckon: Reckon, state: LeaseState) -> None:
        self._reckon, self._state = reckon, state
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"reckon-renew-{state.task_id}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._halt.wait(self._state.renew_every) and not self._state.lost:
            try:
                self._reckon._drive(protocol.renew(self._state))
            except Exception:  # noqa: S112 - a failed renewal is tried again next tick; writes also extend the lease
                continue

    def stop(self) -> None:
        self._halt.set()
        self._thread.join()
