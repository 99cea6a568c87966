"""One parsing layer for input from outside (tasks/core/parsing.py), and the edges the adversarial review answered
with HTTP 500: a header of non-ASCII digits, deeply nested JSON holding a NUL escape, NaN and infinities, a lone
surrogate, an id or version past 64 bits, a console filter or cursor of superscript digits. Each is a named 4xx,
and a refused request changes no table."""

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.apps import apps
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from api.tokens import api_token_issue
from console.forms.takeover import ReplanProposeForm
from tasks.core.parsing import (
    MAX_BIGINT,
    UnreadableInput,
    ascii_int,
    ascii_token,
    json_depth,
    lone_surrogate,
    strict_json,
)
from tasks.models import Task
from tests.conftest import chain_plan, person
from tests.test_api_steps import KIND, Agent, created, problem_of

# -- the layer ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("7", 7),
        ("007", 7),
        (str(MAX_BIGINT), MAX_BIGINT),
        (str(MAX_BIGINT + 1), None),  # past the column
        ("9" * 20, None),
        ("²", None),  # str.isdigit() says yes; int() raises
        ("¹²", None),
        ("\u0661\u0662", None),  # Arabic-Indic digits: int() would read 12
        ("\uff11\uff12", None),  # fullwidth
        ("", None),
        (" 7", None),
        ("7 ", None),
        ("-7", None),
        ("+7", None),
        ("7.0", None),
        ("0x7", None),
        (None, None),
    ],
)
def test_a_number_is_ascii_digits_that_fit_the_column(text: str | None, value: int | None) -> None:
    assert ascii_int(text) == value


@given(st.text(max_size=25))
@settings(max_examples=300)
def test_ascii_int_never_raises_and_accepts_only_what_int_reads_the_same(text: str) -> None:
    value = ascii_int(text)
    if value is not None:
        assert text.isascii() and int(text) == value and 0 <= value <= MAX_BIGINT


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        ("retry-7", True),
        ("a" * 200, True),
        ("a" * 201, False),
        ("", False),
        (None, False),
        ("\xb2", False),  # the byte 0xB2 as a WSGI server decodes it (Latin-1): printable, and not ASCII
        ("\xff", False),
        ("\xc2\xb2", False),  # "²" sent as UTF-8, decoded as Latin-1
        ("²", False),
        ("key\x00", False),
        ("key\x7f", False),
        ("key\n", False),
    ],
)
def test_a_header_key_is_printable_ascii(text: str | None, taken: bool) -> None:
    assert ascii_token(text, max_length=200) == (text if taken else None)


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ("[-Infinity]", "-Infinity"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
        ("[" * 65 + "]" * 65, "deeper"),
        ("[" * 100_000 + '"\\u0000"' + "]" * 100_000, "deeper"),  # the review's RecursionError, refused before
        ('{"a": 1', "not JSON"),
        (b'{"a": "\xed\xa0\x80"}', "lone surrogate"),  # a surrogate's bytes (json reads them, surrogatepass)
    ],
)
def test_strict_json_refuses_what_no_column_stores(document: str | bytes, why: str) -> None:
    with pytest.raises(UnreadableInput, match=why):
        strict_json(document)


def test_strict_json_reads_what_it_should() -> None:
    assert strict_json('{"a": [1, 2.5, "\\u00e9\\ud83d\\ude00", {"b": null}]}') == {"a": [1, 2.5, "é😀", {"b": None}]}
    assert strict_json("[" * 64 + "]" * 64) is not None  # exactly the cap
    assert json_depth('["[[[[", {"x": "}}}"}]') == 2  # brackets inside strings do not count
    assert json_depth('["\\"[[["]') == 1  # nor after an escaped quote


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=30,
    )
)
@settings(max_examples=200)
def test_strict_json_reads_back_every_document_json_writes(value: Any) -> None:
    text = json.dumps(value)
    if lone_surrogate(value) is not None or json_depth(text) > 64:
        with pytest.raises(UnreadableInput):
            strict_json(text)
    else:
        assert strict_json(text) == value


# -- the API's edges ---------------------------------------------------------------------------------------------

pytestmark = pytest.mark.django_db


def table_counts() -> dict[str, int]:
    return {model._meta.label: model._default_manager.count() for model in apps.get_models()}


@pytest.fixture
def agent(client: Client) -> Agent:
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=[KIND], projects=())
    return Agent(client, token)


@pytest.fixture
def unchanged() -> Iterator[Callable[[], None]]:
    before: dict[str, int] = {}

    def check() -> None:
        assert table_counts() == before

    before.update(table_counts())
    yield check


@pytest.mark.parametrize("version", ["²", "¹²", '"²"', 'W/"¹²"', "\u0661\u0662", str(MAX_BIGINT + 1)])
def test_if_match_of_digits_no_column_holds_is_a_named_400(agent: Agent, version: str) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])["lease_id"]
    before = table_counts()
    answer = agent.call(
        "post", f"/tasks/{task['id']}/operations", {"node_key": "a"}, Reckon_Lease=str(lease), If_Match=version
    )
    problem_of(answer, 400, "invalid_header")
    assert table_counts() == before


@pytest.mark.parametrize("lease", ["²", "¹²", "\u0661", str(MAX_BIGINT + 1)])
def test_a_lease_header_of_digits_no_column_holds_is_a_named_400(agent: Agent, lease: str) -> None:
    task = created(agent)
    agent.acquire(task["id"])
    before = table_counts()
    answer = agent.call("get", f"/tasks/{task['id']}/directive", Reckon_Lease=lease)
    problem_of(answer, 400, "invalid_header")
    assert table_counts() == before


@pytest.mark.parametrize("key", ["\xb2", "\xff", "\xc2\xb2", "k" * 201])
def test_an_idempotency_key_that_is_not_printable_ascii_is_a_named_422_and_writes_nothing(
    agent: Agent, key: str
) -> None:
    task = created(agent)
    lease = agent.acquire(task["id"])["lease_id"]
    d = agent.directive(task["id"], lease)
    before = table_counts()
    answer = agent.start(task["id"], lease, "a", d["task_version"], Idempotency_Key=key)
    problem_of(answer, 422, "validation_error")
    assert table_counts() == before


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind": "' + KIND.encode() + b'", "title": "t", "plan": {"nodes": []}, "x": NaN}',
        b'{"kind": "' + KIND.encode() + b'", "title": "t", "plan": {"nodes": [], "budget": Infinity}}',
        b'{"kind": "' + KIND.encode() + b'", "title": "\\ud800", "plan": {"nodes": []}}',
        b'{"kind": "' + KIND.encode() + b'", "title": "t", "plan": ' + b"[" * 5000 + b'"\\u0000"' + b"]" * 5000 + b"}",
    ],
    ids=["nan", "infinity", "lone-surrogate", "deep-with-nul"],
)
def test_a_body_no_database_can_store_is_malformed_and_creates_nothing(
    client: Client, agent: Agent, body: bytes, unchanged: Callable[[], None]
) -> None:
    answer = client.post(
        "/api/v1/tasks", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {agent.token}"
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] in ("malformed_body", "validation_error"), answer.json()
    unchanged()


def test_a_receipt_holding_a_lone_surrogate_or_nan_is_refused_and_settles_nothing(agent: Agent) -> None:
    task = created(agent, plan=chain_plan("a"))
    lease = agent.acquire(task["id"])["lease_id"]
    d = agent.directive(task["id"], lease)
    op = agent.start(task["id"], lease, "a", d["task_version"]).json()
    before = table_counts()
    for raw in (
        b'{"result": "committed", "remote_id": "r", "data": {"\\udc00": 1}}',
        b'{"result": "committed", "remote_id": "r", "data": {"n": NaN}}',
    ):
        answer = agent.client.post(
            f"/api/v1/tasks/{task['id']}/operations/{op['op_key']}/outcome",
            data=raw,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {agent.token}",
            HTTP_RECKON_LEASE=str(lease),
            HTTP_IF_MATCH=f'"{d["task_version"] + 1}"',
        )
        assert answer.status_code == 400, answer.content
    assert table_counts() == before
    assert Task.objects.get(pk=task["id"]).version == d["task_version"] + 1


# -- the console's ---------------------------------------------------------------------------------------------


@pytest.fixture
def operator(client: Client) -> Client:
    client.force_login(person("opal", "operator").user)
    return client


@pytest.mark.parametrize("text", ["²", "#¹²", "#" + "9" * 30, "\u0661\u0662"])
def test_a_queue_search_of_digits_no_id_holds_is_a_text_search(operator: Client, text: str) -> None:
    answer = operator.get(reverse("task-list"), {"q": text})
    assert answer.status_code == 200


@pytest.mark.parametrize("cursor", ["²", "¹²", "9" * 40])
def test_an_audit_cursor_of_digits_no_id_holds_is_no_5xx(client: Client, cursor: str) -> None:
    client.force_login(person("root", "admin").user)
    answer = client.get(reverse("audit-log"), {"after": cursor, "before": cursor})
    assert answer.status_code < 500


# -- ids past 64 bits, in every URL ------------------------------------------------------------------------------


def _urls_with_ids() -> list[str]:
    """Every console and API URL pattern with an id in it, the id set past 64 bits."""
    found: list[str] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for p in patterns:
            route = str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + route)
            elif isinstance(p, URLPattern) and ("<id:" in route or "<int:" in route or "{" in route or "(?P<" in route):
                found.append(prefix + route)

    walk(get_resolver().url_patterns, "/")
    return found


BIG = "9" * 25


def test_an_api_id_past_64_bits_is_a_named_404_on_every_route(agent: Agent) -> None:
    task = created(agent)
    before = table_counts()
    for path in (
        f"/tasks/{BIG}",
        f"/tasks/{BIG}/directive",
        f"/tasks/{2**63}/lease",
        f"/tasks/{task['id']}/retained/{BIG}/versions/1",
        f"/tasks/{task['id']}/temp-resources/{BIG}/cleanup",
    ):
        for method in ("get", "post"):
            answer = agent.call(method, path, {} if method == "post" else None)
            assert answer.status_code == 404, (method, path, answer.content)
            assert answer.json()["code"] in ("not_found", "task_not_found"), answer.json()
    assert table_counts() == before


def test_a_console_id_past_64_bits_matches_no_route(client: Client) -> None:
    client.force_login(person("root", "admin").user)
    routes = [r for r in _urls_with_ids() if "<id:" in r]
    assert len(routes) > 20  # every console page with an id
    for route in routes:
        path = re.sub(r"<id:\w+>", BIG, route)
        path = re.sub(r"<(?:str|slug|path):\w+>|<\w+>", "x", path)
        for method in ("get", "post"):
            answer = getattr(client, method)(path)
            assert answer.status_code == 404, (method, path, answer.status_code)


def test_no_console_url_takes_an_unbounded_int() -> None:
    assert [r for r in _urls_with_ids() if "<int:" in r] == []


@pytest.mark.parametrize(
    ("plan", "error"),
    [
        ('{"nodes": [{"key": "a", "max_attempts": NaN}]}', "NaN is not a JSON number"),
        ('{"nodes": [], "title": "\\ud800"}', "lone surrogate"),
        ('{"nodes": ' + "[" * 200 + "]" * 200 + "}", "deeper than"),
        ('{"nodes": [', "not JSON"),
    ],
)
def test_the_replan_form_refuses_a_plan_no_column_can_hold_by_name(plan: str, error: str) -> None:
    form = ReplanProposeForm({"expected_version": "3", "plan": plan, "reason": "the copy must be split in two"})
    assert not form.is_valid()
    assert error in " ".join(str(message) for message in form.errors["plan"]), form.errors


@pytest.mark.parametrize("version", [str(MAX_BIGINT + 1), "9" * 30, "²"])
def test_a_console_form_s_version_past_64_bits_is_a_form_error(version: str) -> None:
    form = ReplanProposeForm({"expected_version": version, "plan": '{"nodes": []}', "reason": "a reason long enough"})
    assert not form.is_valid() and "expected_version" in form.errors
