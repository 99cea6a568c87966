"""``AsyncReckon``: the asyncio client, the same surface as ``Reckon`` with ``await``. Its renewer is a task."""

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Self

import httpx

from reckon_client import protocol
from reckon_client.connector import AsyncConnector, Connector
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


class AsyncReckon:
    """async with AsyncReckon(url, token) as reckon:
    result = await reckon.run(task_id, connector)   # connector: submit / lookup / current_version are async
    """

    def __init__(
        self, url: str, token: str, *, timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=api_base(url), headers=default_headers(token), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create_task(
        self,
        kind: str,
        title: str,
        plan: Mapping[str, Any],
        *,
        project: str = "",
        attempt_budget: int | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        steps = protocol.create_task(
            kind, title, plan, project=project, attempt_budget=attempt_budget, idempotency_key=idempotency_key
        )
        return await self._drive(steps)

    async def get_task(self, task_id: int) -> Task:
        return await self._drive(protocol.get_task(task_id))

    async def node_receipt(self, task_id: int, node_key: str) -> NodeReceipt:
        return await self._drive(protocol.node_receipt(task_id, node_key))

    async def cancel(self, task_id: int, reason: str, *, version: int | None = None) -> Task:
        return await self._drive(protocol.cancel(task_id, reason, version=version))

    async def run(
        self,
        task_id: int,
        connector: AsyncConnector | Connector,
        *,
        ttl_seconds: int | None = None,
        max_wait: float = 60.0,
        lease_wait: float = 0.0,
    ) -> RunResult:
        """As ``Reckon.run``."""
        acquired = await self._drive(protocol.acquire(task_id, ttl_seconds=ttl_seconds, lease_wait=lease_wait))
        if isinstance(acquired, RunResult):
            return acquired
        renewer = asyncio.create_task(self._renew(acquired), name=f"reckon-renew-{task_id}")
        try:
            compensate = callable(getattr(connector, "compensate", None))
            fences = callable(getattr(connector, "fence", None))
            deletes = callable(getattr(connector, "delete", None))
            steps = protocol.steps(acquired, max_wait=max_wait, compensate=compensate, fences=fences, deletes=deletes)
            return await self._drive(steps, connector)
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            if not acquired.lost:
                with contextlib.suppress(httpx.HTTPError, ApiError):
                    await self._drive(protocol.release(acquired))

    async def retain(
        self,
        task_id: int,
        kind: str,
        name: str,
        content: Content,
        *,
        ttl_seconds: int | None = None,
        idempotency_key: str | None = None,
    ) -> RetainedRef:
        """As ``Reckon.retain``."""
        steps = protocol.retain(task_id, kind, name, content, ttl_seconds=ttl_seconds, idempotency_key=idempotency_key)
        return await self._drive(steps)

    async def fetch(self, ref: RetainedRef) -> Retained:
        return await self._drive(protocol.fetch(ref))

    async def fetch_or_recreate(
        self, ref: RetainedRef, *, recreate: Callable[[], Content | Awaitable[Content]]
    ) -> Retained:
        """As ``Reckon.fetch_or_recreate``; ``recreate`` may be a coroutine function."""
        return await self._drive(protocol.fetch_or_recreate(ref), Recreator(recreate))

    async def _renew(self, state: LeaseState) -> None:
        while not state.lost:
            await asyncio.sleep(state.renew_every)
            with contextlib.suppress(httpx.HTTPError, ApiError):  # tried again next tick
                await self._drive(protocol.renew(state))

    async def _drive[T](self, steps: Steps[T], connector: Any = None) -> T:
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
                    value = await self._send(effect)
                elif isinstance(effect, Remote):
                    value = getattr(connector, effect.name)(*effect.args)
                    if inspect.isawaitable(value):  # a sync connector works too (it blocks the loop meanwhile)
                        value = await value
                elif isinstance(effect, Sleep):
                    await asyncio.sleep(effect.seconds)
            except Exception as exc:  # handed to the protocol, which decides (most propagate)
                error = exc

    async def _send(self, call: Call) -> protocol.Reply:
        for attempt in range(MAX_ATTEMPTS):
            last = attempt == MAX_ATTEMPTS - 1
            try:
                response = await self._http.request(**request_args(call))
            except httpx.TransportError:
                if last:
                    raise
                await asyncio.sleep(retry_delay(attempt))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                await asyncio.sleep(retry_delay(attempt, response.headers.get("Retry-After")))
                continue
            return reply_of(response.status_code, response.headers, response.content)
        raise AssertionError("unreachable")
