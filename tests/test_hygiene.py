"""Invariant 8: checkpoints hold references, never secrets or large context — refused when written, found by
the scanner (``manage.py verify_log``) when something slipped in anyway."""

import json
import time
import uuid
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import hygiene
from audit.hygiene import (
    NODE_INPUT_CAP_BYTES,
    PAYLOAD_CAP_BYTES,
    PLAN_CAP_BYTES,
    PayloadTooLarge,
    SecretInPayload,
    canonical_json,
    check_payload,
    may_hold_secret,
    scan_payload,
)
from audit.principals import Principal
from leases.models import Lease
from tasks.core.errors import PlanInvalid
from tasks.core.lifecycle import FailureClass, NodeStatus, OperationStatus, PauseReason, TaskStatus
from tasks.core.outcomes import Committed, Failed, Outcome
from tasks.core.plan import MAX_NODES
from tasks.engine.events import append_event, event_digest, find_log_problem
from tasks.engine.plans import plan_propose, task_create
from tasks.engine.protocol import next_directive, operation_start, record_outcome, snapshot_at
from tasks.engine.verification import find_secrets, task_verify_log
from tasks.models import Event, Operation, Receipt, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import lease_force_release
from tests.conftest import as_a_tamperer, chain_plan, effect_node, person, snapshot

# Credential-shaped test values, assembled so that no literal credential sits in the source.
BEARER = "Bearer " + "c2VjcmV0LXRva2Vu" * 2
BASIC = "Basic " + "ZGVwbG95Omh1bnRlcjI="
PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
AWS_KEY = "AKIA" + "IOSFODNN7EXAMPLE"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2
JWT = "eyJ" + "hbGciOiJIUzI1NiJ9" + ".eyJ" + "zdWIiOiJhZ2VudC0xIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
URL_WITH_PASSWORD = "https://deploy:" + "hunter2" + "@store.example.com/projects/acme"
SECRET_VALUES = [BEARER, BASIC, PEM, AWS_KEY, GITHUB_TOKEN, JWT, URL_WITH_PASSWORD]

SOURCE = {"source": "store", "locator": "projects/acme", "version": "7", "digest": "sha256:" + "ab" * 32}


def current(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def step_to_dispatched(task: Task, lease: Lease) -> Operation:
    directive = next_directive(task_id=task.pk, lease=lease)
    assert directive.kind == "execute", directive
    return operation_start(
        snapshot_at(task_id=task.pk, lease=lease, expected_version=directive.task_version),
        directive.node_key,
        lease=lease,
    ).operation


def run_node(task: Task, lease: Lease, outcome: Outcome) -> Operation:
    op = step_to_dispatched(task, lease)
    version = current(task).version
    op = record_outcome(
        snapshot_at(task_id=op.task_id, lease=lease, expected_version=version), op.op_key, outcome, lease=lease
    ).operation
    assert current(task).version == version + 1
    return op


# --- check_payload: size ---------------------------------------------------------------------------------------


def padded_to(size: int) -> dict[str, str]:
    """A payload whose canonical JSON is exactly ``size`` bytes."""
    overhead = len(canonical_json({"blob": ""}).encode())
    return {"blob": "x" * (size - overhead)}


def test_it_accepts_a_payload_exactly_at_the_cap() -> None:
    payload = padded_to(PAYLOAD_CAP_BYTES)
    assert len(canonical_json(payload).encode()) == PAYLOAD_CAP_BYTES
    check_payload(payload, what="test payload")


def test_it_refuses_a_payload_one_byte_over_the_cap() -> None:
    with pytest.raises(PayloadTooLarge, match="over the 16384-byte cap") as caught:
        check_payload(padded_to(PAYLOAD_CAP_BYTES + 1), what="test payload")
    assert caught.value.details == {"size": PAYLOAD_CAP_BYTES + 1, "cap": PAYLOAD_CAP_BYTES}


def test_it_measures_the_cap_in_bytes_not_characters() -> None:
    with pytest.raises(PayloadTooLarge):
        check_payload({"blob": "é" * (PAYLOAD_CAP_BYTES // 2 + 1)}, what="test payload")


def test_it_refuses_a_transcript_however_it_is_nested() -> None:
    transcript = [{"role": "assistant", "content": "I will copy the next batch now. " * 20} for _ in range(40)]
    with pytest.raises(PayloadTooLarge):
        check_payload({"data": {"context": {"messages": transcript}}}, what="event")


# --- check_payload: credential-like keys and values --------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "DB_PASSWORD",
        "passwd",
        "passphrase",
        "client_secret",
        "token",
        "access_token",
        "refreshToken",
        "api_key",
        "api-key",
        "ApiKey",
        "private_key",
        "aws_access_key_id",
        "Authorization",
        "authorization",
        "proxy-authorization",
        "credentials",
        "cookie",
        "Set-Cookie",
        "session_id",
        "sessionid",
        "bearer",
    ],
)
def test_it_refuses_a_credential_key_at_any_depth(key: str) -> None:
    for payload, path in [
        ({key: "x"}, f"$.{key}"),
        ({"data": {key: 1}}, f"$.data.{key}"),
        ({"data": {"headers": [{"accept": "json"}, {key: None}]}}, f"$.data.headers[1].{key}"),
    ]:
        with pytest.raises(SecretInPayload) as caught:
            check_payload(payload, what="event")
        assert caught.value.details["paths"] == [path]


@pytest.mark.parametrize(
    "value",
    [
        BEARER,
        "Authorization: " + BEARER,
        BASIC,
        PEM,
        PEM.replace("RSA ", ""),
        PEM.replace("RSA", "OPENSSH"),
        AWS_KEY,
        "aws " + AWS_KEY + " us-east-1",
        GITHUB_TOKEN,
        GITHUB_TOKEN.replace("ghp_", "ghs_"),
        JWT,
        URL_WITH_PASSWORD,
        "postgres://app:" + "s3cret" + "@db.internal:5432/reckon",
        "xoxb-" + "1234567890-abcdefghij",
        "sk-" + "proj" + "A1b2C3d4E5f6G7h8I9j0",
    ],
)
def test_it_refuses_a_credential_value_at_any_depth(value: str) -> None:
    for payload, path in [
        ({"note": value}, "$.note"),
        ({"data": {"receipt": {"detail": value}}}, "$.data.receipt.detail"),
        ({"data": {"lines": ["ok", value]}}, "$.data.lines[1]"),
        ([value], "$[0]"),
    ]:
        with pytest.raises(SecretInPayload) as caught:
            check_payload(payload, what="event")
        assert caught.value.details["paths"] == [path]


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_the_refusal_names_the_place_never_the_secret(value: str) -> None:
    with pytest.raises(SecretInPayload) as caught:
        check_payload({"data": {"headers": {"x-auth": value}}}, what="receipt data")
    message = str(caught.value)
    assert "receipt data" in message
    assert "$.data.headers.x-auth" in message
    assert value not in message
    assert value.split()[-1] not in message


def test_it_reports_every_place_a_credential_sits() -> None:
    payload = {"token": "x", "data": {"url": URL_WITH_PASSWORD, "items": [{"password": "y"}]}}
    assert sorted(scan_payload(payload)) == ["$.data.items[0].password", "$.data.url", "$.token"]


def test_it_does_not_flag_ordinary_references() -> None:
    payload = {
        "op_key": f"rk-{uuid.uuid4().hex}-p1-copy-batch-1-0",
        "request_digest": "sha256:" + "0f" * 32,
        "plan_digest": "sha256:" + "9e" * 32,
        "prev_digest": "0" * 64,
        "remote_id": "obj-7f3a9c",
        "remote_ids": [str(uuid.uuid4()), "arn:aws:s3:::acme-bucket/projects/acme", "s3://acme-bucket/projects/acme"],
        "remote_version": "v2.3.1",
        "versions": ["7", "2030-01-01T00:00:00+00:00", '"9b2cf535f27731c974343645a3985328"', 'W/"etag-3"'],
        "input_refs": {"a.source": SOURCE},
        "locator": "https://store.example.com:9000/projects/acme?versionId=3",
        "node": "p1/copy-batch-1",
        "count": 150,
        "keys": ["projects/acme/a.bin", "projects/acme/b.bin"],
        "next_allowed_action": "retry",
        "by": "agent:worker-1",
        "after_cancel_request": False,
    }
    assert list(scan_payload(payload)) == []
    check_payload(payload, what="event")


def test_it_does_not_flag_receipt_counts_named_passed() -> None:
    """A digest check reports how many objects passed: a count, not a pass-word."""
    check_payload({"objects_passed": 150, "checks_passed": 3, "objects_failed": 0}, what="receipt data")


# --- check_payload: credentials written as text -----------------------------------------------------------------

# A credential pasted into free text (a note, a reason, a justification, receipt or failure details, an evidence
# value) is as much a secret as one under a credential key. Assembled so that no literal credential sits here.
PASSWORD = "hunter" + "2"
TEXT_SECRETS = [
    "password=" + PASSWORD,
    "deploy ran with password=" + PASSWORD + " on db-1",
    "PASSWORD = '" + PASSWORD + "'",
    "passwd: x",
    "pwd:" + PASSWORD,
    "db_password=" + PASSWORD,
    "spring.datasource.password=" + PASSWORD,
    '{"password": "' + PASSWORD + '"}',
    "token=abc" + "123def456",
    "access_token: abc" + "123",
    "https://store.example.com/projects/acme?versionId=3&token=abc" + "123",
    "api_key=AbCd" + "1234",
    "api-key: AbCd" + "1234",
    "X-Api-Key: AbCd" + "1234",
    "API key: AbCd" + "1234",
    "Authorization: Bearer abc",
    "authorization: Basic dXNl",
    "Proxy-Authorization: Digest username=x",
    "Cookie: sessionid=abc" + "123",
    "secret: …",
    "client_secret=" + PASSWORD,
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY",
    "--password " + PASSWORD,
    "--token=abc" + "123",
    "curl -u deploy:" + PASSWORD + " https://store.example.com/",
    "https://deploy:" + PASSWORD + "@store.example.com/projects/acme",
    "redis://:" + PASSWORD + "@cache.internal:6379/0",
    "key id " + "AKIA" + "IOSFODNN7EXAMPLE" + " was used",
    "temporary key " + "ASIA" + "IOSFODNN7EXAMPLE",
    "-----BEGIN PGP " + "PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
    "-----BEGIN ENCRYPTED " + "PRIVATE KEY-----\nMIIE\n-----END ENCRYPTED PRIVATE KEY-----",
]
# Where free text sits in what is written: notes, evidence, receipts, justifications, reasons, details.
TEXT_PLACES: list[tuple[Callable[[str], dict[str, Any]], str]] = [
    (lambda v: {"note": v}, "$.note"),
    (lambda v: {"evidence": [{"kind": "console_url", "value": v}]}, "$.evidence[0].value"),
    (lambda v: {"data": {"receipt": {"message": v}}}, "$.data.receipt.message"),
    (lambda v: {"justification": "the worker is stuck; " + v, "impact": "none"}, "$.justification"),
    (lambda v: {"reason": v}, "$.reason"),
    (lambda v: {"details": {"failure_detail": "remote said: " + v}}, "$.details.failure_detail"),
]


@pytest.mark.parametrize("value", TEXT_SECRETS)
def test_it_refuses_a_credential_written_as_text_wherever_it_sits(value: str) -> None:
    for place, path in TEXT_PLACES:
        payload = place(value)
        with pytest.raises(SecretInPayload) as caught:
            check_payload(payload, what="event")
        assert caught.value.details["paths"] == [path], payload
        assert PASSWORD not in str(caught.value)


PROSE = [
    "the password policy was reviewed",
    "token bucket rate limit: 50 requests per second",
    "rotate the API key before Friday",
    "password reset email sent to the owner",
    "secret management is handled by the vault (ref vault://kv/acme, version 4)",
    "Basic authentication required for this bucket",
    "WWW-Authenticate: Basic realm=store",
    "authorization failed: 403 from the store",
    "invalid token: expired",
    "password: required",
    "password=*****",
    "token: <redacted>",
    "tokens_used=512, max_tokens=4096",
    "checks pass=3 fail=0",
    "idempotent by op key: the store dedupes the batch",
    "see https://store.example.com:9000/projects/acme?versionId=3 at 2030-01-01T10:30:00Z",
    "ssh://git@github.com:22/acme/store.git",
    "agent:worker-1 copied 150 objects; digest sha256:" + "ab" * 32,
]


@pytest.mark.parametrize("text", PROSE)
def test_it_does_not_take_prose_about_credentials_for_a_credential(text: str) -> None:
    for place, _path in TEXT_PLACES:
        assert list(scan_payload(place(text))) == []
        check_payload(place(text), what="event")


# --- may_hold_secret: the scan's one-pass filter -----------------------------------------------------------------

# Pieces of credentials, of prose and of separators: strings drawn from them put credential words, schemes and
# flags at the very start and end of strings and keys, where a filter over joined text could lose a bound.
FRAGMENTS = [
    *SECRET_VALUES,
    *TEXT_SECRETS,
    *PROSE,
    "-u deploy:" + PASSWORD,
    "--user x:y",
    "Bearer ",
    "Basic ",
    "pass",
    "word",
    "tok",
    "en",
    "api",
    "Key",
    "session",
    "id",
    "=",
    ": ",
    "\n",
    " ",
    '"',
    "\\",
    "/",
    "@",
    "://",
    "x",
    "7",
]
TEXT = st.lists(st.sampled_from(FRAGMENTS), max_size=4).map("".join)
PAYLOADS = st.recursive(
    st.one_of(TEXT, st.integers(), st.none()),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(TEXT, children, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS)
def test_the_filter_never_lets_through_what_the_scan_finds(payload: Any) -> None:
    if list(scan_payload(payload)):
        assert may_hold_secret(payload)
        assert may_hold_secret(payload, canonical=canonical_json(payload))  # read off the canonical JSON


# One example of every credential format _SECRET_VALUE knows, each behind the literal that gates its search.
FORMAT_SECRETS = [
    PEM,
    AWS_KEY,
    AWS_KEY.replace("AKIA", "ASIA"),
    *(GITHUB_TOKEN.replace("ghp_", f"gh{kind}_") for kind in "pousr"),
    "github_pat_" + "A1b2C3d4E5f6G7h8I9j0K1",
    "xoxp-" + "1234567890-abcdefghij",
    "sk-" + "A1b2C3d4E5f6G7h8I9j0",
    "sk_live_" + "A1b2C3d4E5f6G7h8",
    "rk_test_" + "A1b2C3d4E5f6G7h8",
    "AIza" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r",
    JWT,
    URL_WITH_PASSWORD,
    "-u deploy:" + PASSWORD,
    "curl --user deploy:" + PASSWORD,
]


@pytest.mark.parametrize("value", [*SECRET_VALUES, *TEXT_SECRETS, *FORMAT_SECRETS])
def test_the_filter_passes_every_credential_on_to_the_scan_wherever_it_sits(value: str) -> None:
    for place, path in TEXT_PLACES:
        for payload in (place(value), {"before": "ok", "x": [place(value), "after"]}):
            assert may_hold_secret(payload)
            assert may_hold_secret(payload, canonical=canonical_json(payload))
        with pytest.raises(SecretInPayload) as caught:
            check_payload(place(value), what="event")
        assert caught.value.details["paths"] == [path]


def test_every_credential_word_carries_a_hint_the_filter_looks_for() -> None:
    assert all(any(hint in word for hint in hygiene._TEXT_HINTS) for word in hygiene._SECRET_WORDS)


def test_a_steps_event_takes_the_filters_short_way() -> None:
    """What a step's event carries — statuses, op keys, remote ids, digests — names no credential: the write is
    not scanned string by string (else the filter would be dead weight on every write)."""
    op_key = "rk-" + uuid.uuid4().hex + "-p1-n3-0"
    payload = {
        "task": {"status": "running", "attempts_used": 4},
        "nodes": {
            "p1/n3": {
                "status": "succeeded",
                "output": {"count": 1, "digest": "", "remote_id": "bench:" + op_key, "remote_version": ""},
                "last_error_class": "",
                "next_allowed_action": "",
            }
        },
        "operations": {op_key: {"status": "committed", "remote_id": "bench:" + op_key, "failure_class": ""}},
        "data": {"by": "agent:bench-0", "receipt": {"digest": "sha256:" + "ab" * 32}},
    }
    assert not may_hold_secret(payload)
    assert not may_hold_secret(payload, canonical=canonical_json(payload))
    leaked = {**payload, "data": {"note": "password=" + PASSWORD}}
    assert may_hold_secret(leaked) and may_hold_secret(leaked, canonical=canonical_json(leaked))


@given(st.text(alphabet=st.characters(codec=None)) | st.text())
@settings(max_examples=300, deadline=None)
def test_the_letters_the_filter_reads_are_the_ones_the_pattern_leaves(text: str) -> None:
    """The filter strips text to its letters with bytes.translate; it must leave exactly what the pattern it
    replaced leaves, whatever the text holds (non-ASCII letters, line breaks, lone surrogates)."""
    import re

    assert hygiene._letters(text) == re.sub(r"[^A-Za-z]+", "", text)
    assert hygiene._letters(text, breaks=True) == re.sub(r"[^A-Za-z\n]+", "", text)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
@settings(max_examples=300, deadline=None)
def test_canonical_json_is_the_text_json_dumps_gives(value: Any) -> None:
    """Digests of stored events are over this text: the shared encoder must write what json.dumps with the same
    options writes, to the byte."""
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    assert canonical_json(value) == expected


@pytest.mark.parametrize("unit", ["a:", "a=b", "--a=b", "a b:", "://a:b"])
def test_scanning_text_stays_linear_in_its_length(unit: str) -> None:
    """Every string of every payload is scanned: text made to make a pattern backtrack must not stall a write
    (a quadratic scan of 200 KB takes minutes, a linear one well under a second)."""
    text = unit * (200_000 // len(unit))
    started = time.perf_counter()
    assert list(scan_payload({"note": text})) == []
    assert time.perf_counter() - started < 10


def test_record_outcome_refuses_a_password_in_receipt_text_and_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    op = step_to_dispatched(task, lease)
    before = snapshot()
    with pytest.raises(SecretInPayload, match=r"\$\.note"):
        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=current(task).version),
            op.op_key,
            Committed(remote_id="r-a", data={"note": "copied with password=" + PASSWORD}),
            lease=lease,
        )
    assert snapshot() == before


def test_a_cancel_reason_carrying_a_password_is_refused_and_nothing_is_written(make_task, clock) -> None:
    task = make_task(chain_plan("a"))
    before = snapshot()
    with pytest.raises(SecretInPayload, match=r"cancel_requested audit row carries .* at \$\.reason"):
        task_request_cancel(
            actor=Principal.agent("tester"), task_id=task.pk, reason="stop it, the db passwd: " + PASSWORD
        )
    assert snapshot() == before


def test_a_forced_release_justification_carrying_a_token_is_refused_and_nothing_is_written(
    make_task, agent_lease, clock
) -> None:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root = person("root", "admin")
    before = snapshot()
    with pytest.raises(SecretInPayload, match=r"lease_forced_release audit row carries .* at \$\.reason"):
        lease_force_release(
            actor=root,
            task_id=task.pk,
            justification="the worker hangs; log in with api_key=AbCd1234 to see it",
            impact="the copy of batch 3 restarts from its op key",
        )
    assert snapshot() == before


# --- task_create: the task's own free text (title, project) -----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("title", "Migrate acme (password=" + PASSWORD + ")"),
        ("title", "Migrate " + URL_WITH_PASSWORD),
        ("title", "Migrate with " + GITHUB_TOKEN),
        ("project", "acme token=abc123"),
        ("project", AWS_KEY),
    ],
)
def test_task_create_refuses_a_secret_in_the_title_or_project(make_task, clock, field: str, value: str) -> None:
    make_task(title="a bystander task")
    before = snapshot()
    with pytest.raises(SecretInPayload, match=rf"task carries credential-like data at \$\.{field}") as caught:
        task_create(
            kind="test",
            title=value if field == "title" else "t",
            project=value if field == "project" else "",
            plan=chain_plan("a"),
            created_by="agent:tester",
        )
    assert snapshot() == before
    assert value not in str(caught.value)


def test_task_create_accepts_an_ordinary_title(make_task, clock) -> None:
    task = task_create(
        kind="test",
        title="Rotate the password policy docs for acme (token bucket limits)",
        project="acme",
        plan=chain_plan("a"),
        created_by="agent:tester",
    )
    assert task.title.startswith("Rotate the password policy")


# --- node inputs: their own cap ---------------------------------------------------------------------------------


def test_a_node_input_is_held_to_its_own_cap_not_the_plan_documents(make_task, clock) -> None:
    """A 64 KB chat transcript fits under the plan document cap; it is still context, not a reference."""
    transcript = [{"role": "user", "content": "please copy the next batch " * 40} for _ in range(60)]
    assert 64 * 1024 <= len(canonical_json(transcript).encode()) < PLAN_CAP_BYTES
    plan = {
        "nodes": [effect_node("prepare"), effect_node("chat", depends_on=["prepare"], input={"context": transcript})]
    }
    make_task(title="a bystander task")
    before = snapshot()
    with pytest.raises(
        PlanInvalid, match=r"node chat: input is \d+ bytes, over the 16384-byte node input cap"
    ) as caught:
        task_create(kind="test", title="t", plan=plan, created_by="agent:tester")
    assert snapshot() == before
    assert len(caught.value.problems) == 1, caught.value.problems


def test_a_node_input_exactly_at_its_cap_is_accepted_and_one_byte_over_is_refused(make_task, clock) -> None:
    assert NODE_INPUT_CAP_BYTES == PAYLOAD_CAP_BYTES
    task = task_create(
        kind="test",
        title="t",
        plan={"nodes": [effect_node("a", input=padded_to(NODE_INPUT_CAP_BYTES))]},
        created_by="agent:tester",
    )
    assert len(canonical_json(task.nodes.get().input).encode()) == NODE_INPUT_CAP_BYTES
    before = snapshot()
    with pytest.raises(PlanInvalid, match="node a: input is 16385 bytes"):
        task_create(
            kind="test",
            title="t",
            plan={"nodes": [effect_node("a", input=padded_to(NODE_INPUT_CAP_BYTES + 1))]},
            created_by="agent:tester",
        )
    assert snapshot() == before


def test_plan_propose_refuses_an_oversized_node_input_and_writes_nothing(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    before = snapshot()
    with pytest.raises(PlanInvalid, match="node big: input is"):
        plan_propose(
            task_id=task.pk,
            plan={"nodes": [effect_node("big", input=padded_to(NODE_INPUT_CAP_BYTES + 1))]},
            proposed_by="agent:model",
            expected_version=task.version,
            lease=lease,
        )
    assert snapshot() == before


# --- through the services: refused when written, nothing written --------------------------------------------------


@pytest.mark.parametrize(
    "node",
    [
        effect_node("a", input={"api_key": "k-123"}),
        effect_node("a", input={"target": URL_WITH_PASSWORD}),
        effect_node("a", input={"headers": {"x-auth": BEARER}}),
        effect_node("a", input={"source": {"ref": SOURCE}, "extra": [{"note": GITHUB_TOKEN}]}),
        effect_node("a", rerun="re-run with " + AWS_KEY),
    ],
)
def test_task_create_refuses_a_plan_carrying_a_secret(make_task, clock, node: dict[str, Any]) -> None:
    make_task(title="a bystander task")
    before = snapshot()
    with pytest.raises(PlanInvalid, match="credential-like data at") as caught:
        task_create(kind="test", title="t", plan={"nodes": [node]}, created_by="agent:tester")
    assert snapshot() == before
    for secret in [*SECRET_VALUES, "k-123"]:
        assert secret not in str(caught.value)


def test_plan_propose_refuses_a_plan_carrying_a_secret(make_task, agent_lease, clock) -> None:
    task = make_task()
    lease = agent_lease(task)
    before = snapshot()
    with pytest.raises(PlanInvalid, match="credential-like data at"):
        plan_propose(
            task_id=task.pk,
            plan={"nodes": [effect_node("a", input={"password": "hunter2"})]},
            proposed_by="agent:model",
            expected_version=task.version,
            lease=lease,
        )
    assert snapshot() == before


@pytest.mark.parametrize(
    "data",
    [
        {"token": "t-1"},
        {"headers": {"Authorization": "x"}},
        {"response": {"echo": BEARER}},
        {"note": GITHUB_TOKEN},
        {"callback": URL_WITH_PASSWORD},
    ],
)
def test_record_outcome_refuses_receipt_data_carrying_a_token(make_task, agent_lease, clock, data) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    op = step_to_dispatched(task, lease)
    version = current(task).version
    before = snapshot()
    with pytest.raises(SecretInPayload):
        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=version),
            op.op_key,
            Committed(remote_id="r-a", data=data),
            lease=lease,
        )
    assert snapshot() == before
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.DISPATCHED
    assert not Receipt.objects.filter(operation=op).exists()

    record_outcome(
        snapshot_at(task_id=op.task_id, lease=lease, expected_version=version),
        op.op_key,
        Committed(remote_id="r-a"),
        lease=lease,
    )
    assert current(task).status == TaskStatus.COMPLETED


@pytest.mark.parametrize(
    "receipt",
    [
        Committed(remote_id=GITHUB_TOKEN),
        Committed(remote_id="r-a", remote_version=AWS_KEY),
        Committed(remote_id="r-a", digest=BEARER),
    ],
)
def test_record_outcome_refuses_receipt_fields_carrying_a_token(make_task, agent_lease, clock, receipt) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    op = step_to_dispatched(task, lease)
    before = snapshot()
    with pytest.raises(SecretInPayload):
        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=current(task).version),
            op.op_key,
            receipt,
            lease=lease,
        )
    assert snapshot() == before
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.DISPATCHED


def test_record_outcome_refuses_an_oversized_receipt(make_task, agent_lease, clock) -> None:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    op = step_to_dispatched(task, lease)
    before = snapshot()
    with pytest.raises(PayloadTooLarge):
        record_outcome(
            snapshot_at(task_id=op.task_id, lease=lease, expected_version=current(task).version),
            op.op_key,
            Committed(remote_id="r-a", data=padded_to(PAYLOAD_CAP_BYTES + 1)),
            lease=lease,
        )
    assert snapshot() == before
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.DISPATCHED


def test_a_failure_detail_in_plain_words_is_not_taken_for_a_credential(make_task, agent_lease, clock) -> None:
    """A 401 that says so in words must still be recorded: otherwise the operation stays dispatched for good."""
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    op = step_to_dispatched(task, lease)
    record_outcome(
        snapshot_at(task_id=op.task_id, lease=lease, expected_version=current(task).version),
        op.op_key,
        Failed(FailureClass.PERMISSION_REVOKED, "Basic authentication required for this bucket"),
        lease=lease,
    )
    paused = current(task)
    assert (paused.status, paused.status_reason) == (TaskStatus.PAUSED, PauseReason.PERMISSION_REVOKED)
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.REJECTED


def test_the_largest_plan_validation_allows_fits_every_event_it_produces(make_task, clock) -> None:
    """MAX_NODES nodes with the longest keys (a fan-out node's members, ``<key>-20000``): accepted, and its
    plan_accepted event stays under the cap (node definitions live in the plan revision, the event carries its
    digest)."""
    suffix = len(f"-{MAX_NODES}")
    plan = {"nodes": [effect_node("n" * (100 - suffix), fan_out={"total": MAX_NODES, "batch": 1})]}
    task = task_create(kind="test", title="t", plan=plan, created_by="agent:tester")
    event = Event.objects.get(task=task, type="plan_accepted")
    assert len(canonical_json(event.payload).encode()) <= PAYLOAD_CAP_BYTES
    assert task.nodes.count() == MAX_NODES


def test_a_plan_document_over_its_cap_is_refused_and_nothing_is_written(make_task, clock) -> None:
    plan = {"nodes": [effect_node("a", rerun="x" * (PLAN_CAP_BYTES + 1))]}
    make_task(title="a bystander task")
    before = snapshot()
    with pytest.raises(PlanInvalid, match="over the"):
        task_create(kind="test", title="t", plan=plan, created_by="agent:tester")
    assert snapshot() == before


def test_append_event_refuses_an_oversized_or_secret_payload(make_task, clock) -> None:
    task = make_task()
    before = snapshot()
    with pytest.raises(PayloadTooLarge, match="event note"):
        append_event(
            task=task,
            seq=task.version + 1,
            type="note",
            payload={"data": padded_to(PAYLOAD_CAP_BYTES + 1)},
            at=clock.now(),
        )
    with pytest.raises(SecretInPayload, match=r"event note carries credential-like data at \$\.data\.session_id"):
        append_event(
            task=task, seq=task.version + 1, type="note", payload={"data": {"session_id": "s"}}, at=clock.now()
        )
    assert snapshot() == before


# --- the scanner: verify_log ------------------------------------------------------------------------------------


def full_run(make_task, agent_lease) -> Task:
    """A migration through every kind of input and evidence, to completion, with realistic receipt data."""
    target = {"from": "prepare", "field": "remote_id"}
    plan = {
        "nodes": [
            effect_node(
                "prepare",
                action="store.prepare_target",
                input={"project": "acme", "source": {"ref": SOURCE}},
                evidence={"remote_id": True, "remote_version": {"input": "source", "field": "version"}},
            ),
            effect_node(
                "copy",
                depends_on=["prepare"],
                input={"target": target, "source": {"ref": SOURCE}, "limit": 50},
                evidence={"remote_id": True, "count": {"input": "limit"}},
                on_failure={"dependency_unavailable": "retry"},
            ),
            effect_node(
                "verify",
                action="store.verify_digests",
                depends_on=["copy"],
                input={"target": target, "source": {"ref": SOURCE}},
                evidence={"remote_id": True, "digest": {"input": "source", "field": "digest"}},
            ),
            effect_node(
                "switch",
                action="store.switch_reference",
                depends_on=["verify"],
                input={"target": target, "source": {"ref": SOURCE}},
                irreversible=True,
                compensation="store.restore_reference",
            ),
        ]
    }
    task: Task = make_task(plan, kind="migrate_project")
    lease = agent_lease(task)
    run_node(
        task,
        lease,
        Committed(remote_id="bucket-acme-2", remote_version="7", data={"region": "eu-1", "request_id": "req-81f2"}),
    )
    run_node(task, lease, Committed(remote_id="copy-job-17", count=50, data={"etag": '"9b2cf535f277"', "parts": 3}))
    run_node(task, lease, Committed(remote_id="verify-4", digest=SOURCE["digest"], data={"checked": 50}))
    run_node(task, lease, Committed(remote_id="ref-acme", remote_version="2", data={"previous": "bucket-acme-1"}))
    done = current(task)
    assert done.status == TaskStatus.COMPLETED
    return done


def verify_log(*args: str) -> str:
    out = StringIO()
    call_command("verify_log", *args, stdout=out)
    return out.getvalue()


def failing_verify_log(*args: str) -> str:
    out = StringIO()
    with pytest.raises(CommandError, match="failed verification"):
        call_command("verify_log", *args, stdout=out)
    return out.getvalue()


def test_a_full_run_stores_no_secret_and_verifies_clean(make_task, agent_lease, clock) -> None:
    task = full_run(make_task, agent_lease)
    assert find_secrets(task) == []
    assert Receipt.objects.filter(operation__task=task).count() == 4
    output = verify_log("--task", str(task.pk))
    assert "1 ok, 0 with problems, 0 quarantined now" in output
    assert current(task).status == TaskStatus.COMPLETED


def rechain_from(task: Task, seq: int) -> None:
    """Recompute the digest chain from ``seq`` on, as a writer that bypassed append_event would have."""
    prev = Event.objects.get(task=task, seq=seq - 1).digest
    for event in Event.objects.filter(task=task, seq__gte=seq).order_by("seq"):
        digest = event_digest(
            task_uid=str(task.uid),
            seq=event.seq,
            type=event.type,
            payload=event.payload,
            created_at=event.created_at.isoformat(),
            prev=prev,
        )
        raw_update(Event, event.pk, prev_digest=prev, digest=digest)
        prev = digest
    raw_update(Task, task.pk, log_head=prev)  # and the head the task row keeps: a thorough forger's last step


def raw_update(model: Any, pk: int, **fields: Any) -> None:
    """What a writer with DDL rights does past the append-only triggers (the test's transaction rolls it back)."""
    as_a_tamperer()
    table = connection.ops.quote_name(model._meta.db_table)
    sets, params = [], []
    for name, value in fields.items():
        if isinstance(value, dict):
            sets.append(f"{name} = " + ("CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"))
            params.append(json.dumps(value))
        else:
            sets.append(f"{name} = %s")
            params.append(value)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {', '.join(sets)} WHERE id = %s", [*params, pk])  # noqa: S608


def test_verify_log_finds_and_quarantines_a_secret_in_a_well_chained_event(make_task, agent_lease, clock) -> None:
    task = full_run(make_task, agent_lease)
    event = Event.objects.get(task=task, seq=5)
    raw_update(
        Event, event.pk, payload=event.payload | {"data": event.payload["data"] | {"echo": {"api_key": GITHUB_TOKEN}}}
    )
    rechain_from(task, 5)
    task.refresh_from_db()
    assert find_log_problem(task) is None, "the chain and projection are intact: only the scanner can see it"
    assert find_secrets(task) == ["event 5 $.data.echo.api_key"] * 2, "the key and its value"

    output = failing_verify_log("--task", str(task.pk))
    assert "credential-like data stored at event 5 $.data.echo.api_key" in output
    assert "→ quarantined" in output
    assert GITHUB_TOKEN not in output
    quarantined = current(task)
    assert quarantined.status == TaskStatus.QUARANTINED
    assert GITHUB_TOKEN not in quarantined.status_detail
    assert Event.objects.get(task=task, seq=quarantined.version).type == "quarantined"


def inject_with_raw_sql(event: Event, payload: dict[str, Any]) -> None:
    as_a_tamperer()
    table = connection.ops.quote_name(Event._meta.db_table)
    value = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET payload = {value} WHERE id = %s", [json.dumps(payload), event.pk])  # noqa: S608


def test_verify_log_quarantines_an_event_a_secret_was_written_into_with_raw_sql(make_task, agent_lease, clock) -> None:
    task = full_run(make_task, agent_lease)
    event = Event.objects.get(task=task, seq=5)
    inject_with_raw_sql(event, event.payload | {"data": {"headers": {"Authorization": BEARER}}})
    output = failing_verify_log("--task", str(task.pk))
    assert f"task {task.pk}: " in output
    assert "→ quarantined" in output
    assert BEARER.split()[-1] not in output
    assert current(task).status == TaskStatus.QUARANTINED


def test_verify_log_names_the_secret_even_when_the_injection_broke_the_chain(make_task, agent_lease, clock) -> None:
    """Whoever reads the report must learn that a credential is stored (to purge and rotate it), not only that
    an event was altered."""
    task = full_run(make_task, agent_lease)
    event = Event.objects.get(task=task, seq=5)
    raw_update(Event, event.pk, payload=event.payload | {"data": {"password": "hunter2"}})
    output = failing_verify_log("--task", str(task.pk))
    assert "credential-like data" in output
    assert "event 5 $.data.password" in output
    assert current(task).status == TaskStatus.QUARANTINED


def test_verify_log_finds_a_secret_written_into_a_receipt(make_task, agent_lease, clock) -> None:
    task = full_run(make_task, agent_lease)
    receipt = Receipt.objects.get(operation__task=task, remote_id="copy-job-17")
    Receipt.objects.filter(pk=receipt.pk).update(data={"etag": "e", "upload_url": URL_WITH_PASSWORD})
    output = failing_verify_log("--task", str(task.pk))
    assert f"receipt {receipt.pk} $.upload_url" in output
    assert "hunter2" not in output
    assert current(task).status == TaskStatus.QUARANTINED


def test_verify_log_dry_run_reports_but_quarantines_nothing(make_task, agent_lease, clock) -> None:
    task = full_run(make_task, agent_lease)
    clean = make_task(chain_plan("x"))
    Receipt.objects.filter(operation__task=task).update(data={"token": "t"})
    before = snapshot()
    output = failing_verify_log("--dry-run")
    assert snapshot() == before
    assert "2 tasks" in output
    assert "1 ok, 1 with problems, 0 quarantined now" in output
    assert f"task {clean.pk}:" not in output
    assert task_verify_log(task_id=clean.pk).problem is None
    assert Operation.objects.filter(task=task, status=OperationStatus.COMMITTED).count() == 4
    assert all(n.status == NodeStatus.SUCCEEDED for n in task.nodes.all())
