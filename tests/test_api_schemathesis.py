"""Schemathesis against the live agent API (pytest-django's live server: real HTTP, its own database connections),
over whatever operations the OpenAPI document holds when the test runs, with every one of schemathesis' built-in
checks that applies to this API. Every response must:

- not be a server error (5xx) — not_a_server_error;
- conform to the document: its status one the operation declares, its content type, headers and body those
  declared — status_code_conformance, content_type_conformance, response_headers_conformance,
  response_schema_conformance;
- refuse (4xx) a request the document says is invalid — negative_data_rejection (beyond the steering below);
- take a request the document says is valid, unless the state refuses it (POSITIVE_REFUSALS: a lease another agent
  holds, a stale If-Match, a task out of scope, a person's takeover) — positive_data_acceptance (beyond two rules of
  text no JSON Schema of a free-form object can state: NUL and something credential-like);
- answer a method the path does not take with 405 and ``Allow`` (unsupported_method; allow_header_conformance on
  OPTIONS), a request without a required header with 428 (missing_required_header; 401 without Authorization),
  and a request without or with a forged token with 401 where it answered 2xx with the token (ignored_auth);
- not serve what was freed (use_after_free, and freed_stays_freed for what this API reads by no path under the
  freed one: a released lease, named by a header, carries nothing but a directive to stop; a deleted webhook
  subscription is not listed) and serve what was just created (ensure_resource_availability, except after an
  Idempotency-Key replay);
- if the request was rejected (status >= 400), leave the database exactly as it was: every row of every table
  (tasks, events, operations, leases, plan revisions, webhook subscriptions and deliveries, idempotency records,
  audit rows, …) is unchanged across the call. The one column exempt is a token's ``last_used_at``, a hint the
  authentication refreshes at most once a minute whatever the answer.

Not run: object_level_authorization, which needs schemathesis' multi-identity authentication (a WFC auth document
with peers) to replay one token's reads with another's; tests/test_api_scope.py does that for every route with an
out-of-scope token, exactly. max_response_time: no bound is part of the contract.

Each operation gets the coverage phase's probes of methods and missing headers (only those: _probes), then positive
(schema-valid) and negative (schema-invalid) requests; then a stateful run follows links (list → task → lease →
renew / directive → intent → outcome → release → directive / renew, create → …, subscribe → delete → list) so
requests also land on live leases and current versions. The agent's token is in scope of a few tasks made by the
services; inputs are steered toward them (task ids that exist, in and out of scope; the lease ids this agent and
another hold; cursors the list handed out; a valid plan, kind and webhook URL — negative requests send anything
else). Only request schemas are steered; responses are checked against the document as served. Bounded (about a
minute on 2 CPUs); PostgreSQL only (.ci/run's PostgreSQL pass)."""

import contextlib
import copy
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given
from requests.structures import CaseInsensitiveDict
from schemathesis import Case, GenerationMode
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.config import PositiveDataAcceptanceConfig
from schemathesis.config._checks import MissingRequiredHeaderConfig
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.core.parameters import ParameterLocation
from schemathesis.core.transport import Response
from schemathesis.generation.meta import CoveragePhaseData, CoverageScenario
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ensure_resource_availability,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
    use_after_free,
)

from api.api import api
from api.http import LEASE_HEADER
from api.models import ApiToken
from api.tokens import api_token_issue
from leases.services import lease_acquire
from tasks.engine.plans import task_create
from tasks.models import Task
from tasks.reads.queries import cursor_of
from tests.conftest import chain_plan, person

ApiCase = Case[Any]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="runs in the PostgreSQL pass"),
]

# Per operation, positive and negative; the stateful runs along the links. RECKON_API_FUZZ_SCALE (default 1) scales
# both: .ci/run takes half, RECKON_API_FUZZ_SCALE=4 runs deeper.
_SCALE = float(os.environ.get("RECKON_API_FUZZ_SCALE", "1"))
EXAMPLES_PER_MODE = max(1, round(12 * _SCALE))
STATEFUL_SCENARIOS = max(1, round(30 * _SCALE))
STATEFUL_STEPS = 10
AGENT = "agent-fuzz"
KIND = "copy"
# Columns a rejected request may write: the token's last-use hint (api/tokens.py, at most once a minute).
MAY_CHANGE = {("api_apitoken", "last_used_at")}
# Django's own bookkeeping, which no API request touches either way.
NOT_STATE = {"django_migrations", "django_session"}
# How the state may refuse a schema-valid request (positive_data_acceptance): 401 / 403 the token (a kind outside
# its scope), 404 a task out of the token's scope or an object that does not exist (ids are drawn), 409 another
# holder's lease or a rule of the step, 412 an If-Match that is not the task's version (every version is
# schema-valid, one is current), 423 a person holds the task, 429 a node backing off. Never 400, 413 or 422: a
# schema-valid request is well formed (except for the hygiene of free-form text: positive_data_accepted_beyond_hygiene).
POSITIVE_REFUSALS = ["2xx", "401", "403", "404", "409", "412", "423", "429"]
# A request without a header its operation requires (missing_required_header): 428, "send the header the detail
# names" (If-Match, Reckon-Lease). Without Authorization: 401 (schemathesis' own rule).
MISSING_HEADER_REFUSALS = ["428"]


# --- the database's state ---------------------------------------------------------------------------------------


def _state_query() -> str:
    """One statement: for every table, its row count and an md5 of all its rows (in a stable order)."""
    parts = []
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            if table in NOT_STATE:
                continue
            columns = [
                c.name
                for c in connection.introspection.get_table_description(cursor, table)
                if (table, c.name) not in MAY_CHANGE
            ]
            row = "ROW(" + ", ".join(f"t.{connection.ops.quote_name(c)}" for c in columns) + ")::text"
            # Names from the database's own catalogue, quoted: nothing here comes from a request.
            aggregate = f"md5(coalesce(string_agg({row}, ',' ORDER BY {row}), ''))"
            parts.append(f"SELECT '{table}', count(*), {aggregate} FROM {connection.ops.quote_name(table)} t")  # noqa: S608
    return " UNION ALL ".join(parts)


@dataclass
class StateGuard:
    """Reads the database's state before each call, and checks it after a rejected one."""

    query: str
    before: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)

    def read(self) -> dict[str, tuple[int, str]]:
        with connection.cursor() as cursor:
            cursor.execute(self.query)
            return {name: (n, digest) for name, n, digest in cursor.fetchall()}

    def remember(self, case: ApiCase) -> None:
        self.before[case.id] = self.read()

    def check(self, ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
        """A rejected request changes nothing (docs/api.md: "A refused request changes nothing")."""
        before = self.before.pop(case.id, None)
        if response.status_code < 400 or before is None:
            return None
        after = self.read()
        changed = sorted(name for name in after.keys() | before.keys() if after.get(name) != before.get(name))
        if changed:
            raise AssertionError(
                f"A rejected request ({response.status_code}) changed the database: {', '.join(changed)} "
                f"(rows before/after: {[(n, before.get(n, (0,))[0], after.get(n, (0,))[0]) for n in changed]})"
            )
        return True


Check = Callable[[CheckContext, Response, ApiCase], bool | None]


def negative_data_rejected_beyond_the_steering(ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
    """schemathesis' negative_data_rejection, except where every violation drawn is of an ``enum`` this test added to
    steer the inputs (steered()): those enums are hints toward the world's rows, not the API's contract — a task id
    outside them may be a task the run itself created, a webhook URL outside them a valid URL — so accepting such a
    value is no failure. Every other violation (types, patterns, required fields, lengths) is still checked."""
    try:
        return negative_data_rejection(ctx, response, case)
    except AcceptedNegativeData as failure:
        said = str(failure.message) if hasattr(failure, "message") else str(failure)
        violations = said.count("violates `")
        if violations and violations == said.count("violates `enum`"):
            return None
        raise


# The whole of a plan_invalid whose only problem is the stated budget past the policy (tasks/core/budget.py).
BUDGET_PAST_POLICY = re.compile(
    r"plan is invalid: attempt_budget \d+ is over this deployment's policy for a plan of \d+ nodes: at most \d+ "
    r"\(RECKON_MAX_TASK_ATTEMPTS_PER_NODE = \d+ per node\); state less, or leave it out for the default"
)


def positive_data_accepted_beyond_hygiene(ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
    """schemathesis' positive_data_acceptance, except for the two refusals of what a text holds, which no JSON
    Schema of a free-form object (a receipt's ``data``, a debug artifact's fields) can state: NUL (U+0000) anywhere
    (422 validation_error: no column can store it) and something credential-like (422 secret_in_payload), both in
    docs/api.md; and for an Idempotency-Key an earlier request of the run used with another body (422
    idempotency_key_reused: the key's history, not the request, refuses it); and a stated attempt budget past the
    deployment's policy for the plan's size and nothing else (422 plan_invalid, tasks/core/budget.py: at most
    RECKON_MAX_TASK_ATTEMPTS_PER_NODE per node — no JSON Schema relates a number to an array's length; the document
    says it in words). Every other refusal of a schema-valid request is a failure, unless it is one of the refusals
    of state configured in ``POSITIVE_REFUSALS``."""
    if response.status_code == 422:
        sent = response.request
        body = sent.body if isinstance(sent.body, bytes) else str(sent.body or "").encode()
        if b"\\u0000" in body or b"\x00" in body or "%00" in (sent.url or ""):
            return None
        if _problem_code(response) in ("secret_in_payload", "idempotency_key_reused"):
            return None
        if _problem_code(response) == "plan_invalid" and BUDGET_PAST_POLICY.fullmatch(_problem_detail(response)):
            return None
    return positive_data_acceptance(ctx, response, case)


def _problem_code(response: Response) -> str:
    return _problem_field(response, "code")


def _problem_detail(response: Response) -> str:
    return _problem_field(response, "detail")


def _problem_field(response: Response, name: str) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get(name, "")) if isinstance(body, dict) else ""


def created_stays_available_unless_replayed(ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
    """schemathesis' ensure_resource_availability (what a POST just created is found by the link that follows it),
    except after a replayed creation (``Idempotent-Replayed: true``): a replay answers what the key's first request
    created, which may have been deleted since — that is what an Idempotency-Key means (docs/api.md)."""
    parent = ctx.internals.find_parent(case_id=case.id)
    created = ctx.internals.find_response(case_id=parent.id) if parent is not None else None
    if created is not None and created.headers.get("idempotent-replayed"):
        return None
    return ensure_resource_availability(ctx, response, case)


def no_state_change_on_a_rejected_request(guard: StateGuard) -> Check:
    def no_state_change_on_a_rejected_request(ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
        return guard.check(ctx, response, case)

    return no_state_change_on_a_rejected_request


# --- the world the agent sees -----------------------------------------------------------------------------------


@dataclass
class World:
    token: str
    in_scope: list[int]
    out_of_scope: int
    missing: int
    my_lease: int  # held by this token's agent
    their_lease: int  # held by another agent, on another task in scope
    cursors: list[str]  # of the task list: each one page() could have handed out

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def world(settings: Any, tmp_path: Any) -> World:
    settings.RECKON_API_RATE = 0  # thousands of requests a minute, all from one token
    settings.DATA_DIR = tmp_path  # retained objects' sealed files: the run's own folder
    admin = person("root", "admin")
    token = api_token_issue(actor=admin, agent_id=AGENT, kinds=(KIND,), projects=())[1]
    tasks = [
        task_create(kind=KIND, title=f"fuzzed task {n}", plan=chain_plan("a", "b", "c"), created_by=f"agent:{AGENT}")
        for n in range(4)
    ]
    hidden = task_create(kind="not-in-scope", title="hidden", plan=chain_plan("a"), created_by="agent:someone")
    mine = lease_acquire(task_id=tasks[0].pk, holder_kind="agent", holder_id=AGENT, ttl=timedelta(hours=1))
    theirs = lease_acquire(task_id=tasks[1].pk, holder_kind="agent", holder_id="agent-else", ttl=timedelta(hours=1))
    return World(
        token=token,
        in_scope=[t.pk for t in tasks],
        out_of_scope=hidden.pk,
        missing=hidden.pk + 1000,
        my_lease=mine.pk,
        their_lease=theirs.pk,
        cursors=[cursor_of(t.updated_at, t.pk) for t in tasks],
    )


# --- the document, steered toward the world, with links -----------------------------------------------------------

VALID_PLAN = chain_plan("x", "y")


WEBHOOK_URL = "https://agent.example.com/reckon-hooks"


def steered(document: dict[str, Any], world: World, *, leases_from_links: bool = False) -> dict[str, Any]:
    """The served document with request inputs steered toward the world, and links between operations. A task id
    is one of the world's (in scope, out of scope, missing), a lease one of the two held; a plan valid, a task's
    kind in or out of scope, a webhook's URL and events valid. Negative generation violates each of these schemas,
    so malformed and random values are sent as well. A stateful run takes its leases from the links (the ones it
    acquired) instead: a lease header narrowed to the world's two would override theirs."""
    doc = copy.deepcopy(document)
    task_ids = [*world.in_scope, world.out_of_scope, world.missing]
    leases = [str(world.my_lease), str(world.their_lease)]
    for operation in _operations(doc):
        for parameter in operation.get("parameters", []):
            name = parameter["name"].lower()
            if parameter["in"] == "path" and name == "task_id":
                parameter["schema"] = {"type": "integer", "enum": task_ids}
            elif parameter["in"] == "query" and name == "after":  # a cursor is one the list handed out
                parameter["schema"] = {"type": "string", "enum": world.cursors}
            elif parameter["in"] == "path" and name == "kind":  # a kind in the scope (its actions) and one outside
                parameter["schema"] = {"type": "string", "enum": [KIND, "not-in-scope"]}
            elif parameter["in"] == "header" and name == "reckon-lease":
                # A lease id is a number: a stateful run draws small ones (the ids of the leases it has made are
                # small too), and its links give the ones it acquired.
                narrow = {"type": "string", "pattern": "^[1-9][0-9]{0,2}$"} if leases_from_links else {"enum": leases}
                parameter["schema"] = {"type": "string", **narrow}
    for schema in doc.get("components", {}).get("schemas", {}).values():
        properties = schema.get("properties", {})
        if "plan" in properties:
            properties["plan"] = {"enum": [VALID_PLAN]}
            if "attempt_budget" in properties:  # the policy's for VALID_PLAN: most of 1 to 10,000 is over it (422)
                budget = {"type": "integer", "minimum": 1, "maximum": 20}
                properties["attempt_budget"] = {"anyOf": [budget, {"type": "null"}]}
        if "kind" in properties and "title" in properties:
            properties["kind"] = {"type": "string", "enum": [KIND, "not-in-scope"]}
        if "url" in properties and "events" in properties:
            properties["url"] = {"type": "string", "enum": [WEBHOOK_URL]}
    _link_all(doc)
    return doc


def _operations(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for item in doc["paths"].values():
        for method, operation in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield operation


TASK = "/api/v1/tasks/{task_id}"
# (source method, source path, status) → (target method, target path, parameters, request body): added when both
# operations exist, so the links follow the document as it grows.
LINKS: list[tuple[tuple[str, str, str], tuple[str, str], dict[str, str], Any]] = [
    (("get", "/api/v1/tasks", "200"), ("get", TASK), {"path.task_id": "$response.body#/items/0/id"}, None),
    (("get", "/api/v1/tasks", "200"), ("post", TASK + "/lease"), {"path.task_id": "$response.body#/items/0/id"}, None),
    (("post", "/api/v1/tasks", "201"), ("get", TASK), {"path.task_id": "$response.body#/id"}, None),
    (("post", "/api/v1/tasks", "201"), ("post", TASK + "/lease"), {"path.task_id": "$response.body#/id"}, None),
    (
        ("post", "/api/v1/tasks", "201"),
        ("post", TASK + "/cancel"),
        {"path.task_id": "$response.body#/id", "header.If-Match": "$response.header.ETag"},
        None,
    ),
    (("get", TASK, "200"), ("post", TASK + "/lease"), {"path.task_id": "$response.body#/id"}, None),
    (
        ("post", TASK + "/lease", "201"),
        ("post", TASK + "/lease/renew"),
        {"path.task_id": "$request.path.task_id", "header.Reckon-Lease": "{$response.body#/lease_id}"},
        {"renewal_seq": "$response.body#/renewal_seq"},
    ),
    (
        ("post", TASK + "/lease", "201"),
        ("get", TASK + "/directive"),
        {"path.task_id": "$request.path.task_id", "header.Reckon-Lease": "{$response.body#/lease_id}"},
        None,
    ),
    (
        ("post", TASK + "/lease", "201"),
        ("delete", TASK + "/lease"),
        {"path.task_id": "$request.path.task_id", "header.Reckon-Lease": "{$response.body#/lease_id}"},
        None,
    ),
    (
        ("post", TASK + "/lease", "201"),
        ("post", TASK + "/cancel"),
        {
            "path.task_id": "$request.path.task_id",
            "header.Reckon-Lease": "{$response.body#/lease_id}",
            "header.If-Match": "{$response.body#/task_version}",
        },
        None,
    ),
    (
        ("post", TASK + "/lease", "201"),
        ("post", TASK + "/plans"),
        {
            "path.task_id": "$request.path.task_id",
            "header.Reckon-Lease": "{$response.body#/lease_id}",
            "header.If-Match": "{$response.body#/task_version}",
        },
        None,
    ),
    (
        ("get", TASK + "/directive", "200"),
        ("post", TASK + "/operations"),
        {
            "path.task_id": "$request.path.task_id",
            "header.Reckon-Lease": "$request.header.Reckon-Lease",
            "header.If-Match": "{$response.body#/task_version}",
        },
        {"node_key": "$response.body#/node_key"},
    ),
    (
        ("post", TASK + "/operations", "201"),
        ("post", TASK + "/operations/{op_key}/outcome"),
        {
            "path.task_id": "$request.path.task_id",
            "path.op_key": "$response.body#/op_key",
            "header.Reckon-Lease": "$request.header.Reckon-Lease",
            "header.If-Match": "$response.header.ETag",
        },
        None,
    ),
    (
        ("post", TASK + "/operations", "201"),
        ("get", TASK + "/directive"),
        {"path.task_id": "$request.path.task_id", "header.Reckon-Lease": "$request.header.Reckon-Lease"},
        None,
    ),
    (
        ("post", TASK + "/plans", "201"),
        ("post", TASK + "/plans/{revision}/accept"),
        {
            "path.task_id": "$request.path.task_id",
            "path.revision": "$response.body#/revision",
            "header.Reckon-Lease": "$request.header.Reckon-Lease",
            "header.If-Match": "{$response.body#/task_version}",
        },
        None,
    ),
    (
        ("post", TASK + "/retained", "201"),
        ("get", TASK + "/retained/{retained_id}/versions/{version}"),
        {
            "path.task_id": "$request.path.task_id",
            "path.retained_id": "$response.body#/retained",
            "path.version": "$response.body#/version",
        },
        None,
    ),
    (
        ("post", "/api/v1/webhooks", "201"),
        ("delete", "/api/v1/webhooks/{subscription_id}"),
        {"path.subscription_id": "$response.body#/id"},
        None,
    ),
    # What was freed, used again (freed_stays_freed).
    (
        ("delete", TASK + "/lease", "204"),
        ("get", TASK + "/directive"),
        {"path.task_id": "$request.path.task_id", "header.Reckon-Lease": "$request.header.Reckon-Lease"},
        None,
    ),
    (
        ("delete", TASK + "/lease", "204"),
        ("post", TASK + "/lease/renew"),
        {"path.task_id": "$request.path.task_id", "header.Reckon-Lease": "$request.header.Reckon-Lease"},
        None,
    ),
    (("delete", "/api/v1/webhooks/{subscription_id}", "204"), ("get", "/api/v1/webhooks"), {}, None),
]


def _link_all(doc: dict[str, Any]) -> None:
    paths = doc["paths"]
    for (method, path, status), (target_method, target_path), parameters, body in LINKS:
        source = paths.get(path, {}).get(method)
        target = paths.get(target_path, {}).get(target_method)
        if not source or not target or status not in source.get("responses", {}) or "operationId" not in target:
            continue
        declared = {(p["in"], p["name"]) for p in target.get("parameters", [])}
        if not all(tuple(name.split(".", 1)) in declared for name in parameters):
            continue
        link: dict[str, Any] = {"operationId": target["operationId"], "parameters": parameters}
        if body is not None:
            if "requestBody" not in target:
                continue
            link["requestBody"] = body
        links = source["responses"][status].setdefault("links", {})
        links[f"{target_method}_{target['operationId']}"] = link


# --- the runs ----------------------------------------------------------------------------------------------------


@dataclass
class Run:
    schema: Any
    stateful_schema: Any
    world: World
    base_url: str
    guard: StateGuard
    session: requests.Session = field(default_factory=requests.Session)
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)  # (operation, status) → how many
    # Failures are recorded, not raised: Hypothesis would replay a failing example, and against a live server
    # (whose state moved on) the replay answers differently, hiding the failure behind a "flaky" error.
    failures: list[str] = field(default_factory=list)

    auth_enforced: set[str] = field(default_factory=set)  # operations ignored_auth has seen refuse a missing token
    released: set[tuple[str, str]] = field(default_factory=set)  # (task id, lease id) of every lease released
    unsubscribed: set[int] = field(default_factory=set)  # webhook subscriptions deleted

    @property
    def checks(self) -> list[Check]:
        return [
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,  # errors are application/problem+json, and the document says so
            response_schema_conformance,
            response_headers_conformance,
            positive_data_accepted_beyond_hygiene,
            negative_data_rejected_beyond_the_steering,
            missing_required_header,
            unsupported_method,
            allow_header_conformance,
            self.ignored_auth_once,
            use_after_free,
            self.freed_stays_freed,
            created_stays_available_unless_replayed,
            no_state_change_on_a_rejected_request(self.guard),
        ]

    def ignored_auth_once(self, ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
        if case.operation.label in self.auth_enforced:
            return None
        result = ignored_auth(ctx, response, case)
        if 200 <= response.status_code < 300:
            self.auth_enforced.add(case.operation.label)
        return result

    def freed_stays_freed(self, ctx: CheckContext, response: Response, case: ApiCase) -> bool | None:
        """use_after_free for what this API frees but reads by no path under the freed one (which is all the built-in
        check follows): a released lease is named by the Reckon-Lease header, and a deleted webhook subscription is
        read in the list. Once released, a lease carries no request but another release (idempotent) and a
        directive to stop; once deleted, a subscription is not listed."""
        path = {name: str(value) for name, value in (case.path_parameters or {}).items()}
        lease = CaseInsensitiveDict(case.headers or {}).get(LEASE_HEADER)
        held = (path.get("task_id", ""), str(lease))
        succeeded = 200 <= response.status_code < 300
        stop = case.path.endswith("/directive") and succeeded and response.json().get("kind") == "stop"
        if succeeded and lease is not None and held in self.released and case.method != "DELETE" and not stop:
            raise AssertionError(f"lease {lease} of task {held[0]} was released, yet it carried {case.method}")
        if succeeded and case.method == "GET" and case.path == "/api/v1/webhooks":
            listed = {item.get("id") for item in response.json()} & self.unsubscribed
            if listed:
                raise AssertionError(f"deleted webhook subscriptions are still listed: {sorted(listed)}")
        if succeeded and case.method == "DELETE" and case.path.endswith("/lease"):
            self.released.add(held)
        if succeeded and case.method == "DELETE" and "subscription_id" in path:
            self.unsubscribed.add(int(path["subscription_id"]))
        return True

    def authenticate(self, case: ApiCase) -> None:
        """The token on every request (the security scheme's generated headers are not this test's subject)."""
        # A header a link took from a JSON number is sent as its text, as any client would send it; the whitespace
        # around a value is not part of it (RFC 9110, 5.5: servers strip it), so it is not sent as if it were.
        headers = {
            name: str(value).strip() if isinstance(value, int | str) else value
            for name, value in (case.headers or {}).items()
        }
        if _missing_header(case) == "authorization":
            case.headers = CaseInsensitiveDict(headers)
            return
        case.headers = CaseInsensitiveDict({**headers, **self.world.auth})

    def call_and_check(self, case: ApiCase) -> None:
        self.authenticate(case)
        self.guard.remember(case)
        auth = {} if _missing_header(case) == "authorization" else self.world.auth
        response = case.call(base_url=self.base_url, session=self.session, headers=auth)
        self.check(case, response)

    def check(self, case: ApiCase, response: Response, *, stateful: bool = False, **kwargs: Any) -> None:
        self.answers[case.operation.label, response.status_code] += 1
        checks = self.checks
        if stateful:
            # Along a link, the values the link supplies (a lease id, a version) replace what was drawn: a case drawn
            # as invalid may be valid once they are in, and its acceptance is no failure. Negative cases are
            # checked where nothing replaces them: the per-operation runs.
            checks = [check for check in checks if check is not negative_data_rejected_beyond_the_steering]
        try:
            case.validate_response(response, checks=checks, headers=self.world.auth, **kwargs)
        except (AssertionError, BaseExceptionGroup) as failure:
            said = f"{case.operation.label} -> {response.status_code}:\n{failure}"
            if said not in self.failures:  # Hypothesis may run a failing example again
                self.failures.append(said)

    def report(self) -> str:
        """The failures (each with a curl command reproducing it), then what the run saw, by operation and status."""
        seen = "\n".join(f"  {label}: {status} x{n}" for (label, status), n in sorted(self.answers.items()))
        return "\n\n".join(self.failures[:20]) + f"\n\n{len(self.failures)} failures; answers seen:\n{seen}"


@pytest.fixture
def run(world: World, live_server: Any) -> Iterator[Run]:
    document = json.loads(json.dumps(api.get_openapi_schema()))  # as served: plain JSON
    schema = schemathesis.openapi.from_dict(steered(document, world))
    stateful_schema = schemathesis.openapi.from_dict(steered(document, world, leases_from_links=True))
    for each in (schema, stateful_schema):
        checks = each.config.checks
        checks.positive_data_acceptance = PositiveDataAcceptanceConfig(expected_statuses=POSITIVE_REFUSALS)
        checks.missing_required_header = MissingRequiredHeaderConfig(expected_statuses=MISSING_HEADER_REFUSALS)
    checked = Run(
        schema=schema,
        stateful_schema=stateful_schema,
        world=world,
        base_url=live_server.url,
        guard=StateGuard(_state_query()),
    )
    yield checked
    checked.session.close()


SETTINGS = hypothesis.settings(
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure's curl reproduces it
    print_blob=True,
)


def test_every_operation_answers_within_the_document_and_a_rejection_changes_nothing(run: Run) -> None:
    operations = [result.ok() for result in run.schema.get_all_operations()]
    assert len(operations) >= 3, "the document lost its operations"
    for operation in operations:
        for probe in _probes(run.schema, operation):
            run.call_and_check(probe)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.settings(SETTINGS, max_examples=EXAMPLES_PER_MODE)
            @given(case=operation.as_strategy(generation_mode=mode))
            def exercise(case: ApiCase) -> None:
                run.call_and_check(case)

            exercise()
    assert not run.failures, run.report()
    reached = {"GET /api/v1/tasks/{task_id}": 200, "POST /api/v1/tasks": 201, "GET /api/v1/kinds/{kind}/actions": 200}
    _assert_reached(run, reached)


def test_stateful_runs_along_the_links_answer_within_the_document_and_rejections_change_nothing(run: Run) -> None:
    base = run.stateful_schema.as_state_machine()

    scenarios = 0

    class Workflow(base):  # type: ignore[valid-type,misc]
        def setup(self) -> None:
            nonlocal scenarios
            scenarios += 1

        def before_call(self, case: ApiCase) -> None:
            run.authenticate(case)
            run.guard.remember(case)

        def get_call_kwargs(self, case: ApiCase) -> dict[str, Any]:
            return {"base_url": run.base_url, "session": run.session, "headers": run.world.auth}

        def validate_response(
            self, response: Response, case: ApiCase, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            run.check(case, response, stateful=True, transport_kwargs=kwargs, recorder=self.recorder)

    # What a step may draw depends on what the server answered before (the links' values): when Hypothesis replays
    # a prefix of draws and the server's state has moved on, it stops the run as "inconsistent data generation".
    # Nothing failed then (failures are recorded, not raised): a fresh run goes on until the budget is spent.
    for _ in range(STATEFUL_SCENARIOS):
        with contextlib.suppress(hypothesis.errors.FlakyStrategyDefinition):
            Workflow.run(
                settings=hypothesis.settings(
                    SETTINGS, max_examples=STATEFUL_SCENARIOS - scenarios, stateful_step_count=STATEFUL_STEPS
                )
            )
        if scenarios >= STATEFUL_SCENARIOS:
            break
    assert not run.failures, run.report()
    _assert_reached(run, {"POST /api/v1/tasks": 201})
    on_a_task = [(label, status) for label, status in run.answers if "{task_id}/" in label and status < 300]
    assert on_a_task, f"no step on a task succeeded:\n{run.report()}"


def _missing_header(case: ApiCase) -> str | None:
    data = case.meta.phase.data if case.meta is not None else None
    if (
        isinstance(data, CoveragePhaseData)
        and data.scenario == CoverageScenario.MISSING_PARAMETER
        and data.parameter_location == ParameterLocation.HEADER
        and data.parameter
    ):
        return data.parameter.lower()
    return None


def _probes(schema: Any, operation: Any) -> Iterator[ApiCase]:
    """The coverage phase's requests that unsupported_method and missing_required_header judge (and only those: the
    rest of the phase is a thousand boundary values the positive and negative runs already draw): each method the
    path does not take (once per path), and the operation without each required header, Authorization included."""
    generation = schema.config.generation_for(operation=operation, phase="coverage")
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]  # both: the probes' other inputs are then valid
    for case in schema.iter_coverage_cases(operation, generation_modes=modes, generation_config=generation):
        data = case.meta.phase.data
        if data.scenario == CoverageScenario.UNSPECIFIED_HTTP_METHOD or _missing_header(case):
            yield case


def _assert_reached(run: Run, wanted: dict[str, int]) -> None:
    """The run got past the refusals to real work on these operations (when the document has them), so its
    passing says something about more than input validation."""
    print(run.report())  # shown with -s or on failure: what the run reached
    for label, status in wanted.items():
        if any(seen == label for seen, _ in run.answers):
            assert run.answers[label, status], f"{label} never answered {status}:\n{run.report()}"


def test_the_state_guard_sees_any_changed_row_but_a_tokens_last_use(world: World) -> None:
    """The check above is only as good as its reading of the state: one changed column of one existing row shows;
    a token's last-use hint does not."""
    guard = StateGuard(_state_query())
    before = guard.read()
    assert before["tasks_task"][0] >= len(world.in_scope) + 1 and before["leases_lease"][0] == 2
    ApiToken.objects.update(last_used_at=timezone.now())
    assert guard.read() == before
    Task.objects.filter(pk=world.in_scope[-1]).update(title="renamed behind the API's back")
    after = guard.read()
    assert [name for name in after if after[name] != before[name]] == ["tasks_task"]
    assert after["tasks_task"][0] == before["tasks_task"][0]  # same count: the digest saw the update
