"""Every refusal an operation of the agent API declares for its services is provoked here, through the services'
own rules, and answered by name: each route names the codes its services may refuse it with
(``openapi_extra=documented(…, refuses=…)``, the ``REFUSES`` key api.api's document builder reads), and the
served document declares each under its status (api.errors.declared_problems). tests/test_api_statuses.py provokes
what an operation's inputs imply; these tests hold the rest — 403, 409 lease_held, 410, 423, 429 backoff_active,
503 retention_key_* … — to the truth from both sides:

- each declared ``(operationId, code)`` is provoked with real state made by the services (a task, its lease, a
  person's takeover, a cancel, an approval, a retained object, a subscription), then one request with a real
  token: it answers ``STATUS_OF[code]`` with that code, and writes nothing (every Reckon row, and every retained
  file, as before);
- a declared pair that is neither provoked here nor named elsewhere (with the test that provokes it) fails the
  suite, so a new declaration comes with its provocation, and a declared code no request can provoke cannot stay
  declared;
- a provocation whose pair its route does not declare fails too: a code answered is a code declared."""

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from ninja import NinjaAPI
from pytest_django.fixtures import Settings

from api.api import api
from api.errors import CONTENT_TYPE, STATUS_OF
from api.http import REFUSES
from api.models import ApiToken
from api.tokens import api_token_issue
from audit.principals import Principal
from hooks.services import webhook_subscribe
from leases.clock import ControllableClock
from leases.models import Lease
from leases.services import lease_acquire, lease_release
from retention.models import RetainedObject
from retention.services import object_path, retain
from tasks.core.lifecycle import FailureClass
from tasks.core.outcomes import Committed, Failed, NotFound, Outcome
from tasks.engine.cleanup import cleanup_record, cleanup_work
from tasks.engine.plans import plan_accept, plan_propose, task_create
from tasks.engine.protocol import next_directive
from tasks.engine.verification import task_quarantine
from tasks.models import Node, Operation, PlanRevision, Task, TempResource
from tasks.people.cancel import task_request_cancel
from tasks.people.takeover import NodeResult, takeover_claim, takeover_release, takeover_submit
from tests.conftest import EFFECT, chain_plan, copy_node, effect_node, person, snapshot
from tests.steps import record, send, version
from tests.test_approval_binding import approval, approve, gated_plan

pytestmark = pytest.mark.django_db

AGENT, COLLEAGUE, KIND = "agent-refusals", "agent-colleague", "copy"
KEY = base64.b64encode(bytes(range(32))).decode()
OTHER_KEY = base64.b64encode(bytes(range(1, 33))).decode()
TEMP = "tgt/tmp/batch-1"


# --- what the routes declare --------------------------------------------------------------------------------------


@cache
def declared_refusals() -> dict[str, tuple[str, ...]]:
    """operationId → the codes its route says its services refuse it with: the ``REFUSES`` key of each operation
    in the document ninja builds, which ReckonAPI.get_openapi_schema takes out to declare them (api/api.py)."""
    built: dict[str, Any] = NinjaAPI.get_openapi_schema(api)
    return {
        operation["operationId"]: tuple(operation.get(REFUSES, ()))
        for item in built["paths"].values()
        for operation in item.values()
    }


@cache
def routes() -> dict[str, tuple[str, str]]:
    """operationId → (method, path) of the served document."""
    served: dict[str, Any] = json.loads(json.dumps(api.get_openapi_schema()))
    return {
        operation["operationId"]: (method, path)
        for path, item in served["paths"].items()
        for method, operation in item.items()
    }


# --- the world a provocation is made in ---------------------------------------------------------------------------


@dataclass
class World:
    """The test's client, clock and settings, the admin who issues tokens and takes tasks over, and the tokens
    issued (by agent). A provocation makes its state through the services, then sends one request with ``send``."""

    client: Client
    clock: ControllableClock
    settings: Settings
    data: Path
    admin: Principal
    tokens: dict[str, str] = field(default_factory=dict)
    routes: dict[str, tuple[str, str]] = field(default_factory=routes)

    def token(self, agent: str = AGENT, kinds: tuple[str, ...] = (KIND,)) -> str:
        if agent not in self.tokens:
            self.tokens[agent] = api_token_issue(actor=self.admin, agent_id=agent, kinds=kinds, projects=())[1]
        return self.tokens[agent]

    def task(self, plan: dict[str, Any] | None = None, **fields: Any) -> Task:
        return task_create(
            kind=KIND, title="a task", plan=plan or chain_plan("a", "b"), created_by=f"agent:{AGENT}", **fields
        )

    def lease(self, task: Task, holder: str = AGENT, ttl: timedelta | None = None) -> Lease:
        return lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=holder, ttl=ttl)

    def send(
        self,
        operation: str,
        body: Any = None,
        *,
        lease: Lease | None = None,
        at: Task | None = None,
        agent: str = AGENT,
        query: str = "",
        **path: Any,
    ) -> Any:
        """One request to ``operation`` with ``agent``'s token: ``lease`` as Reckon-Lease, ``at``'s current version
        as If-Match, the path's parameters by name."""
        method, url = self.routes[operation]
        for name, value in path.items():
            url = url.replace("{" + name + "}", str(value))
        assert "{" not in url, f"{operation}: a path parameter is missing in {url}"
        headers = {"Authorization": f"Bearer {self.token(agent)}"}
        if lease is not None:
            headers["Reckon-Lease"] = str(lease.pk)
        if at is not None:
            headers["If-Match"] = f'"{version(at)}"'
        data = json.dumps(body) if body is not None else None
        return getattr(self.client, method)(url + query, data=data, content_type="application/json", headers=headers)

    def prime(self) -> None:
        """Each token's last-use hint written now (at most once a minute, whatever the answer): out of the state a
        refusal is compared on."""
        for agent in self.tokens:
            assert self.send("api_tasks_task_list", agent=agent).status_code == 200

    def state(self) -> dict[str, Any]:
        """Every Reckon row, and every file under the data folder (retained objects)."""
        files = {str(p.relative_to(self.data)): p.read_bytes() for p in sorted(self.data.rglob("*")) if p.is_file()}
        return {"rows": snapshot(), "files": files}


@pytest.fixture
def world(client: Client, clock: ControllableClock, settings: Settings, tmp_path: Path) -> World:
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    settings.RECKON_RETENTION_KEY = KEY
    settings.RECKON_API_RATE = 0
    made = World(client, clock, settings, settings.DATA_DIR, person("root", "admin"))
    made.token()
    return made


type Request = Callable[[], Any]
type Provoker = Callable[[World], Request]


# --- the state each refusal needs, made by the services -----------------------------------------------------------


def ran(task: Task, lease: Lease, key: str, outcome: Outcome | None = None) -> Operation:
    """``key`` sent and its outcome recorded (by default a receipt)."""
    return record(send(task, lease, key), outcome or Committed(remote_id=f"r-{key}"), lease)


# How the lease a request names stops being the task's live lease: given back (lease_lost), or past its expiry and
# grace while still the task's latest (lease_expired).
type Loss = Callable[[World, Lease], None]
SHORT = timedelta(seconds=5)


def given_back(w: World, lease: Lease) -> None:
    lease_release(lease=lease)


def let_lapse(w: World, lease: Lease) -> None:
    w.clock.advance(timedelta(hours=1))


def lost(loss: Loss) -> Callable[[World, Task], Lease]:
    """The agent's lease on a task, then lost by ``loss``."""

    def lease_of(w: World, task: Task) -> Lease:
        lease = w.lease(task, ttl=SHORT)
        loss(w, lease)
        return lease

    return lease_of


def live(w: World, task: Task) -> Lease:
    return w.lease(task)


def completed_with_temp(w: World, ttl: timedelta | None = None) -> tuple[Task, Lease]:
    """A task whose one node's receipt named a temp resource: completed, the temp resource due for deletion."""
    task = w.task(chain_plan("a"))
    lease = w.lease(task, ttl=ttl)
    ran(task, lease, "a", Committed(remote_id="r-a", data={"temp": [TEMP]}))
    return task, lease


def deleting(w: World, ttl: timedelta | None = None) -> tuple[Task, Lease, TempResource, str]:
    """A completed task's temp resource whose delete is registered and marked sent (the directive ``cleanup``)."""
    task, lease = completed_with_temp(w, ttl)
    work = cleanup_work(task_id=task.pk, lease=lease)
    assert work is not None and work.ask == "delete"
    return task, lease, work.temp, work.op_key


def quarantined(task: Task) -> None:
    task_quarantine(task_id=task.pk, expected_version=version(task), reason="the log and the rows disagree")


def operator_holds(w: World, task: Task) -> Lease:
    """A person (an admin, who may operate every task) took ``task`` over while nobody held it."""
    claim = takeover_claim(actor=w.admin, task_id=task.pk)
    assert claim.granted and claim.lease is not None
    return claim.lease


def handed_back(w: World, task: Task, results: list[NodeResult] | None = None) -> None:
    """A person took ``task`` over and handed it back to the agent (``resume_agent``)."""
    held = operator_holds(w, task)
    takeover_submit(
        actor=w.admin, lease=held, based_on_version=version(task), decision="resume_agent", results=results or []
    )


def proposed(task: Task, lease: Lease, plan: dict[str, Any]) -> PlanRevision:
    return plan_propose(
        task_id=task.pk, plan=plan, proposed_by=f"agent:{AGENT}", expected_version=version(task), lease=lease
    )


def at_the_gate(w: World, plan: dict[str, Any] | None = None, first: tuple[str, ...] = ("a",)) -> Task:
    """The agent ran ``first`` and stopped at the approval (recording what it asks), then gave its lease back."""
    task = w.task(plan or gated_plan())
    lease = w.lease(task)
    for key in first:
        ran(task, lease, key, Committed(remote_id="target-7"))
    assert next_directive(task_id=task.pk, lease=lease).reason == "awaiting_approval"
    lease_release(lease=lease)
    return task


def bad_plan() -> dict[str, Any]:
    return {"nodes": [{"key": "a", "action": "no.such.action", "evidence": {"remote_id": True}}]}


def retained_ref(task: Task) -> dict[str, int]:
    ref = retain(task_id=task.pk, kind="sensitive_input", name="context", content=b"private", ttl=timedelta(minutes=1))
    return {"retained_id": ref.id, "version": ref.version}


# --- the provocations ---------------------------------------------------------------------------------------------
# Each makes its state through the services, then returns the one request that is refused.

TASK_NEW, TASK_LIST, TASK_CANCEL = "api_tasks_task_new", "api_tasks_task_list", "api_tasks_task_cancel"
RECEIPT_READ = "api_tasks_node_receipt_read"
PLAN_NEW, PLAN_TAKE = "api_tasks_plan_new", "api_tasks_plan_take"
LEASE_TAKE, LEASE_RENEW, LEASE_GIVE_BACK = "api_steps_lease_take", "api_steps_lease_extend", "api_steps_lease_give_back"
DIRECTIVE, START, OUTCOME = "api_steps_directive_read", "api_steps_operation_register", "api_steps_outcome_report"
CLEANUP, INPUTS = "api_steps_cleanup_report", "api_steps_inputs_report"
RETAIN, FETCH = "api_retained_retained_new", "api_retained_retained_read"
SUBSCRIBE, UNSUBSCRIBE = "hooks_api_webhook_create", "hooks_api_webhook_delete"


def _create_out_of_scope(w: World) -> Request:
    return lambda: w.send(TASK_NEW, {"kind": "elsewhere", "title": "t", "plan": chain_plan("a")})


def _create_invalid(w: World) -> Request:
    return lambda: w.send(TASK_NEW, {"kind": KIND, "title": "t", "plan": bad_plan()})


def _list_bad_cursor(w: World) -> Request:
    w.task()
    return lambda: w.send(TASK_LIST, query="?after=not-a-cursor")


def _cancel_by_a_colleague(w: World) -> Request:
    task = w.task()
    w.token(COLLEAGUE)  # same scope, another agent: neither the creator nor the holder
    return lambda: w.send(TASK_CANCEL, {"reason": "not mine"}, agent=COLLEAGUE, task_id=task.pk)


def _cancel_under(lease_of: Callable[[World, Task], Lease]) -> Provoker:
    def provoke(w: World) -> Request:
        task = w.task()
        lease = lease_of(w, task)
        return lambda: w.send(TASK_CANCEL, {"reason": "stop it"}, lease=lease, task_id=task.pk)

    return provoke


def _propose(body: Callable[[], dict[str, Any]], lease_of: Callable[[World, Task], Lease]) -> Provoker:
    def provoke(w: World) -> Request:
        task = w.task()
        lease = lease_of(w, task)
        return lambda: w.send(PLAN_NEW, {"plan": body()}, lease=lease, at=task, task_id=task.pk)

    return provoke


def _propose_on_a_completed_task(w: World) -> Request:
    task = w.task(chain_plan("a"))
    lease = w.lease(task)
    ran(task, lease, "a")
    return lambda: w.send(PLAN_NEW, {"plan": chain_plan("a", "b")}, lease=lease, at=task, task_id=task.pk)


def _accept_under(lease_of: Callable[[World, Task], Lease]) -> Provoker:
    def provoke(w: World) -> Request:
        task = w.task()
        held = w.lease(task)
        revision = proposed(task, held, chain_plan("a", "b", "c"))
        lease_release(lease=held)
        lease = lease_of(w, task)
        return lambda: w.send(PLAN_TAKE, lease=lease, at=task, task_id=task.pk, revision=revision.number)

    return provoke


def _accept_the_accepted(w: World) -> Request:
    task = w.task()
    lease = w.lease(task)
    return lambda: w.send(PLAN_TAKE, lease=lease, at=task, task_id=task.pk, revision=1)


def _accept_while_an_operation_is_open(w: World) -> Request:
    task = w.task()
    lease = w.lease(task)
    send(task, lease, "a")
    revision = proposed(task, lease, chain_plan("a", "b", "c"))
    return lambda: w.send(PLAN_TAKE, lease=lease, at=task, task_id=task.pk, revision=revision.number)


def _accept_a_superseded_proposal(w: World) -> Request:
    task = w.task()
    lease = w.lease(task)
    first = proposed(task, lease, chain_plan("a", "b", "c"))
    proposed(task, lease, chain_plan("a", "b", "d"))
    return lambda: w.send(PLAN_TAKE, lease=lease, at=task, task_id=task.pk, revision=first.number)


def _accept_on_a_running_task(w: World) -> Request:
    task = w.task()
    lease = w.lease(task)
    ran(task, lease, "a")
    revision = proposed(task, lease, chain_plan("a", "b", "c"))
    return lambda: w.send(PLAN_TAKE, lease=lease, at=task, task_id=task.pk, revision=revision.number)


def _acquire_held(w: World) -> Request:
    task = w.task()
    w.lease(task, holder=COLLEAGUE)
    return lambda: w.send(LEASE_TAKE, {}, task_id=task.pk)


def _acquire_quarantined(w: World) -> Request:
    task = w.task()
    quarantined(task)
    return lambda: w.send(LEASE_TAKE, {}, task_id=task.pk)


def _acquire_reserved(w: World) -> Request:
    task = w.task()
    theirs = w.lease(task, holder=COLLEAGUE)
    assert not takeover_claim(actor=w.admin, task_id=task.pk).granted  # reserved: waits for the holder
    lease_release(lease=theirs)
    return lambda: w.send(LEASE_TAKE, {}, task_id=task.pk)


def _acquire_while_a_person_holds(w: World) -> Request:
    task = w.task()
    operator_holds(w, task)
    return lambda: w.send(LEASE_TAKE, {}, task_id=task.pk)


def _acquire_after_a_person_let_go(w: World) -> Request:
    task = w.task()
    takeover_release(actor=w.admin, lease=operator_holds(w, task), reason="back later")  # human, nobody holds it
    return lambda: w.send(LEASE_TAKE, {}, task_id=task.pk)


def _renew(lease_of: Callable[[World, Task], Lease], seq: int = 0) -> Provoker:
    def provoke(w: World) -> Request:
        task = w.task()
        lease = lease_of(w, task)
        return lambda: w.send(LEASE_RENEW, {"renewal_seq": seq}, lease=lease, task_id=task.pk)

    return provoke


def _release_twice(w: World) -> Request:
    task = w.task()
    lease = lost(given_back)(w, task)
    return lambda: w.send(LEASE_GIVE_BACK, lease=lease, task_id=task.pk)


def _directive_cleanup_under(loss: Loss) -> Provoker:
    """An ended task's directive registers the delete of its temp resource under the lease: refused for it."""

    def provoke(w: World) -> Request:
        task, lease = completed_with_temp(w, ttl=SHORT)
        loss(w, lease)
        return lambda: w.send(DIRECTIVE, lease=lease, task_id=task.pk)

    return provoke


def _directive_on_a_deleted_temp_marked_due_again(w: World) -> Request:
    # A row that disagrees with its own delete: the temp resource is active again while its delete committed (only
    # a row changed by hand is so; a receipt marks it deleted in the same commit).
    task, lease, temp, op_key = deleting(w)
    cleanup_record(
        task_id=task.pk,
        temp_id=temp.pk,
        op_key=op_key,
        outcome=Committed(remote_id=TEMP, count=1),
        lease=lease,
        expected_version=version(task),
    )
    TempResource.objects.filter(pk=temp.pk).update(status="active")
    return lambda: w.send(DIRECTIVE, lease=lease, task_id=task.pk)


def _directive_on_a_temp_locator_changed(w: World) -> Request:
    # The temp resource's row names another locator than the receipt in the log: nothing is deleted.
    task, lease = completed_with_temp(w)
    TempResource.objects.filter(task=task).update(locator="tgt/prod/everything")
    return lambda: w.send(DIRECTIVE, lease=lease, task_id=task.pk)


def _start(setup: Callable[[World], tuple[Task, Lease]], node: str = "a") -> Provoker:
    def provoke(w: World) -> Request:
        task, lease = setup(w)
        return lambda: w.send(START, {"node_key": node}, lease=lease, at=task, task_id=task.pk)

    return provoke


def _fresh(lease_of: Callable[[World, Task], Lease]) -> Callable[[World], tuple[Task, Lease]]:
    def setup(w: World) -> tuple[Task, Lease]:
        task = w.task()
        return task, lease_of(w, task)

    return setup


def _paused(w: World) -> tuple[Task, Lease]:
    task = w.task()
    lease = w.lease(task)
    ran(task, lease, "a", Failed(FailureClass.CONFLICT, "the remote holds another version"))
    return task, lease


def _intent_whose_target_changed(w: World) -> tuple[Task, Lease]:
    # An intent to send again whose stored target is not the one the log registered (a row changed by hand).
    task = w.task()
    lease = w.lease(task)
    ran(task, lease, "a", NotFound())
    Operation.objects.filter(task=task).update(target="tgt/prod/everything")
    return task, lease


def _intent_whose_request_changed(w: World) -> tuple[Task, Lease]:
    # An intent whose stored request no longer matches its own digest (a row changed by hand).
    task = w.task()
    lease = w.lease(task)
    ran(task, lease, "a", NotFound())
    Operation.objects.filter(task=task).update(request={"action": EFFECT, "input": {"target": "tgt/prod"}})
    return task, lease


def _b_first(w: World) -> tuple[Task, Lease]:
    task = w.task()
    return task, w.lease(task)


def _a_in_flight(w: World) -> tuple[Task, Lease]:
    task = w.task()
    lease = w.lease(task)
    send(task, lease, "a")
    return task, lease


def _cancelled(w: World) -> tuple[Task, Lease]:
    task = w.task()
    lease = w.lease(task)
    task_request_cancel(actor=Principal.agent(AGENT), task_id=task.pk, reason="withdrawn")
    return task, lease


def _takeover_asked(w: World) -> tuple[Task, Lease]:
    task = w.task()
    lease = w.lease(task)
    assert not takeover_claim(actor=w.admin, task_id=task.pk).granted
    return task, lease


def _handed_back_with_refs(w: World) -> tuple[Task, Lease]:
    task = w.task({"nodes": [copy_node()]})
    handed_back(w, task)
    return task, w.lease(task)


def _budget_spent(w: World) -> tuple[Task, Lease]:
    """One attempt in the task's budget, spent on a; the task re-planned (pending again) with b still to run."""
    task = w.task(attempt_budget=1)
    lease = w.lease(task)
    ran(task, lease, "a")
    revision = proposed(task, lease, chain_plan("a", "b"))
    plan_accept(revision_id=revision.pk, expected_version=version(task), lease=lease)
    return task, lease


def _backing_off(w: World) -> tuple[Task, Lease]:
    task = w.task()
    lease = w.lease(task)
    ran(task, lease, "a", Failed(FailureClass.DEPENDENCY_UNAVAILABLE, "HTTP 503"))
    return task, lease


def _approval_typed_by_a_person(w: World) -> tuple[Task, Lease]:
    """ok succeeded on a person's typed result (a takeover), which binds no call."""
    task = w.task({"nodes": [approval("ok"), effect_node("b", depends_on=["ok"])]})
    handed_back(w, task, [NodeResult(node_key="ok", remote_id="typed-by-a-person")])
    return task, w.lease(task)


def _request_unknown_at_approval(w: World) -> tuple[Task, Lease]:
    """ok approved x's request; y reads x's output, unknown then: ok does not cover y's request."""
    plan = {
        "nodes": [
            approval("ok"),
            effect_node("x", depends_on=["ok"]),
            effect_node("y", depends_on=["ok", "x"], input={"source": {"from": "x", "field": "remote_id"}}),
        ]
    }
    task = at_the_gate(w, plan, first=())
    approve(task, w.admin, w.admin)
    lease = w.lease(task)
    ran(task, lease, "x")
    return task, lease


def _approved_then_replanned(w: World) -> tuple[Task, Lease]:
    task = at_the_gate(w)
    approve(task, w.admin, w.admin)
    lease = w.lease(task)
    plan = gated_plan()
    plan["nodes"].append(effect_node("c", depends_on=["b"]))
    plan_accept(revision_id=proposed(task, lease, plan).pk, expected_version=version(task), lease=lease)
    return task, lease


def _approval_expired(w: World) -> tuple[Task, Lease]:
    task = at_the_gate(w)
    approve(task, w.admin, w.admin, ttl=timedelta(minutes=10))
    expires_at = Node.objects.get(task=task, key="ok").approval_expires_at
    assert expires_at is not None
    w.clock.set(expires_at)
    return task, w.lease(task)


def _report(setup: Callable[[World], tuple[Task, Lease, str]], body: dict[str, Any] | None = None) -> Provoker:
    def provoke(w: World) -> Request:
        task, lease, op_key = setup(w)
        outcome = body or {"result": "committed", "remote_id": "r-a"}
        return lambda: w.send(OUTCOME, outcome, lease=lease, at=task, task_id=task.pk, op_key=op_key)

    return provoke


def _in_flight_under(loss: Loss) -> Callable[[World], tuple[Task, Lease, str]]:
    def setup(w: World) -> tuple[Task, Lease, str]:
        task = w.task()
        lease = w.lease(task, ttl=SHORT)
        op = send(task, lease, "a")
        loss(w, lease)
        return task, lease, op.op_key

    return setup


def _another_tasks_op(w: World) -> tuple[Task, Lease, str]:
    """An op key in flight, but of another task (of the same agent): never settled through this one."""
    task = w.task()
    _other, _lease, op_key = _in_flight(w)
    return task, w.lease(task), op_key


def _settled(w: World) -> tuple[Task, Lease, str]:
    task = w.task()
    lease = w.lease(task)
    return task, lease, ran(task, lease, "a").op_key


def _in_flight_on_a_quarantined_task(w: World) -> tuple[Task, Lease, str]:
    task = w.task()
    lease = w.lease(task)
    op = send(task, lease, "a")
    quarantined(task)
    return task, lease, op.op_key


def _in_flight(w: World) -> tuple[Task, Lease, str]:
    task = w.task()
    lease = w.lease(task)
    return task, lease, send(task, lease, "a").op_key


def _cleanup(setup: Callable[[World], tuple[Task, Lease, int, str]]) -> Provoker:
    def provoke(w: World) -> Request:
        task, lease, temp_id, op_key = setup(w)
        body = {"op_key": op_key, "result": "committed", "remote_id": TEMP, "count": 1}
        return lambda: w.send(CLEANUP, body, lease=lease, at=task, task_id=task.pk, temp_id=temp_id)

    return provoke


def _another_tasks_temp(w: World) -> tuple[Task, Lease, int, str]:
    """Another task's temp resource (its delete in flight), reported through this task: not one of it."""
    task, lease, _temp, _op_key = deleting(w)
    _other, _lease, theirs, their_key = deleting(w)
    return task, lease, theirs.pk, their_key


def _deleting_under(loss: Loss) -> Callable[[World], tuple[Task, Lease, int, str]]:
    def setup(w: World) -> tuple[Task, Lease, int, str]:
        task, lease, temp, op_key = deleting(w, SHORT)
        loss(w, lease)
        return task, lease, temp.pk, op_key

    return setup


def _another_op_key(w: World) -> tuple[Task, Lease, int, str]:
    task, lease, temp, _op_key = deleting(w)
    return task, lease, temp.pk, "rk-made-up"


def _deleting_on_a_quarantined_task(w: World) -> tuple[Task, Lease, int, str]:
    task, lease, temp, op_key = deleting(w)
    quarantined(task)
    return task, lease, temp.pk, op_key


def _inputs(setup: Callable[[World], tuple[Task, Lease]], versions: dict[str, str] | None = None) -> Provoker:
    def provoke(w: World) -> Request:
        task, lease = setup(w)
        body = {"current_versions": versions or {}}
        return lambda: w.send(INPUTS, body, lease=lease, at=task, task_id=task.pk)

    return provoke


def _completed(w: World) -> tuple[Task, Lease]:
    task = w.task(chain_plan("a"))
    lease = w.lease(task)
    ran(task, lease, "a")
    return task, lease


def _with_refs(w: World) -> tuple[Task, Lease]:
    task = w.task({"nodes": [copy_node()]})
    return task, w.lease(task)


def _retain(body: dict[str, Any], **settings: Any) -> Provoker:
    def provoke(w: World) -> Request:
        task = w.task()
        for name, value in settings.items():
            setattr(w.settings, name, value)
        return lambda: w.send(RETAIN, {"kind": "sensitive_input", "name": "context", **body}, task_id=task.pk)

    return provoke


def _receipt_of_a_node_of_another_tasks_plan(w: World) -> Request:
    """The node ran, with its receipt, in another task of the same agent; this task's plan has no such key."""
    other = w.task(chain_plan("elsewhere"))
    ran(other, w.lease(other), "elsewhere")
    task = w.task()
    return lambda: w.send(RECEIPT_READ, task_id=task.pk, node_key="elsewhere")


def _receipt_of_a_node_in_flight(w: World) -> Request:
    """Sent, no answer recorded yet: the node has no receipt."""
    task = w.task()
    send(task, w.lease(task), "a")
    return lambda: w.send(RECEIPT_READ, task_id=task.pk, node_key="a")


def _fetch(change: Callable[[World, Task, dict[str, int]], dict[str, int]]) -> Provoker:
    def provoke(w: World) -> Request:
        task = w.task()
        ref = change(w, task, retained_ref(task))
        return lambda: w.send(FETCH, task_id=task.pk, retained_id=ref["retained_id"], version=ref["version"])

    return provoke


def _another_tasks_ref(w: World, task: Task, ref: dict[str, int]) -> dict[str, int]:
    """A live object of another task in the token's scope, read through this task."""
    return retained_ref(w.task())


def _expired_ref(w: World, task: Task, ref: dict[str, int]) -> dict[str, int]:
    w.clock.advance(timedelta(minutes=1))
    return ref


def _corrupt_ref(w: World, task: Task, ref: dict[str, int]) -> dict[str, int]:
    row = RetainedObject.objects.get(pk=ref["retained_id"])
    path = object_path(task.uid, row.uid, row.version)
    sealed = bytearray(path.read_bytes())
    sealed[-1] ^= 1  # one bit of the tag: it no longer authenticates
    path.write_bytes(bytes(sealed))
    return ref


def _keyed(**settings: Any) -> Callable[[World, Task, dict[str, int]], dict[str, int]]:
    def change(w: World, task: Task, ref: dict[str, int]) -> dict[str, int]:
        for name, value in settings.items():
            setattr(w.settings, name, value)
        return ref

    return change


def _subscribe(body: dict[str, Any]) -> Provoker:
    def provoke(w: World) -> Request:
        return lambda: w.send(SUBSCRIBE, {"url": "https://agent.example/hooks", "events": ["task_finished"], **body})

    return provoke


def _subscribe_past_the_limit(w: World) -> Request:
    w.settings.RECKON_WEBHOOK_MAX_SUBSCRIPTIONS = 1
    webhook_subscribe(ApiToken.objects.get(agent_id=AGENT), "https://agent.example/first", ["task_finished"])
    return _subscribe({})(w)


def _unsubscribe_a_colleagues(w: World) -> Request:
    w.token(COLLEAGUE)
    theirs, _secret = webhook_subscribe(
        ApiToken.objects.get(agent_id=COLLEAGUE), "https://agent.example/theirs", ["task_finished"]
    )
    return lambda: w.send(UNSUBSCRIBE, subscription_id=theirs.pk)


PRODUCTION_WITHOUT_KEY = {"RECKON_RETENTION_KEY": "", "RECKON_ENV": "production"}

# (operationId, code) → the provocation that makes the operation answer that code (several, where the code is
# reached by distinct paths).
PROVOKED: dict[tuple[str, str], Provoker | tuple[Provoker, ...]] = {
    (TASK_NEW, "permission_denied"): _create_out_of_scope,
    (TASK_NEW, "plan_invalid"): _create_invalid,
    (TASK_LIST, "invalid_cursor"): _list_bad_cursor,
    (TASK_CANCEL, "permission_denied"): _cancel_by_a_colleague,
    (TASK_CANCEL, "lease_lost"): _cancel_under(lost(given_back)),
    (TASK_CANCEL, "lease_expired"): _cancel_under(lost(let_lapse)),
    (PLAN_NEW, "plan_invalid"): _propose(bad_plan, live),
    (PLAN_NEW, "lease_lost"): _propose(lambda: chain_plan("a", "b", "c"), lost(given_back)),
    (PLAN_NEW, "lease_expired"): _propose(lambda: chain_plan("a", "b", "c"), lost(let_lapse)),
    (PLAN_TAKE, "lease_lost"): _accept_under(lost(given_back)),
    (PLAN_TAKE, "lease_expired"): _accept_under(lost(let_lapse)),
    (PLAN_TAKE, "invalid_transition"): _accept_the_accepted,
    (PLAN_TAKE, "operations_open"): _accept_while_an_operation_is_open,
    (PLAN_TAKE, "proposal_superseded"): _accept_a_superseded_proposal,
    (LEASE_TAKE, "lease_held"): _acquire_held,
    (LEASE_TAKE, "lease_refused"): _acquire_quarantined,
    (LEASE_TAKE, "lease_reserved"): _acquire_reserved,
    (LEASE_TAKE, "takeover_held"): (_acquire_while_a_person_holds, _acquire_after_a_person_let_go),
    (LEASE_GIVE_BACK, "lease_lost"): _release_twice,
    (LEASE_RENEW, "lease_lost"): _renew(lost(given_back)),
    (LEASE_RENEW, "lease_expired"): _renew(lost(let_lapse)),
    (LEASE_RENEW, "renewal_out_of_order"): _renew(live, seq=5),
    (DIRECTIVE, "lease_lost"): _directive_cleanup_under(given_back),
    (DIRECTIVE, "lease_expired"): _directive_cleanup_under(let_lapse),
    (DIRECTIVE, "invalid_transition"): _directive_on_a_deleted_temp_marked_due_again,
    (START, "lease_lost"): _start(_fresh(lost(given_back))),
    (START, "lease_expired"): _start(_fresh(lost(let_lapse))),
    (START, "task_not_runnable"): _start(_paused, "b"),
    (START, "stored_fact_altered"): _start(_intent_whose_target_changed),
    (START, "node_not_ready"): _start(_b_first, "b"),
    (START, "operations_open"): _start(_a_in_flight),
    (START, "cancel_requested"): _start(_cancelled),
    (START, "takeover_requested"): _start(_takeover_asked),
    (START, "inputs_recheck_required"): _start(_handed_back_with_refs, "copy"),
    (START, "budget_exhausted"): _start(_budget_spent, "b"),
    (START, "backoff_active"): _start(_backing_off),
    (START, "approval_missing"): _start(_approval_typed_by_a_person, "b"),
    (START, "approval_request_changed"): _start(_request_unknown_at_approval, "y"),
    (START, "approval_plan_moved"): _start(_approved_then_replanned, "b"),
    (START, "approval_expired"): _start(_approval_expired, "b"),
    (OUTCOME, "operation_not_found"): _report(_another_tasks_op),
    (OUTCOME, "lease_lost"): _report(_in_flight_under(given_back)),
    (OUTCOME, "lease_expired"): _report(_in_flight_under(let_lapse)),
    (OUTCOME, "invalid_transition"): _report(_settled),
    (OUTCOME, "task_not_runnable"): _report(_in_flight_on_a_quarantined_task),
    (OUTCOME, "evidence_insufficient"): _report(
        _in_flight, {"result": "committed", "remote_id": "r-a", "data": {"temp": "not a list of locators"}}
    ),
    (CLEANUP, "temp_resource_not_found"): _cleanup(_another_tasks_temp),
    (CLEANUP, "lease_lost"): _cleanup(_deleting_under(given_back)),
    (CLEANUP, "lease_expired"): _cleanup(_deleting_under(let_lapse)),
    (CLEANUP, "invalid_transition"): _cleanup(_another_op_key),
    (CLEANUP, "task_not_runnable"): _cleanup(_deleting_on_a_quarantined_task),
    (INPUTS, "lease_lost"): _inputs(_fresh(lost(given_back))),
    (INPUTS, "lease_expired"): _inputs(_fresh(lost(let_lapse))),
    (INPUTS, "task_not_runnable"): _inputs(_completed),
    (RETAIN, "retention_refused"): _retain({"kind": "debug_artifact", "content": "aGVsbG8="}),
    (RETAIN, "secret_in_payload"): _retain(
        {"kind": "debug_artifact", "content": {"headers": {"Authorization": "Bearer ghp_" + "a" * 36}}}
    ),
    (RETAIN, "retention_key_invalid"): _retain({"content": "aGVsbG8="}, RECKON_RETENTION_KEY="not-a-key"),
    (RETAIN, "retention_key_missing"): _retain({"content": "aGVsbG8="}, **PRODUCTION_WITHOUT_KEY),
    (FETCH, "retention_not_found"): _fetch(_another_tasks_ref),
    (RECEIPT_READ, "node_not_found"): _receipt_of_a_node_of_another_tasks_plan,
    (RECEIPT_READ, "receipt_not_found"): _receipt_of_a_node_in_flight,
    (FETCH, "retention_expired"): _fetch(_expired_ref),
    (FETCH, "retention_corrupt"): _fetch(_corrupt_ref),
    (FETCH, "retention_key_mismatch"): _fetch(_keyed(RECKON_RETENTION_KEY=OTHER_KEY)),
    (FETCH, "retention_key_invalid"): _fetch(_keyed(RECKON_RETENTION_KEY="not-a-key")),
    (FETCH, "retention_key_missing"): _fetch(_keyed(**PRODUCTION_WITHOUT_KEY)),
    (SUBSCRIBE, "webhook_url_invalid"): _subscribe({"url": "https://user:password@agent.example/hooks"}),
    (SUBSCRIBE, "webhook_events_invalid"): _subscribe({"events": ["no_such_event"]}),
    (SUBSCRIBE, "webhook_limit_reached"): _subscribe_past_the_limit,
    (UNSUBSCRIBE, "webhook_not_found"): _unsubscribe_a_colleagues,
    # A proposal in a status the permit table does not allow it in (completed), an accept while the task runs.
    (PLAN_NEW, "task_not_runnable"): _propose_on_a_completed_task,
    (PLAN_TAKE, "task_not_runnable"): _accept_on_a_running_task,
    # The cleanup's delete is not registered for a temp resource whose row names another locator than the log.
    (DIRECTIVE, "stored_fact_altered"): _directive_on_a_temp_locator_changed,
    # An intent sent again whose stored request no longer matches its digest.
    (START, "evidence_insufficient"): _start(_intent_whose_request_changed),
    # A confirmation that leaves out an input ref's version.
    (INPUTS, "inputs_recheck_required"): _inputs(_with_refs),
}

CREDENTIAL = "password=hunter2hunter2"


def _secret_title(w: World) -> Request:
    return lambda: w.send(TASK_NEW, {"kind": KIND, "title": CREDENTIAL, "plan": chain_plan("a")})


def _secret_cancel_reason(w: World) -> Request:
    task = w.task()
    return lambda: w.send(TASK_CANCEL, {"reason": CREDENTIAL}, task_id=task.pk)


def _secret_cleanup_detail(w: World) -> Request:
    task, lease, temp, op_key = deleting(w)
    body = {"op_key": op_key, "result": "failed", "failure_class": "conflict", "detail": CREDENTIAL}
    return lambda: w.send(CLEANUP, body, lease=lease, at=task, task_id=task.pk, temp_id=temp.pk)


def _secret_cleanup_receipt_data(w: World) -> Request:
    # The delete's receipt holding a credential in its data: refused as a node's receipt is (tasks.decide.receipts).
    task, lease, temp, op_key = deleting(w)
    body = {"op_key": op_key, "result": "committed", "remote_id": "r-del", "data": {"password": "hunter2hunter2"}}
    return lambda: w.send(CLEANUP, body, lease=lease, at=task, task_id=task.pk, temp_id=temp.pk)


# Refusals whose provocations need the credential above: the same table, continued.
PROVOKED |= {
    (TASK_NEW, "secret_in_payload"): _secret_title,
    (TASK_CANCEL, "secret_in_payload"): _secret_cancel_reason,
    (OUTCOME, "secret_in_payload"): _report(
        _in_flight, {"result": "committed", "remote_id": "r-a", "data": {"password": "hunter2hunter2"}}
    ),
    (CLEANUP, "secret_in_payload"): (_secret_cleanup_detail, _secret_cleanup_receipt_data),
    (INPUTS, "secret_in_payload"): _inputs(_with_refs, {"copy.source": CREDENTIAL}),
}

# Declared pairs provoked in another file, as (file under tests/, test function): only what cannot reasonably be
# provoked here (none today: every declared pair is provoked above). Each name is checked to
# be a test function of that file.
PROVOKED_ELSEWHERE: dict[tuple[str, str], tuple[str, str]] = {}


# --- the tests ----------------------------------------------------------------------------------------------------


class NotAnswered(AssertionError):
    """The provocation was not answered with the code it is for."""


def _answered(response: Any, code: str) -> dict[str, Any]:
    """The problem ``response`` is, if it is ``code`` with its status; NotAnswered otherwise."""
    body = response.json() if response.get("Content-Type") in (CONTENT_TYPE, "application/json") else {}
    if response.status_code != STATUS_OF[code] or body.get("code") != code:
        raise NotAnswered(f"expected {STATUS_OF[code]} {code}, answered {response.status_code} {body or response}")
    assert response["Content-Type"] == CONTENT_TYPE and body["type"].endswith("/" + code), body
    return dict(body)


def _ways(pair: tuple[str, str]) -> tuple[Provoker, ...]:
    found = PROVOKED[pair]
    return found if isinstance(found, tuple) else (found,)


def _id(pair: tuple[str, str], way: int = 0) -> str:
    return ":".join(pair) + (f"#{way + 1}" if way else "")


@pytest.mark.parametrize(
    ("operation", "code", "way"),
    [pytest.param(*pair, way, id=_id(pair, way)) for pair in sorted(PROVOKED) for way in range(len(_ways(pair)))],
)
def test_each_declared_refusal_is_answered_by_name_and_writes_nothing(
    world: World, operation: str, code: str, way: int
) -> None:
    """The state the provocation makes through the services is refused by the one request with exactly the
    declared code and its status, and nothing is written: every row and every retained file as before."""
    request = _ways((operation, code))[way](world)
    world.prime()
    before = world.state()
    _answered(request(), code)
    assert world.state() == before, f"{operation} refused with {code} and wrote"


def test_every_declared_refusal_is_provoked_here_or_named_where_it_is() -> None:
    """A declaration without a provocation fails: each declared pair is in PROVOKED or PROVOKED_ELSEWHERE (naming a
    test function that exists in that file), in one of them only, and neither names a pair no route declares (a code
    a route stops declaring leaves its provocation behind: the route answers it undeclared, or never)."""
    declared = {(operation, code) for operation, codes in declared_refusals().items() for code in codes}
    tables = {
        "PROVOKED": set(PROVOKED),
        "PROVOKED_ELSEWHERE": set(PROVOKED_ELSEWHERE),
    }
    covered = set().union(*tables.values())
    assert sorted(declared - covered) == [], "declared and provoked nowhere: add a provocation to PROVOKED"
    for name, pairs in tables.items():
        assert sorted(pairs - declared) == [], f"{name} names pairs no route declares"
    assert sum(len(pairs) for pairs in tables.values()) == len(covered), "a pair is in two tables"
    tests = Path(__file__).resolve().parent
    for (operation, code), (file, function) in PROVOKED_ELSEWHERE.items():
        text = (tests / file).read_text() if (tests / file).is_file() else ""
        assert re.search(rf"^def {re.escape(function)}\(", text, re.M), f"{operation} {code}: no {file}::{function}"


def test_the_served_document_declares_each_refusal_under_its_status() -> None:
    """What the routes declare is what the served document says: each code in the description of its status."""
    served: dict[str, Any] = json.loads(json.dumps(api.get_openapi_schema()))
    by_id = {op["operationId"]: op for item in served["paths"].values() for op in item.values()}
    for operation, codes in declared_refusals().items():
        for code in codes:
            description = by_id[operation]["responses"][str(STATUS_OF[code])]["description"]
            assert f"`{code}`" in description, (operation, code, description)
