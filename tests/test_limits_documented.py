"""docs/limits.md states the code's limits: each number in its tables is the one the code has by default, each
setting it names is the one that changes it, and each status it gives an API problem code is the one api/errors.py
answers. A constant changed without the doc (or the doc without the constant) fails here. No database."""

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django import forms
from django.conf import settings
from ninja import Schema

from api.errors import STATUS_OF
from api.idempotency import KEPT_FOR, KEY_MAX
from api.retained import RetainIn
from api.schemas import CancelIn, CleanupOutcomeIn, InputsIn, LeaseIn, LeaseRenewIn, OutcomeIn, TaskCreateIn
from api.tasks import PAGE_DEFAULT, PAGE_MAX
from api.urls import MAX_BODY
from audit.anchors import MAX_LISTED_FINDINGS
from audit.hygiene import NODE_INPUT_CAP_BYTES, PAYLOAD_CAP_BYTES, PLAN_CAP_BYTES
from audit.reasons import MIN_REASON
from console.forms.admin import ReviewForm
from console.forms.queue import SavedViewForm
from console.forms.takeover import ReplanProposeForm
from console.saved_views import MAX_VIEWS_PER_OWNER
from console.views.admin import AUDIT_PAGE_SIZE
from console.views.detail import TIMELINE_PAGE_SIZE
from console.views.queue import PAGE_SIZE
from hooks.api import SubscriptionIn
from hooks.models import URL_MAX, WebhookSubscription
from retention.services import DEBUG_ARTIFACT_CAP_BYTES, NAME_MAX
from tasks.core.errors import PlanInvalid
from tasks.core.parsing import MAX_BIGINT, MAX_JSON_DEPTH
from tasks.core.plan import KEY_PATTERN, MAX_NODES, plan_json_schema
from tasks.engine.cleanup import MAX_CLEANUP_ATTEMPTS, MIN_RESET_REASON
from tasks.people.attachments import ATTACHMENT_CAP_BYTES
from tasks.people.bulk import MAX_TASKS
from tasks.people.forced_release import MIN_FORCE_TEXT
from tasks.people.notes import NOTE_MAX_CHARS
from tasks.people.oversight import MAX_LISTED_PROBLEMS
from tasks.people.settlement import MIN_NOTE
from tasks.reads.detail import (
    CHECK_ON_OPEN_MAX_EVENTS,
    CHECK_ON_OPEN_MAX_NODES,
    NODES_PAGE_SIZE,
    OPERATIONS_PAGE_SIZE,
    TEMP_NAMED_MAX,
)
from tasks.reads.takeover import NAMED_MAX, RESULT_STEPS_SHOWN, STEPS_BY_KEY_MAX

DOC = Path(__file__).resolve().parent.parent / "docs" / "limits.md"
HEADER = "What is limited"
# "413 `payload_too_large`": an API status and its problem code, as the doc's "Past it" column writes them.
API_PROBLEM = re.compile(r"\b(\d{3}) `([a-z_]+)`")


# --- how the doc writes a number -----------------------------------------------------------------------------------


def kib(size: int) -> str:
    assert size % 1024 == 0, size
    return f"{size // 1024} KiB"


def mib(size: int) -> str:
    assert size % (1024 * 1024) == 0, size
    return f"{size // (1024 * 1024)} MiB"


def seconds(span: timedelta) -> str:
    assert span.total_seconds().is_integer(), span
    return f"{int(span.total_seconds())} s"


def minutes(span: timedelta) -> str:
    assert span % timedelta(minutes=1) == timedelta(0), span
    return f"{span // timedelta(minutes=1)} minutes"


def days(span: timedelta) -> str:
    assert span == timedelta(days=span.days), span
    return f"{span.days} day" if span.days == 1 else f"{span.days} days"


def spoken(span: timedelta) -> str:
    """``span`` in the largest unit that divides it, as the doc says it after the seconds: "(1 hour)"."""
    for unit, name in ((timedelta(days=1), "day"), (timedelta(hours=1), "hour"), (timedelta(minutes=1), "minute")):
        if span % unit == timedelta(0):
            count = span // unit
            return f"({count} {name})" if count == 1 else f"({count} {name}s)"
    return f"({seconds(span)})"


def field(model: type[Schema], name: str) -> dict[str, Any]:
    """The JSON Schema of ``model``'s field ``name`` (the non-null branch of an optional one): its bounds."""
    schema: dict[str, Any] = model.model_json_schema()["properties"][name]
    branches: list[dict[str, Any]] = schema.get("anyOf", [schema])
    return next(branch for branch in branches if branch.get("type") != "null")


def form_bound(form: type[forms.Form], name: str, bound: str) -> int:
    """A console form field's ``min_length`` or ``max_length``."""
    return int(getattr(form.base_fields[name], bound))


# --- what the doc must state -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    row: str  # a phrase of the row's first cell, found in no other row
    values: tuple[str, ...]  # each as the doc writes it, in the row's Value cell
    settings: tuple[str, ...] = ()  # what the row's Setting cell names; none: the cell says "fixed"
    quoted: tuple[str, ...] = ()  # what its Past it and Way around cells say with the number in it


NODE_SCHEMA = plan_json_schema()["properties"]["nodes"]["items"]["properties"]
KEY_LENGTH = int(re.findall(r"\{0,(\d+)\}", KEY_PATTERN.pattern)[0]) + 1
TTLS = (field(LeaseIn, "ttl_seconds"), field(LeaseRenewIn, "ttl_seconds"))  # acquire, renew
RETENTION_BOUND = settings.RECKON_RETENTION_MAX_EXTENSION
REASON_MINIMA = (MIN_REASON, MIN_NOTE, form_bound(ReplanProposeForm, "reason", "min_length"))

LIMITS = [
    # Plans and budgets
    Limit("Nodes in a plan", (f"{MAX_NODES} nodes",), quoted=(f"at most {MAX_NODES} nodes",)),
    Limit(
        "Problems named in a plan's refusal",
        (f"the first {PlanInvalid.SHOWN}",),
        quoted=(f"the first {PlanInvalid.SHOWN} problems",),
    ),
    Limit("A plan document", (kib(PLAN_CAP_BYTES),), quoted=(f"request body cap ({kib(MAX_BODY)}",)),
    Limit(
        "One node's `input`",
        (kib(NODE_INPUT_CAP_BYTES),),
        quoted=(f"{NODE_INPUT_CAP_BYTES}-byte node input cap",),
    ),
    Limit("A node's `key`", (f"1 to {KEY_LENGTH} characters",)),
    Limit(
        "A node's `max_attempts`",
        (f"1 to {NODE_SCHEMA['max_attempts']['maximum']}", f"{settings.RECKON_DEFAULT_NODE_ATTEMPTS} when left out"),
        ("RECKON_DEFAULT_NODE_ATTEMPTS",),
    ),
    Limit(
        "A task's attempt budget, left out",
        (f"{settings.RECKON_TASK_ATTEMPTS_PER_NODE} per node, at least {settings.RECKON_DEFAULT_TASK_ATTEMPTS}",),
        ("RECKON_TASK_ATTEMPTS_PER_NODE", "RECKON_DEFAULT_TASK_ATTEMPTS"),
    ),
    Limit(
        "A task's attempt budget, stated",
        (
            f"at most {settings.RECKON_MAX_TASK_ATTEMPTS_PER_NODE} per node",
            f"never less than {settings.RECKON_DEFAULT_TASK_ATTEMPTS}",
            f"1 to {field(TaskCreateIn, 'attempt_budget')['maximum']}",
        ),
        ("RECKON_MAX_TASK_ATTEMPTS_PER_NODE",),
    ),
    Limit(
        "Backoff between a node's attempts",
        (
            f"{seconds(settings.RECKON_BACKOFF_BASE)}, doubling, at most {seconds(settings.RECKON_BACKOFF_CAP)} "
            f"{spoken(settings.RECKON_BACKOFF_CAP)}",
        ),
        ("RECKON_BACKOFF_BASE", "RECKON_BACKOFF_CAP"),
    ),
    Limit(
        "Deleting a temp resource",
        (f"{MAX_CLEANUP_ATTEMPTS} definite refusals",),
        quoted=(
            f"at least {MIN_RESET_REASON} characters",
            f"Write at least {MIN_REASON} characters",
            f"each reset allows {MAX_CLEANUP_ATTEMPTS} more",
        ),
    ),
    # Payloads
    Limit("An event of a task's log", (kib(PAYLOAD_CAP_BYTES),), quoted=(f"over the {PAYLOAD_CAP_BYTES}-byte cap",)),
    Limit("receipt `data`", (kib(PAYLOAD_CAP_BYTES),), quoted=(f"over the {PAYLOAD_CAP_BYTES}-byte cap",)),
    Limit("The request a node sends", (kib(PAYLOAD_CAP_BYTES),)),
    Limit("An audit row", (kib(PAYLOAD_CAP_BYTES),)),
    Limit("JSON nesting", (f"{MAX_JSON_DEPTH} levels",), quoted=(f"nests deeper than {MAX_JSON_DEPTH} levels",)),
    Limit("Ids and versions", (str(MAX_BIGINT),), quoted=(f"an id is at most {MAX_BIGINT}",)),
    # The agent API
    Limit("A request body", (kib(MAX_BODY),), quoted=(f"at most {MAX_BODY} bytes",)),
    Limit(
        "Requests per token",
        (f"{settings.RECKON_API_RATE} a minute",),
        ("RECKON_API_RATE",),
        quoted=(f"more than {settings.RECKON_API_RATE} requests this minute",),
    ),
    Limit(
        "`Idempotency-Key`",
        (f"1 to {KEY_MAX} printable ASCII characters", f"remembered {KEPT_FOR // timedelta(hours=1)} hours"),
        quoted=(f"after {KEPT_FOR // timedelta(hours=1)} hours",),
    ),
    Limit("A page of `GET /api/v1/tasks`", (f"{PAGE_DEFAULT} tasks by default, at most {PAGE_MAX}",)),
    Limit(
        "A new task's fields",
        (
            f"`kind` 1 to {field(TaskCreateIn, 'kind')['maxLength']} characters",
            f"`title` 1 to {field(TaskCreateIn, 'title')['maxLength']}",
            f"`project` at most {field(TaskCreateIn, 'project')['maxLength']}",
        ),
    ),
    Limit("A cancel's `reason`", (f"1 to {field(CancelIn, 'reason')['maxLength']} characters",)),
    Limit(
        "An outcome's fields",
        (
            f"`remote_id` {field(OutcomeIn, 'remote_id')['maxLength']} characters",
            f"`remote_version` {field(OutcomeIn, 'remote_version')['maxLength']}",
            f"`digest` {field(OutcomeIn, 'digest')['maxLength']}",
            f"`detail` {field(OutcomeIn, 'detail')['maxLength']}",
            f"`op_key` {field(CleanupOutcomeIn, 'op_key')['maxLength']}",
            f"from 0 to {field(OutcomeIn, 'count')['maximum']}",
        ),
    ),
    Limit(
        "Reported input versions",
        (
            f"names {field(InputsIn, 'current_versions')['propertyNames']['maxLength']} characters",
            f"versions {field(InputsIn, 'current_versions')['additionalProperties']['maxLength']}",
        ),
    ),
    Limit(
        "A request's deadline",
        (f"{seconds(settings.RECKON_REQUEST_DEADLINE)} after its send",),
        ("RECKON_REQUEST_DEADLINE_SECONDS",),
    ),
    Limit(
        'A "not found" after a cancel is final',
        (f"{seconds(settings.RECKON_REMOTE_CLOCK_SKEW)} past the request's deadline",),
        ("RECKON_REMOTE_CLOCK_SKEW_SECONDS",),
    ),
    # Leases
    Limit("An agent's lease", (f"{seconds(settings.RECKON_LEASE_TTL)} by default",), ("RECKON_LEASE_TTL_SECONDS",)),
    Limit(
        "`ttl_seconds` an agent asks for",
        tuple(f"at least {ttl['minimum']} s, at most {ttl['maximum']} s" for ttl in TTLS),
    ),
    Limit("Grace after a lease expires", (seconds(settings.RECKON_LEASE_GRACE),), ("RECKON_LEASE_GRACE_SECONDS",)),
    Limit(
        "A person's takeover lease",
        (f"{seconds(settings.RECKON_OPERATOR_LEASE_TTL)}, renewed",),
        ("RECKON_OPERATOR_LEASE_TTL_SECONDS",),
    ),
    # Console and people
    Limit(
        "Failed logins",
        (f"{settings.AXES_FAILURE_LIMIT} for one user name", f"refused for {minutes(settings.AXES_COOLOFF_TIME)}"),
        ("RECKON_LOGIN_FAILURE_LIMIT", "RECKON_LOGIN_COOLOFF_MINUTES"),
    ),
    Limit(
        "An approval's validity",
        (
            f"{seconds(settings.RECKON_APPROVAL_TTL)} {spoken(settings.RECKON_APPROVAL_TTL)} by default",
            f"at most {seconds(settings.RECKON_APPROVAL_TTL_MAX)} {spoken(settings.RECKON_APPROVAL_TTL_MAX)}",
        ),
        ("RECKON_APPROVAL_TTL_SECONDS", "RECKON_APPROVAL_TTL_MAX_SECONDS"),
    ),
    Limit("A note on a task", (f"1 to {NOTE_MAX_CHARS} characters",)),
    Limit("A file attached", (mib(ATTACHMENT_CAP_BYTES),)),
    Limit(
        "Saved views",
        (
            f"{MAX_VIEWS_PER_OWNER} per person",
            f"a name of at most {form_bound(SavedViewForm, 'name', 'max_length')} characters",
        ),
        quoted=(f"You have {MAX_VIEWS_PER_OWNER} saved views",),
    ),
    Limit(
        "A bulk action",
        (f"{MAX_TASKS} tasks a run", f"at least {MIN_REASON} characters"),
        quoted=(f"More than {MAX_TASKS} tasks match",),
    ),
    Limit("The reason of a cancel", tuple(f"at least {minimum} characters" for minimum in REASON_MINIMA)),
    Limit(
        "A forced release's justification",
        (
            f"at least {MIN_FORCE_TEXT} characters each",
            f"at least {form_bound(ReviewForm, 'note', 'min_length')} characters",
        ),
    ),
    Limit(
        "Rows on a page",
        (
            f"work queue {PAGE_SIZE}",
            f"audit log {AUDIT_PAGE_SIZE}",
            f"timeline {TIMELINE_PAGE_SIZE}",
            f"a task's nodes {NODES_PAGE_SIZE}",
            f"its operations {OPERATIONS_PAGE_SIZE}",
        ),
    ),
    Limit(
        "The hash-chain check",
        (f"at most {CHECK_ON_OPEN_MAX_EVENTS} events", f"at most {CHECK_ON_OPEN_MAX_NODES} nodes"),
    ),
    Limit("What a takeover package", (f"{NAMED_MAX} of each kind",)),
    Limit(
        "Steps the takeover page's result form shows",
        (f"the first {RESULT_STEPS_SHOWN}", f"{STEPS_BY_KEY_MAX} more opened by key"),
    ),
    Limit("Problems listed by a verification run", (str(MAX_LISTED_PROBLEMS), str(MAX_LISTED_FINDINGS))),
    # Retention
    Limit(
        "The content of a retained object",
        (mib(settings.RECKON_RETENTION_MAX_BYTES),),
        ("RECKON_RETENTION_MAX_BYTES",),
        quoted=(f"body cap comes first (base64 content: about {kib(MAX_BODY * 3 // 4)}",),
    ),
    Limit("A debug artifact", (kib(DEBUG_ARTIFACT_CAP_BYTES),)),
    Limit("A retained object's name", (f"1 to {NAME_MAX} characters", f"1 to {field(RetainIn, 'name')['maxLength']}")),
    Limit(
        "A retention asked for",
        (f"at most {days(RETENTION_BOUND)}",),
        ("RECKON_RETENTION_MAX_EXTENSION_DAYS",),
        quoted=(f"over the bound of {RETENTION_BOUND}",),
    ),
    Limit(
        "A retention left out",
        tuple(f"{kind} {days(span)}" for kind, span in settings.RECKON_RETENTION_TTL.items()),
        ("RECKON_RETENTION_TTL",),
    ),
    Limit(
        "Extensions by a person",
        (
            f"at most {settings.RECKON_RETENTION_MAX_EXTENSIONS}, never past {days(RETENTION_BOUND)} from creation",
            f"at least {MIN_REASON} characters",
        ),
        ("RECKON_RETENTION_MAX_EXTENSIONS", "RECKON_RETENTION_MAX_EXTENSION_DAYS"),
    ),
    # Webhooks
    Limit(
        "Live subscriptions per agent",
        (str(settings.RECKON_WEBHOOK_MAX_SUBSCRIPTIONS),),
        ("RECKON_WEBHOOK_MAX_SUBSCRIPTIONS",),
        quoted=(f"already has {settings.RECKON_WEBHOOK_MAX_SUBSCRIPTIONS} webhook subscriptions",),
    ),
    Limit(
        "A webhook URL",
        (f"{URL_MAX} characters",),
        quoted=(f"1 to {URL_MAX} characters",),
    ),
    Limit("Attempts of one delivery", (str(settings.RECKON_WEBHOOK_MAX_ATTEMPTS),), ("RECKON_WEBHOOK_MAX_ATTEMPTS",)),
    Limit(
        "Backoff between delivery attempts",
        (
            f"{seconds(settings.RECKON_WEBHOOK_BACKOFF_BASE)}, doubling, "
            f"at most {seconds(settings.RECKON_WEBHOOK_BACKOFF_CAP)} {spoken(settings.RECKON_WEBHOOK_BACKOFF_CAP)}",
        ),
        ("RECKON_WEBHOOK_BACKOFF_BASE_SECONDS", "RECKON_WEBHOOK_BACKOFF_CAP_SECONDS"),
    ),
    Limit(
        "Waiting for a receiver's answer",
        (seconds(timedelta(seconds=settings.RECKON_WEBHOOK_TIMEOUT_SECONDS)),),
        ("RECKON_WEBHOOK_TIMEOUT_SECONDS",),
    ),
    Limit(
        "Deliveries kept",
        (days(timedelta(days=settings.RECKON_WEBHOOK_KEEP_DAYS)),),
        ("RECKON_WEBHOOK_KEEP_DAYS",),
    ),
]


# --- the doc's tables ----------------------------------------------------------------------------------------------


def table_rows() -> list[str]:
    """Every body row of the doc's tables, as its line."""
    lines = DOC.read_text().splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith(f"| {HEADER} |")]


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def row_of(phrase: str) -> str:
    """The one row whose first cell holds ``phrase``."""
    found = [row for row in table_rows() if phrase in cells(row)[0]]
    assert len(found) == 1, f"docs/limits.md: {len(found)} rows for {phrase!r}, not one"
    return found[0]


def states(text: str, value: str) -> bool:
    """Whether ``text`` holds ``value`` as a whole number: "20" is not in "200", "2 s" is not in "12 s"."""
    return re.search(rf"(?<![0-9]){re.escape(value)}(?![0-9])", text) is not None


@pytest.mark.parametrize("limit", LIMITS, ids=[limit.row for limit in LIMITS])
def test_the_doc_states_the_limit_the_code_has(limit: Limit) -> None:
    overridden = [name for name in limit.settings if name in os.environ]
    if overridden:
        pytest.skip(f"{', '.join(overridden)} set in the environment: the doc states the default")
    what, value, setting, past, way = cells(row_of(limit.row))
    missing = [text for text in limit.values if not states(value, text)]
    missing += [text for text in limit.quoted if not states(f"{past} | {way}", text)]
    assert not missing, f"docs/limits.md, row {what!r}, does not say {missing}: the code's value changed?"
    if limit.settings:
        unnamed = [name for name in limit.settings if f"`{name}`" not in setting]
        assert not unnamed, f"docs/limits.md, row {what!r}: its Setting cell does not name {unnamed}"
    else:
        assert setting.startswith("fixed"), f"docs/limits.md, row {what!r}: no setting changes it, says {setting!r}"


def test_every_row_with_a_number_is_checked() -> None:
    checked = {row_of(limit.row) for limit in LIMITS}
    unchecked = [cells(row)[0] for row in table_rows() if re.search(r"[0-9]", cells(row)[1]) and row not in checked]
    assert not unchecked, f"rows of docs/limits.md no test holds to the code (add them to LIMITS): {unchecked}"


def test_each_api_problem_the_doc_names_has_the_status_it_gives() -> None:
    named = [(int(status), code) for row in table_rows() for status, code in API_PROBLEM.findall(cells(row)[3])]
    assert named, "docs/limits.md names no API problem: the pattern or the doc changed"
    wrong = [
        f"{status} {code} (the API: {STATUS_OF.get(code)})" for status, code in named if STATUS_OF.get(code) != status
    ]
    assert not wrong, f"docs/limits.md gives these problems another status than api/errors.py: {wrong}"


def test_the_api_takes_a_webhook_url_as_long_as_the_service_and_the_column_do() -> None:
    """The schema said 4,000 characters where the service and the column hold 2,000: one limit, said once."""
    assert field(SubscriptionIn, "url")["maxLength"] == URL_MAX == WebhookSubscription._meta.get_field("url").max_length


def test_the_pages_name_as_many_temp_resources_as_rows_of_every_other_kind() -> None:
    """docs/limits.md says one number for what a takeover package and the task page name, temp resources included."""
    assert TEMP_NAMED_MAX == NAMED_MAX
