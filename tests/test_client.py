"""reckon_client's protocol mechanics against a scripted Reckon (httpx.MockTransport): what it sends, in which order,
with which headers, and what it does on 429, 412, a cancel, a crash, a lease someone else holds. The proof that it
drives the real server is tests/test_agent_e2e.py; these pin the rules that are hard to provoke there.

No database: the fake server below is a few nodes in a list."""

import asyncio
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from reckon_client import (
    Accepted,
    Actions,
    ApiError,
    AsyncReckon,
    Committed,
    Failed,
    Fenced,
    NotFound,
    Outcome,
    Reckon,
    Unprovable,
)
from reckon_client.outcomes import outcome_json
from reckon_client.protocol import LeaseState, renew
from reckon_client.transport import MAX_DELAY, api_base, retry_delay

TASK = 1


@dataclass
class FakeReckon:
    """One task of ``nodes`` run in order; an operation is open from its intent until its outcome. ``faults``:
    (method, path suffix) → answers to give instead, once each, in order."""

    nodes: list[str]
    version: int = 3
    done: set[str] = field(default_factory=set)
    open_op: str = ""  # op key registered and marked sent, not settled
    lease: dict[str, Any] = field(default_factory=dict)
    faults: dict[tuple[str, str], list[httpx.Response | Exception]] = field(default_factory=dict)
    seen: list[httpx.Request] = field(default_factory=list)
    released: bool = False
    fence: bool = False  # the directive's reconcile says fence (a cancel is recorded on the server)
    not_after: str = ""  # the deadline the server gives each operation
    # A grant or an outcome with start_next answers the next directive, a node it says to execute started.
    answers_next: bool = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        path = request.url.path.removeprefix(f"/api/v1/tasks/{TASK}")
        for (method, suffix), answers in self.faults.items():
            if request.method == method and path.endswith(suffix) and answers:
                answer = answers.pop(0)
                if isinstance(answer, Exception):
                    raise answer
                return answer
        body = json.loads(request.content) if request.content else {}
        if (request.method, path) == ("POST", "/lease"):
            granted = self._lease(renewal_seq=0)
            if self.answers_next and body.get("start_next"):  # the first directive, a node it says to execute started
                following = self._directive()
                if following["kind"] == "execute":
                    op = self._start(following["node_key"])
                    following |= {"op_key": op["op_key"], "operation": op, "started": True}
                granted |= {"next": following | {"task_version": self.version}, "task_version": self.version}
            return httpx.Response(201, json=granted, headers={"ETag": f'"{self.version}"'})
        if (request.method, path) == ("POST", "/lease/renew"):
            return httpx.Response(200, json=self._lease(renewal_seq=body["renewal_seq"] + 1))
        if (request.method, path) == ("DELETE", "/lease"):
            self.released = True
            return httpx.Response(204)
        if (request.method, path) == ("GET", "/directive"):
            return httpx.Response(200, json=self._directive(), headers={"ETag": f'"{self.version}"'})
        if request.headers.get("If-Match") != f'"{self.version}"':
            return problem(412, "version_conflict", current_version=self.version)
        if (request.method, path) == ("POST", "/operations"):
            op = self._start(body["node_key"])
            return httpx.Response(201, json=op, headers={"ETag": f'"{self.version}"'})
        if request.method == "POST" and path.endswith("/outcome"):
            op_key = path.split("/")[2]
            assert op_key == self.open_op, (op_key, self.open_op)
            if body["result"] == "committed":
                self.done.add(op_key.removeprefix("op-"))
            if body["result"] in ("committed", "not_found", "fenced"):  # settled (not found: to send again)
                self.open_op = ""
            if body["result"] in ("committed", "not_found", "fenced", "failed"):
                self.version += 1
            status = "committed" if body["result"] == "committed" else "dispatched"
            settled = {"operation": {"op_key": op_key, "status": status}, "task": {"version": self.version}}
            if self.answers_next and body.get("start_next"):
                following = self._directive()
                if following["kind"] == "execute" and body["result"] == "committed":  # started with the receipt
                    op = self._start(following["node_key"])
                    following |= {"op_key": op["op_key"], "operation": op, "started": True}
                settled |= {"next": following | {"task_version": self.version}}
            return httpx.Response(200, json=settled, headers={"ETag": f'"{self.version}"'})
        return problem(404, "not_found")

    def _start(self, node_key: str) -> dict[str, Any]:
        """The node's operation registered and marked sent."""
        self.open_op = f"op-{node_key}"
        self.version += 1
        op: dict[str, Any] = {"op_key": self.open_op, "node": node_key, "action": "a", "purpose": "effect"}
        op |= {"request": {"action": "a", "input": {"n": node_key}}, "status": "dispatched"}
        return op | {"not_after": self.not_after or None, "dispatch_count": 1}

    def _lease(self, renewal_seq: int) -> dict[str, Any]:
        lease = {"lease_id": 77, "task_id": TASK, "epoch": 2, "holder": "agent:a", "expires_at": "2026-12-01T00:00:00Z"}
        lease |= {"ttl_seconds": 300.0, "renewal_seq": renewal_seq, "task_version": self.version}
        return lease | {"cancel_requested": False, "takeover_requested": False} | self.lease

    def _directive(self) -> dict[str, Any]:
        d: dict[str, Any] = {"task_version": self.version, "node_key": "", "op_key": "", "until": None, "reason": ""}
        if self.open_op:  # in flight first, as the server's directive
            return d | {"kind": "reconcile", "op_key": self.open_op, "reason": "dispatched", "fence": self.fence}
        for reason in ("cancel_requested", "takeover_requested"):
            if self.lease.get(reason):
                return d | {"kind": "stop", "reason": reason}
        ready = [n for n in self.nodes if n not in self.done]
        return d | ({"kind": "execute", "node_key": ready[0]} if ready else {"kind": "done"})

    def calls(self, method: str, suffix: str) -> list[httpx.Request]:
        return [r for r in self.seen if r.method == method and r.url.path.endswith(suffix)]


def problem(status: int, code: str, **extra: Any) -> httpx.Response:
    body = {"type": f"https://reckon.dev/problems/{code}", "title": code, "status": status, "detail": code}
    return httpx.Response(
        status, json=body | {"code": code} | extra, headers={"Content-Type": "application/problem+json"}
    )


@dataclass
class Store:
    """A connector that records what it was asked; ``lookups`` answers lookups by op key."""

    lookups: dict[str, Outcome] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)
    fail_with: Exception | None = None

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        if self.fail_with:
            raise self.fail_with
        self.sent.append(op_key)
        return Committed(remote_id=f"r-{op_key}", count=1)

    def lookup(self, op_key: str) -> Outcome:
        return self.lookups.get(op_key, NotFound())

    def current_version(self, locator: str) -> str:
        return "7"


@dataclass
class FencingStore(Store):
    """A store whose remote can fence an op key: what it was asked to fence, and the requests it was sent."""

    fenced: list[str] = field(default_factory=list)
    requests: list[Mapping[str, Any]] = field(default_factory=list)

    def fence(self, op_key: str) -> Outcome:
        self.fenced.append(op_key)
        return Fenced()

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        self.requests.append(request)
        return super().submit(op_key, request)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's sleeps, recorded instead of slept."""
    delays: list[float] = []
    monkeypatch.setattr(time, "sleep", delays.append)
    return delays


def client(fake: FakeReckon) -> Reckon:
    return Reckon("http://reckon.test", "rk_test", transport=httpx.MockTransport(fake.handle))


def test_a_run_registers_each_intent_before_the_call_and_reports_its_outcome(slept: list[float]) -> None:
    """Against a server whose outcome answers no next directive (an older one): directive, intent, outcome."""
    fake, store = FakeReckon(["a", "b"]), Store()
    result = client(fake).run(TASK, store)
    assert result.status == "done" and result.steps == 2
    assert store.sent == ["op-a", "op-b"]  # each exactly once
    writes = [(r.method, r.url.path.rsplit("/", 1)[-1]) for r in fake.seen if r.method != "GET"]
    assert writes == [("POST", "lease"), *[("POST", "operations"), ("POST", "outcome")] * 2, ("DELETE", "lease")]
    for write in fake.calls("POST", "operations") + fake.calls("POST", "outcome"):
        assert write.headers["Reckon-Lease"] == "77" and write.headers["If-Match"].strip('"').isdigit()
        assert write.headers["Idempotency-Key"] and write.headers["Authorization"] == "Bearer rk_test"
    # The outcome is conditional on the version the intent answered (its ETag), not the directive's.
    assert fake.calls("POST", "outcome")[0].headers["If-Match"] == '"4"'
    assert json.loads(fake.calls("POST", "outcome")[0].content) == {
        "result": "committed",
        "remote_id": "r-op-a",
        "count": 1,
        "start_next": True,
    }
    assert fake.released


def test_a_node_in_steady_state_is_one_request_the_outcome_whose_answer_started_the_next(slept: list[float]) -> None:
    fake, store = FakeReckon(["a", "b", "c"], answers_next=True), Store()
    result = client(fake).run(TASK, store)
    assert result.done and result.steps == 3 and store.sent == ["op-a", "op-b", "op-c"]
    calls = [(r.method, r.url.path.removeprefix(f"/api/v1/tasks/{TASK}")) for r in fake.seen]
    assert calls == [
        ("POST", "/lease"),  # the grant's answer carries the first node, already started: no directive, no intent
        *[("POST", f"/operations/op-{key}/outcome") for key in "abc"],
        ("DELETE", "/lease"),
    ]
    assert json.loads(fake.calls("POST", "/lease")[0].content)["start_next"] is True
    # Each outcome is conditional on the version the previous answer left (its ETag): the start 4, then two per node.
    assert [r.headers["If-Match"] for r in fake.calls("POST", "/outcome")] == ['"4"', '"6"', '"8"']


def test_a_server_that_answers_no_first_directive_is_asked_for_it(slept: list[float]) -> None:
    """A grant without ``next`` (a server before start_next, or a task that moved before it could answer): the run
    reads the directive and registers the first intent itself."""
    fake, store = FakeReckon(["a", "b"]), Store()
    assert client(fake).run(TASK, store).done and store.sent == ["op-a", "op-b"]
    first = [(r.method, r.url.path.removeprefix(f"/api/v1/tasks/{TASK}")) for r in fake.seen][:3]
    assert first == [("POST", "/lease"), ("GET", "/directive"), ("POST", "/operations")]


def test_a_started_node_is_not_sent_once_a_stop_is_said_and_is_looked_up_instead(slept: list[float]) -> None:
    """The renewer's answer raises the stop flag while the outcome that started b is on its way back: b is not
    sent; the directive then reconciles it (looked up: not found, never sent) before the run stops."""
    from reckon_client import protocol

    fake, store = FakeReckon(["a", "b"], answers_next=True), Store()
    state = LeaseState(task_id=TASK, lease_id="77", epoch=2, ttl_seconds=300, renewal_seq=0)
    handle = fake.handle

    def handler(request: httpx.Request) -> httpx.Response:
        response = handle(request)
        if request.url.path.endswith("/op-a/outcome"):
            fake.lease["takeover_requested"] = True
            state.heard({"takeover_requested": True})  # as the renewer thread does with a renewal's answer
        return response

    reckon = Reckon("http://reckon.test", "rk_test", transport=httpx.MockTransport(handler))
    result = reckon._drive(protocol.steps(state, max_wait=60, compensate=False), store)
    assert (result.status, result.reason) == ("stopped", "takeover_requested")
    assert store.sent == ["op-a"] and fake.open_op == ""
    assert [r.url.path.rsplit("/", 2)[-2] for r in fake.calls("POST", "/outcome")] == ["op-a", "op-b"]
    assert json.loads(fake.calls("POST", "/outcome")[1].content)["result"] == "not_found"


def test_a_restarted_run_reconciles_the_operation_in_flight_before_sending_anything(slept: list[float]) -> None:
    """SIGKILLed after the intent: the next run's first directive is the lookup; a committed answer is recorded and
    the node is never sent again."""
    fake = FakeReckon(["a", "b"], open_op="op-a")
    store = Store(lookups={"op-a": Committed(remote_id="r-op-a", count=1)})
    assert client(fake).run(TASK, store).done
    assert store.sent == ["op-b"]
    writes = [r.url.path.removeprefix(f"/api/v1/tasks/{TASK}") for r in fake.seen if r.method == "POST"]
    assert writes[:3] == ["/lease", "/operations/op-a/outcome", "/operations"]  # the lookup's answer, then b


def test_after_a_cancel_the_operation_in_flight_is_fenced_not_looked_up(slept: list[float]) -> None:
    """The directive says fence (a cancel is recorded): a connector that can is asked to fence the op key, and its
    final answer is reported as ``fenced``; one that cannot is asked to look it up (the server waits for the
    request's deadline before a not found closes it)."""
    fake, store = FakeReckon(["a"], open_op="op-a", fence=True), FencingStore(lookups={"op-a": NotFound()})
    fake.lease = {"cancel_requested": True}
    result = client(fake).run(TASK, store)
    assert (result.status, result.reason) == ("stopped", "cancel_requested")
    assert store.fenced == ["op-a"] and store.sent == []
    [report] = fake.calls("POST", "/outcome")
    assert json.loads(report.content) == {"result": "fenced", "start_next": True}

    fake, plain = FakeReckon(["a"], open_op="op-a", fence=True), Store()
    fake.lease = {"cancel_requested": True}
    client(fake).run(TASK, plain)
    [report] = fake.calls("POST", "/outcome")
    assert json.loads(report.content) == {"result": "not_found", "start_next": True}

    fake, store = FakeReckon(["a"], open_op="op-a"), FencingStore(lookups={"op-a": Committed(remote_id="r-op-a")})
    assert client(fake).run(TASK, store).done
    assert store.fenced == []  # no cancel: looked up, never fenced


def test_the_connector_is_given_the_requests_deadline(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"], not_after="2030-01-01T00:00:30+00:00"), FencingStore()
    assert client(fake).run(TASK, store).done
    assert store.requests == [{"action": "a", "input": {"n": "a"}, "not_after": "2030-01-01T00:00:30+00:00"}]
    fake, store = FakeReckon(["a"]), FencingStore()
    assert client(fake).run(TASK, store).done
    assert store.requests == [{"action": "a", "input": {"n": "a"}}]  # none given, none invented


def test_a_lookup_that_cannot_reach_the_remote_ends_the_run_to_try_later(slept: list[float]) -> None:
    fake = FakeReckon(["a"], open_op="op-a")
    store = Store(lookups={"op-a": Failed("connection_interrupted", "reset")})
    result = client(fake).run(TASK, store)
    assert result.status == "waiting" and result.reason == "remote_unreachable" and result.until is not None
    assert fake.calls("POST", "outcome") == [] and store.sent == [] and fake.released


def test_429_and_503_are_waited_out_and_the_same_request_sent_again(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"]), Store()
    limited = problem(429, "rate_limited")
    limited.headers["Retry-After"] = "3"
    fake.faults[("GET", "/directive")] = [limited]
    fake.faults[("POST", "/operations")] = [problem(503, "unavailable")]
    assert client(fake).run(TASK, store).done
    assert 3 <= slept[0] <= 3 * 1.25 and len(slept) == 2
    assert store.sent == ["op-a"]  # the retried intent did not send twice
    first, second = fake.calls("POST", "operations")
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert first.content == second.content


def test_a_lost_connection_is_retried_and_the_retry_carries_the_same_key(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"]), Store()
    fake.faults[("POST", "/outcome")] = [httpx.ReadTimeout("no answer")]
    assert client(fake).run(TASK, store).done
    assert store.sent == ["op-a"] and len(slept) == 1


def test_retry_delays_are_bounded_and_jittered() -> None:
    assert 0.25 <= retry_delay(0) <= 0.25 * 1.25
    assert MAX_DELAY <= retry_delay(30) <= MAX_DELAY * 1.25
    assert MAX_DELAY <= retry_delay(0, "86400") <= MAX_DELAY * 1.25
    assert 0.5 <= retry_delay(1, "a date, not seconds") <= 0.5 * 1.25


def test_a_412_rereads_the_directive_and_never_retries_the_write_blindly(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"]), Store()
    fake.faults[("POST", "/operations")] = [problem(412, "version_conflict", current_version=9)]
    assert client(fake).run(TASK, store).done
    assert len(fake.calls("GET", "/directive")) == 3  # read, 412, read again, …, done
    assert store.sent == ["op-a"] and slept == []


def test_a_cancel_said_by_the_lease_starts_no_side_effect(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"], lease={"cancel_requested": True}), Store()
    result = client(fake).run(TASK, store)
    assert result.status == "stopped" and result.reason == "cancel_requested"
    assert fake.calls("POST", "operations") == [] and store.sent == [] and fake.released


def test_a_takeover_said_by_a_renewal_stops_before_the_next_side_effect(slept: list[float]) -> None:
    """The renewer thread's answer raises the stop flag while the intent is being recorded: the call is not made."""
    fake, store = FakeReckon(["a", "b"]), Store()
    told = threading.Event()
    handle = fake.handle

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/lease/renew") and fake.lease.get("takeover_requested"):
            response = handle(request)
            told.set()
            return response
        if request.url.path.endswith("/operations"):
            fake.lease.update(takeover_requested=True, ttl_seconds=0.3)  # the renewer ticks every 0.1 s
            assert told.wait(10), "the renewer never renewed"
        return handle(request)

    fake.lease["ttl_seconds"] = 0.3
    result = Reckon("http://reckon.test", "rk_test", transport=httpx.MockTransport(handler)).run(TASK, store)
    assert result.status == "stopped" and result.reason == "takeover_requested"
    # Registered, never sent: settled by a lookup before the run stops, so the person finds nothing in flight.
    assert store.sent == [] and fake.open_op == ""
    assert [r.url.path.rsplit("/", 2)[-2] for r in fake.calls("POST", "/outcome")] == ["op-a"]
    assert fake.released


def test_a_connector_that_raises_still_gives_the_lease_back(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"]), Store(fail_with=RuntimeError("bug in the connector"))
    with pytest.raises(RuntimeError, match="bug in the connector"):
        client(fake).run(TASK, store)
    assert fake.released and fake.open_op == "op-a"


def test_a_lease_held_by_another_is_reported_and_waited_for_only_when_asked(slept: list[float]) -> None:
    fake, store = FakeReckon(["a"]), Store()
    fake.faults[("POST", "/lease")] = [problem(409, "lease_held")]
    result = client(fake).run(TASK, store)
    assert result.status == "stopped" and result.reason == "lease_held" and result.detail == "lease_held"
    assert fake.calls("GET", "/directive") == [] and not fake.released
    fake.faults[("POST", "/lease")] = [problem(409, "lease_held"), problem(423, "lease_reserved")]
    assert client(fake).run(TASK, store, lease_wait=10).done
    assert slept == [1.0, 1.0]


def test_refusals_are_api_errors_with_the_problem() -> None:
    fake = FakeReckon(["a"])
    fake.faults[("POST", "/tasks")] = [problem(422, "plan_invalid", errors=[{"field": "nodes"}])]
    with pytest.raises(ApiError) as refused:
        client(fake).create_task("k", "t", {"nodes": []})
    assert refused.value.status == 422 and refused.value.code == "plan_invalid"
    assert refused.value.problem["errors"] == [{"field": "nodes"}]
    assert fake.seen[0].headers["Idempotency-Key"]  # a create is always keyed


@pytest.mark.parametrize(
    ("outcome", "body"),
    [
        (Committed("r", "7", 3, "sha256:x", {"temp": ["t"]}), {"result": "committed", "remote_id": "r"}),
        (Accepted("r"), {"result": "accepted", "remote_id": "r"}),
        (Failed("conflict", "409"), {"result": "failed", "failure_class": "conflict", "detail": "409"}),
        (NotFound(), {"result": "not_found"}),
        (Fenced(), {"result": "fenced"}),
        (Unprovable(), {"result": "unprovable"}),
    ],
)
def test_outcomes_are_the_contracts_shapes(outcome: Outcome, body: dict[str, Any]) -> None:
    assert outcome_json(outcome).items() >= body.items()
    if isinstance(outcome, Committed):
        assert outcome_json(outcome) == body | {
            "remote_version": "7",
            "count": 3,
            "digest": "sha256:x",
            "data": {"temp": ["t"]},
        }


def test_the_url_may_name_the_server_or_the_api() -> None:
    assert api_base("http://h:8000/") == api_base("http://h:8000/api/v1") == "http://h:8000/api/v1"


# --- the async driver: the same protocol ---------------------------------------------------------------------------


@dataclass
class AsyncStore:
    inner: Store

    async def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        return self.inner.submit(op_key, request)

    async def lookup(self, op_key: str) -> Outcome:
        return self.inner.lookup(op_key)

    async def current_version(self, locator: str) -> str:
        return self.inner.current_version(locator)


def arun(fake: FakeReckon, store: Store, **kwargs: Any) -> Any:
    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        return fake.handle(request)

    async def main() -> Any:
        async with AsyncReckon("http://reckon.test", "rk_test", transport=httpx.MockTransport(handler)) as reckon:
            return await reckon.run(TASK, AsyncStore(store), **kwargs)

    return asyncio.run(main())


def test_the_async_client_reconciles_first_and_sends_each_node_once() -> None:
    fake = FakeReckon(["a", "b", "c"], open_op="op-a")
    store = Store(lookups={"op-a": Committed(remote_id="r-op-a")})
    result = arun(fake, store)
    assert result.done and store.sent == ["op-b", "op-c"] and fake.released


def test_the_async_client_also_sends_each_started_node_once_without_its_intent() -> None:
    fake, store = FakeReckon(["a", "b", "c"], answers_next=True), Store()
    assert arun(fake, store).done and store.sent == ["op-a", "op-b", "op-c"]
    # The first node started by the grant's answer, every other by the previous outcome's: no intent, no directive.
    assert len(fake.calls("POST", "/operations")) == 0 and len(fake.calls("GET", "/directive")) == 0


def test_the_async_client_stops_on_cancel_and_releases() -> None:
    fake, store = FakeReckon(["a"], lease={"cancel_requested": True}), Store()
    result = arun(fake, store)
    assert result.reason == "cancel_requested" and store.sent == [] and fake.released


def test_a_connector_of_one_function_per_action(slept: list[float]) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    actions = Actions(lookup=lambda op_key: NotFound(), current_version=lambda locator: "7")

    @actions.action("a")
    def send_a(op_key: str, input: dict[str, Any]) -> Outcome:
        sent.append((op_key, input))
        return Committed(remote_id=op_key)

    assert client(FakeReckon(["x", "y"])).run(TASK, actions).done
    assert sent == [("op-x", {"n": "x"}), ("op-y", {"n": "y"})]
    unknown = actions.submit("k", {"action": "b", "input": {}})
    assert isinstance(unknown, Failed) and unknown.failure_class == "invalid_params"


@pytest.mark.parametrize(
    "refusal",
    [
        problem(409, "renewal_out_of_order", renewal_seq=5),  # the seq as a problem member
        httpx.Response(409, json={"code": "renewal_out_of_order", "detail": "renewal carried 0, the lease is at 5"}),
    ],
)
def test_a_renewal_whose_answer_was_lost_resumes_from_the_servers_seq(refusal: httpx.Response) -> None:
    fake = FakeReckon(["a"])
    fake.faults[("POST", "/lease/renew")] = [refusal]
    state = LeaseState(task_id=TASK, lease_id="77", epoch=2, ttl_seconds=30, renewal_seq=0)
    reckon = client(fake)
    reckon._drive(renew(state))
    assert state.renewal_seq == 5 and not state.lost and not state.stop_reason
    reckon._drive(renew(state))
    assert state.renewal_seq == 6 and json.loads(fake.seen[-1].content) == {"renewal_seq": 5}
    assert fake.seen[-1].headers["Idempotency-Key"] == "rk-client:renew:77:5"


def test_the_async_client_takes_a_sync_connector_too() -> None:
    fake, store = FakeReckon(["a"]), Store()

    async def main() -> Any:
        async def handler(request: httpx.Request) -> httpx.Response:
            await request.aread()
            return fake.handle(request)

        async with AsyncReckon("http://reckon.test", "rk_test", transport=httpx.MockTransport(handler)) as reckon:
            return await reckon.run(TASK, store)

    assert asyncio.run(main()).done and store.sent == ["op-a"]


def test_a_short_wait_is_slept_through_and_a_long_one_handed_back(slept: list[float]) -> None:
    """Backoff: a wait within max_wait is slept (the renewer keeps the lease); a longer one ends the run with its
    ``until``, the lease given back."""
    soon, later = (datetime.now(UTC) + timedelta(seconds=s) for s in (5, 600))

    def wait(until: datetime) -> httpx.Response:
        d = {"kind": "wait", "task_version": 3, "node_key": "a", "op_key": "", "reason": "dependency_unavailable"}
        return httpx.Response(200, json=d | {"until": until.isoformat()})

    fake, store = FakeReckon(["a"]), Store()
    fake.faults[("GET", "/directive")] = [wait(soon), wait(later)]
    result = client(fake).run(TASK, store, max_wait=60)
    assert len(slept) == 1 and 4 < slept[0] <= 5
    assert (result.status, result.reason, result.until) == ("waiting", "dependency_unavailable", later)
    assert store.sent == [] and fake.released


def test_the_async_renewer_raises_the_stop_flag_before_the_call() -> None:
    """As the sync test above, with the renewer an asyncio task: the intent is recorded, the renewal answers a
    takeover, the call is not made."""
    fake, store = FakeReckon(["a"], lease={"ttl_seconds": 0.3}), Store()

    async def main() -> Any:
        told = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            await request.aread()
            response = fake.handle(request)
            if request.url.path.endswith("/lease/renew") and fake.lease.get("takeover_requested"):
                told.set()
            if request.url.path.endswith("/operations"):
                fake.lease["takeover_requested"] = True
                await asyncio.wait_for(told.wait(), 10)
            return response

        async with AsyncReckon("http://reckon.test", "rk_test", transport=httpx.MockTransport(handler)) as reckon:
            return await reckon.run(TASK, AsyncStore(store))

    result = asyncio.run(main())
    assert (result.status, result.reason) == ("stopped", "takeover_requested")
    assert store.sent == [] and fake.released


# --- cleanup work -------------------------------------------------------------------------------------------------


def _drive_cleanup(ask: str, connector: Any, *, deletes: bool = True) -> tuple[Any, list[Any]]:
    """protocol.steps against scripted answers: one cleanup directive, then done. Returns the result and every
    effect the client asked for (calls to Reckon, calls to the connector)."""
    from reckon_client import protocol

    state = LeaseState(task_id=TASK, lease_id="9", epoch=1, ttl_seconds=30, renewal_seq=0)
    work = {"temp_id": 4, "locator": "tgt/tmp/batch-1", "node": "a", "op_key": "rk-x-cleanup-4-0", "ask": ask}
    directives = [
        {"kind": "cleanup", "task_version": 7, "reason": "completed", "cleanup": work, "op_key": work["op_key"]},
        {"kind": "done", "task_version": 8},
    ]
    effects: list[Any] = []
    gen = protocol.steps(state, max_wait=1, compensate=False, deletes=deletes)
    reply: Any = None
    try:
        while True:
            effect = gen.send(reply)
            effects.append(effect)
            if isinstance(effect, protocol.Remote):
                reply = getattr(connector, effect.name)(*effect.args)
            elif isinstance(effect, protocol.Call) and effect.path.endswith("/directive"):
                reply = protocol.Reply(200, {"etag": '"7"'}, directives.pop(0))
            else:
                reply = protocol.Reply(200, {"etag": '"8"'}, {"task": {"version": 8}, "temp_resource": {}})
    except StopIteration as stop:
        return stop.value, effects


class _Deleter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def delete(self, op_key: str, locator: str) -> Outcome:
        self.calls.append(("delete", op_key, locator))
        return Committed(remote_id=locator, count=1)

    def lookup(self, op_key: str) -> Outcome:
        self.calls.append(("lookup", op_key))
        return NotFound()


def test_cleanup_work_deletes_exactly_the_locator_under_the_op_key_and_reports_the_receipt() -> None:
    from reckon_client import protocol

    store = _Deleter()
    result, effects = _drive_cleanup("delete", store)
    assert result.done and store.calls == [("delete", "rk-x-cleanup-4-0", "tgt/tmp/batch-1")]
    posted = [e for e in effects if isinstance(e, protocol.Call) and e.method == "POST"]
    assert [e.path for e in posted] == [f"/tasks/{TASK}/temp-resources/4/cleanup"]
    assert posted[0].body == {
        "result": "committed",
        "remote_id": "tgt/tmp/batch-1",
        "count": 1,
        "op_key": "rk-x-cleanup-4-0",
    }
    assert posted[0].headers["If-Match"] == '"7"' and posted[0].headers["Reckon-Lease"] == "9"


def test_a_delete_that_may_have_been_sent_is_looked_up_never_sent_again() -> None:
    store = _Deleter()
    result, effects = _drive_cleanup("lookup", store)
    assert result.done and store.calls == [("lookup", "rk-x-cleanup-4-0")]
    assert [e.body for e in effects if getattr(e, "method", "") == "POST"] == [
        {"result": "not_found", "op_key": "rk-x-cleanup-4-0"}
    ]


def test_a_connector_without_delete_ends_the_run_at_the_cleanup_and_sends_nothing() -> None:
    result, effects = _drive_cleanup("delete", _Deleter(), deletes=False)
    assert (result.status, result.reason) == ("done", "cleanup_unsupported")
    assert not [e for e in effects if getattr(e, "method", "") == "POST" or getattr(e, "name", "")]
