"""Every console form and page, fuzzed as an attacker would (hypothesis): no input is a server error, and a refused
request changes no table.

The routes are read from console.urls (tests/test_console_refusals.py's walk), so a form added later is fuzzed
without editing this file. Each action that takes a POST is posted, as the operator holding the task's takeover and
as an admin, with a form that would pass — the fields every page of the scene renders, with their values — which
hypothesis then breaks: fields dropped, given twice, replaced by text holding a NUL or a lone surrogate (as its
UTF-8-style bytes), superscript and Arabic-Indic digits, integers past 64 bits, very long strings, bytes that are not
UTF-8; sent as a raw urlencoded or multipart body (with an attachment whose name and bytes are as bad). Every page
read with a GET is sent the query parameters its links and filters carry (cursors, filters), and the htmx headers,
as badly. Each answer must be below 500; a 4xx (a refusal) must leave every table as it was; a GET writes nothing.

Each example runs in a savepoint rolled back after it: the scene is the same for every example, so a failure
shrinks to its smallest form. RECKON_CONSOLE_FUZZ_SCALE (default 1: CI's) scales the examples per route and
persona; RECKON_CONSOLE_FUZZ_SCALE=20 runs deeper."""

import contextlib
import copy
import hashlib
import os
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl, quote_from_bytes, urlsplit

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, get_resolver, resolve, reverse
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from api.tokens import api_token_issue
from audit.principals import Principal
from console.forms.bulk import NoteForm
from console.saved_views import saved_view_save
from leases.clock import ControllableClock
from tasks.core.lifecycle import TempResourceStatus
from tasks.models import Task, TempResource
from tasks.people.bulk import Seen, bulk_run_create
from tasks.people.forced_release import lease_force_release
from tests.conftest import person
from tests.test_console_reconcile import NOTE, taken_over
from tests.test_console_refusals import _patterns, form

pytestmark = pytest.mark.django_db

SCALE = float(os.environ.get("RECKON_CONSOLE_FUZZ_SCALE", "1"))
POST_EXAMPLES = max(1, round(3 * SCALE))  # per action and persona
GET_EXAMPLES = max(1, round(2 * SCALE))  # per page and persona
# Django's bookkeeping: a login's session and the migrations, which no console form touches either way.
NOT_STATE = {"django_session", "django_migrations"}
FUZZ = settings(
    max_examples=1,  # each test sets its own
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)
POST_FUZZ = settings(FUZZ, max_examples=POST_EXAMPLES)


# --- the database's state -----------------------------------------------------------------------------------------


def every_table() -> dict[str, tuple[int, str]]:
    """Every table's row count and a digest of its rows (Django's own sessions aside)."""
    state = {}
    with connection.cursor() as cursor:
        for table in sorted(set(connection.introspection.table_names(cursor)) - NOT_STATE):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608 (the catalogue's names)
            rows = sorted(repr(row) for row in cursor.fetchall())
            state[table] = (len(rows), hashlib.sha256("\n".join(rows).encode("utf-8", "surrogatepass")).hexdigest())
    return state


def changed(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


# --- what the pages hold: every field of every form, every query parameter of every link ------------------------


class Pages(HTMLParser):
    """What the pages hold: the named fields of each POST form, by the URL it posts to (with the value each field
    holds), and the query parameters of their links and GET forms."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: dict[str, dict[str, str]] = {}
        self.params: dict[str, str] = {}
        self._page = ""
        self._form: dict[str, str] | None = None  # the POST form being read
        self._textarea = self._select = ""

    def read(self, url: str, html: str) -> None:
        self._page = url
        self.feed(html)
        self.close()
        self.reset()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {name: value or "" for name, value in attrs}
        name = a.get("name", "")
        if tag == "form":
            post = a.get("method", "get").lower() == "post"
            self._form = self.forms.setdefault(urlsplit(a.get("action") or self._page).path, {}) if post else None
        elif name and self._form is not None:
            self._field(self._form, tag, name, a)
        elif name:
            self.params.setdefault(name, a.get("value", ""))
        if tag == "option" and self._select and self._form is not None:
            self._form.setdefault(self._select, a.get("value", ""))
        for attribute in ("href", "hx-get"):
            if "?" in a.get(attribute, ""):
                for key, value in parse_qsl(urlsplit(a[attribute]).query, keep_blank_values=True):
                    self.params.setdefault(key, value)

    def _field(self, form: dict[str, str], tag: str, name: str, a: dict[str, str]) -> None:
        kind = a.get("type", "text")
        if tag == "input" and kind == "radio":  # the checked one, else the first
            form[name] = a["value"] if "checked" in a else form.get(name, a.get("value", ""))
        elif tag == "input" and kind == "checkbox":
            if "checked" in a:
                form[name] = a.get("value", "on")
        elif tag == "input" and kind not in ("submit", "button", "file"):
            form.setdefault(name, a.get("value", ""))
        elif tag == "textarea":
            self._textarea = name
            form.setdefault(name, "")
        elif tag == "select":
            self._select = name

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "select":
            self._select = ""
        elif tag == "textarea":
            self._textarea = ""

    def handle_data(self, data: str) -> None:
        if self._textarea and self._form is not None and not self._form.get(self._textarea):
            self._form[self._textarea] = data.strip()


# --- bad values ---------------------------------------------------------------------------------------------------

BAD_TEXTS = [
    "",
    " ",
    "\x00",
    "1\x00",
    "²",
    "¹²",
    "\u0661\u0662",  # Arabic-Indic 12: int() reads it
    "\uff11",  # fullwidth 1
    "-1",
    "0",
    str(2**63 - 1),
    str(2**63),
    str(2**64),
    "9" * 40,
    "1e400",
    "NaN",
    "Infinity",
    '{"nodes": [{"key": "a", "max_attempts": NaN}]}',
    "[" * 5000,
    "\u202e<script>alert(1)</script>",
    "%00",
    "a:b:c",
    "1:1:1 " * 3,
    "*",
    "user:ann",
]
BAD_BYTES = [b"\xff", b"\xb2", b"\xc0\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xe2\x82", b"a\xffb"]

texts = st.text(
    alphabet=st.characters(codec=None, categories=None, exclude_categories=()),  # surrogates included
    max_size=40,
)


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate as the three bytes a careless encoder sends


def bad_values(seed: str) -> st.SearchStrategy[bytes]:
    """A value for a field whose good value is ``seed``: something no form should take, or ``seed`` spoiled."""
    return st.one_of(
        st.sampled_from(BAD_TEXTS).map(_bytes),
        st.sampled_from(BAD_BYTES),
        texts.map(_bytes),
        st.integers(min_value=-(2**80), max_value=2**80).map(lambda n: str(n).encode()),
        st.integers(min_value=1, max_value=70_000).map(lambda n: b"9" * n),
        st.tuples(st.sampled_from(["²", "\x00", "\ud800", "\xff", "9" * 20]), st.booleans()).map(
            lambda spoil: _bytes(spoil[0] + seed if spoil[1] else seed + spoil[0])
        ),
    )


@dataclass(frozen=True)
class Body:
    content_type: str
    data: bytes


BOUNDARY = b"fuzzfuzzfuzz"


def _encoded(value: bytes, raw: bool) -> bytes:
    if raw:
        return value.replace(b"&", b"%26").replace(b"=", b"%3D").replace(b"#", b"%23")
    return quote_from_bytes(value).encode()


def urlencoded(pairs: list[tuple[str, bytes]], raw: bool) -> Body:
    """``raw``: the bytes as they are (a client that forgot to percent-encode), else percent-encoded."""
    data = b"&".join(_encoded(_bytes(name), raw) + b"=" + _encoded(value, raw) for name, value in pairs)
    return Body("application/x-www-form-urlencoded", data)


def multipart(pairs: list[tuple[str, bytes]], files: list[tuple[str, bytes, bytes]]) -> Body:
    parts = []
    for name, value in pairs:
        head = b'Content-Disposition: form-data; name="' + _bytes(name) + b'"'
        parts.append(b"--" + BOUNDARY + b"\r\n" + head + b"\r\n\r\n" + value + b"\r\n")
    for name, filename, content in files:
        head = b'Content-Disposition: form-data; name="' + _bytes(name) + b'"; filename="' + filename + b'"'
        head += b"\r\nContent-Type: application/octet-stream"
        parts.append(b"--" + BOUNDARY + b"\r\n" + head + b"\r\n\r\n" + content + b"\r\n")
    return Body(f"multipart/form-data; boundary={BOUNDARY.decode()}", b"".join(parts) + b"--" + BOUNDARY + b"--\r\n")


@st.composite
def bodies(draw: st.DrawFn, seed: dict[str, str], file_fields: list[str]) -> Body:
    """The seed form, broken: some fields dropped, some replaced or given twice, some added."""
    names = sorted(seed)
    pairs = [] if draw(st.integers(0, 9)) == 0 else [(name, _bytes(value)) for name, value in seed.items()]
    dropped = draw(st.sets(st.sampled_from(names), max_size=3))
    pairs = [(name, value) for name, value in pairs if name not in dropped]
    for name in draw(st.lists(st.sampled_from(names), max_size=3)):
        value = draw(bad_values(seed[name]))
        if draw(st.booleans()):  # given twice: the good value and a bad one
            pairs.append((name, value))
        else:
            pairs = [(n, value if n == name else v) for n, v in pairs] or [(name, value)]
    pairs += draw(st.lists(st.tuples(texts, bad_values("")), max_size=2))
    if draw(st.booleans()):
        return urlencoded(pairs, raw=draw(st.booleans()))
    files = draw(
        st.lists(
            st.tuples(
                st.sampled_from(file_fields or ["file"]),
                st.sampled_from([b"receipt.pdf", b"a\x00b", b"\xff\xb2.txt", b"../../etc/passwd", b""]),
                st.binary(max_size=200),
            ),
            max_size=1,
        )
    )
    return multipart(pairs, files)


HX = st.fixed_dictionaries(
    {},
    optional={
        "HX-Request": st.sampled_from(["true", "false", "", "²", "\x00"]) | texts,
        "HX-Target": st.sampled_from(["lease-panel", "notes", "rows", "#rows", "", "\x00"]) | texts,
        "HX-Trigger": texts,
        "HX-Current-URL": st.sampled_from(["http://testserver/", "\xff", ""]) | texts,
        "HX-Boosted": st.sampled_from(["true", "x"]),
        "HX-History-Restore-Request": st.sampled_from(["true", "x"]),
    },
)


def header_environ(headers: dict[str, str]) -> dict[str, str]:
    """As a WSGI server hands headers on: text decoded as Latin-1, so a lone surrogate arrives as its bytes (a NUL
    never arrives: the server refuses it, tests/test_raw_headers.py)."""
    return {
        "HTTP_" + name.upper().replace("-", "_"): _bytes(value).decode("latin-1").replace("\x00", "")
        for name, value in headers.items()
    }


@st.composite
def query_strings(draw: st.DrawFn, seed: dict[str, str]) -> str:
    """A query string of the pages' parameters and a few more, broken, as the WSGI environ holds it (Latin-1)."""
    names = sorted(seed)
    chosen = draw(st.lists(st.sampled_from(names) | texts, max_size=5))
    parts = []
    for name in chosen:
        value = draw(bad_values(seed.get(name, "")) | st.just(_bytes(seed.get(name, ""))))
        raw = draw(st.booleans())
        parts.append(_encoded(_bytes(name), raw) + b"=" + _encoded(value, raw))
    return b"&".join(parts).decode("latin-1")


# --- the scene ----------------------------------------------------------------------------------------------------


@dataclass
class Scene:
    personas: dict[str, Principal]
    post_routes: dict[str, list[str]]  # persona → every action URL (a POST route) with the scene's ids
    get_routes: dict[str, list[str]]  # persona → every page URL
    seeds: dict[str, dict[str, str]]  # action URL → the fields of its form as a page renders it, filled in
    params: dict[str, str]  # every query parameter the pages' links and GET forms carry
    file_fields: list[str]
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)  # (route, status) → how many
    seeded: set[tuple[str, int]] = field(default_factory=set)  # (route, status) of each unbroken form


# The bulk confirmation is the preview's (a GET with an operation and a filter).
PREVIEW = "/bulk/?op=cancel&state=human"


# Actions whose form, as their page renders it, the scene's operator or admin gets accepted (2xx, 3xx).
ACCEPTED_SEEDS = {
    "takeover-release",
    "takeover-replan",
    "task-cancel",
    "force-release",
    "operation-settle",
    "bulk",
    "task-notes",
    "api-token-issue",
    "task-grant",
    "password-reset",
}


def _url(pattern: URLPattern, ids: dict[str, object]) -> str:
    """The pattern's URL with the scene's row for each of its ids (an id it has no row for: 1)."""
    kwargs = {name: ids.get(name, 1) for name in pattern.pattern.converters}
    return reverse(str(pattern.name), kwargs=kwargs)


@pytest.fixture
def scene(
    make_task: Callable[..., Task], agent_lease: Any, clock: ControllableClock, settings: Any, tmp_path: Any
) -> Scene:
    """A task an operator took over, with an unknown operation and a stuck temp resource; another task whose lease
    an admin forced released (for the review); an API token, a saved view per person, a bulk run of the admin's."""
    settings.DATA_DIR = tmp_path  # a reviewed result's attachments: the test's own folder
    task, ann, op = taken_over(make_task, agent_lease)
    ada = person("ada", "admin")
    personas = {"operator": ann, "admin": ada}
    now = clock.now()
    temp = TempResource.objects.create(
        task=task, locator="staging/fuzz", status=TempResourceStatus.STUCK, created_at=now, retention_until=now
    )
    other = make_task()
    agent_lease(other)
    forced = lease_force_release(actor=ada, task_id=other.pk, justification=NOTE, impact=NOTE)
    token = api_token_issue(actor=ada, agent_id="agent-fuzz", kinds=["test"], projects=())[0]
    run = bulk_run_create(actor=ada, operation="cancel", reason=NOTE, seen=[Seen(other.pk, other.version, None)])
    ids: dict[str, object] = {
        "task_id": task.pk,
        "op_key": op.op_key,
        "temp_id": temp.pk,
        "forced_release_id": forced.pk,
        "token_id": token.pk,
        "run_id": run.pk,
        "user_id": person("bo", "operator").user.pk,  # not a persona's: a reset password would log them out
    }
    client = Client()
    pages = Pages()
    posts: dict[str, list[str]] = {}
    gets: dict[str, list[str]] = {}
    patterns = list(_patterns(get_resolver().url_patterns))
    posting: set[str] = set()  # the names of the patterns that take a POST (the others answer it 405)
    only_posting: set[str] = set()  # … and of those that answer a GET 405
    for name, who in personas.items():
        view = saved_view_save(owner=who.user, name="fuzz", screen="task-list", query="state=human")
        client.force_login(who.user)
        urls = {str(pattern.name): _url(pattern, ids | {"view_id": view.pk}) for pattern in patterns}
        if not posting:  # which methods a route takes is the route's, whoever asks
            posting = {route for route, url in urls.items() if answer(client, "post", url)[0] != 405}
            only_posting = {route for route in posting if answer(client, "get", urls[route])[0] == 405}
        posts[name] = [url for route, url in urls.items() if route in posting]
        gets[name] = [url for route, url in urls.items() if route not in only_posting]
        for url in [*gets[name], PREVIEW]:
            response = client.get(url)
            if not response.streaming:
                pages.read(url, response.content.decode(errors="replace"))
    # Each action's form as its page renders it, what a person types filled in (what no page holds: ``good``).
    good = {str(k): str(v) for k, v in form(task).items()} | {
        "username": "bo",
        "task": str(task.pk),
        "remote_id": "r-1",
        "agent_id": "agent-2",
        "kinds": "test",
        **{name: "" for name in ("remote_version", "count", "digest", "temp_locators", "projects")},
    }
    seeds = {}
    for url in {url for urls in posts.values() for url in urls}:
        found = pages.forms.get(url, {})
        seeds[url] = good | {k: v or good.get(k, NOTE) for k, v in found.items() if k != "csrfmiddlewaretoken"}
        if seeds[url].get("seen"):  # a bulk run is confirmed by typing how many tasks it changes, not a task's id
            seeds[url]["confirm"] = str(len(seeds[url]["seen"].split()))
    file_fields = [f"n-{key}-file" for key in task.nodes.values_list("key", flat=True)]
    # The cursors: a page links them only when there is a next page.
    params = {"after": "", "before": ""} | pages.params
    return Scene(personas, posts, gets, seeds, params, file_fields)


@contextlib.contextmanager
def rolled_back() -> Iterator[None]:
    """The example's writes undone after it: every example meets the same scene."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def answer(client: Client, method: str, url: str, **request: Any) -> tuple[int | str, list[str]]:
    """The status (or the server error the request raised) and the tables it changed. The client's cookies are put
    back after it, as its writes are: a password reset or a logout rolled back must not log the next example out."""
    before, cookies = every_table(), copy.deepcopy(client.cookies)
    try:
        with rolled_back():
            response = getattr(client, method)(url, **request)
            after = every_table()
    except Exception:
        return traceback.format_exc(limit=-6), []
    finally:
        client.cookies = cookies
    assert not response.get("Location", "").startswith(reverse("login")), f"logged out: {response['Location']}"
    return response.status_code, changed(before, after)


def post_fuzzed(client: Client, url: str, scene: Scene, fuzz: settings = POST_FUZZ) -> None:
    status, _ = answer(client, "post", url, data=scene.seeds[url])
    scene.seeded.add((_route(url), status if isinstance(status, int) else 500))

    @fuzz
    @given(body=bodies(scene.seeds[url], scene.file_fields), headers=HX)
    def post(body: Body, headers: dict[str, str]) -> None:
        status, tables = answer(
            client, "post", url, data=body.data, content_type=body.content_type, **header_environ(headers)
        )
        assert isinstance(status, int) and status < 500, status
        scene.answers[_route(url), status] += 1
        if 400 <= status < 500:
            assert not tables, f"refused with {status} but changed {tables}"

    post()


def get_fuzzed(client: Client, url: str, scene: Scene) -> None:
    @settings(FUZZ, max_examples=GET_EXAMPLES)
    @given(query=query_strings(scene.params), headers=HX)
    def get(query: str, headers: dict[str, str]) -> None:
        status, tables = answer(client, "get", url, QUERY_STRING=query, **header_environ(headers))
        assert isinstance(status, int) and status < 500, status
        scene.answers[_route(url), status] += 1
        assert not tables, f"a read ({status}) changed {tables}"

    get()


def fuzz_every(scene: Scene, routes: dict[str, list[str]], fuzzed: Callable[[Client, str, Scene], None]) -> list[str]:
    """Each route fuzzed as each persona; the failures of all of them (each shrunk to its smallest example)."""
    failures = []
    client = Client()
    for name, persona in scene.personas.items():
        client.force_login(User.objects.get(pk=persona.user.pk))  # as stored: its session hash is the current one
        for url in routes[name]:
            try:
                fuzzed(client, url, scene)
            except Exception as failure:
                failures.append(f"{url} as the {name}: {failure}")
    return failures


def test_every_console_action_answers_bad_input_below_500_and_a_refusal_writes_nothing(scene: Scene) -> None:
    assert len(scene.post_routes["admin"]) >= 25, scene.post_routes
    failures = fuzz_every(scene, scene.post_routes, post_fuzzed)
    assert not failures, "\n\n".join(failures)
    # The forms the fuzzing breaks are forms that pass: a fuzzer that never got past the form would prove little.
    accepted = {route for (route, status) in scene.seeded if status < 400}
    assert accepted >= ACCEPTED_SEEDS, sorted(ACCEPTED_SEEDS - accepted)
    print(reached(scene))


def test_every_console_page_reads_bad_parameters_and_headers_below_500_and_writes_nothing(scene: Scene) -> None:
    assert len(scene.get_routes["admin"]) >= 20, scene.get_routes
    assert {"after", "before", "q", "state"} <= scene.params.keys(), scene.params
    failures = fuzz_every(scene, scene.get_routes, get_fuzzed)
    assert not failures, "\n\n".join(failures)
    print(reached(scene))


def reached(scene: Scene) -> str:
    """What the run was answered, by route and status (shown with -s)."""
    return "\n".join(f"  {route}: {status} x{n}" for (route, status), n in sorted(scene.answers.items()))


def _route(url: str) -> str:
    return str(resolve(url).url_name)


def test_the_fuzzing_finds_a_server_error_planted_in_a_form(
    make_task: Callable[..., Task], agent_lease: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The net above is only as good as its reach: a note form that fails on any text past ASCII (as ``int()`` fails
    on "²") is found, and named by its route."""
    task, ann, _op = taken_over(make_task, agent_lease)
    url = reverse("task-notes", args=[task.pk])

    def ascii_only(form: NoteForm) -> str:
        text: str = form.cleaned_data["text"]
        text.encode("ascii")  # the planted fault: UnicodeEncodeError, a server error
        return text

    monkeypatch.setattr(NoteForm, "clean_text", ascii_only, raising=False)
    scene = Scene({"operator": ann}, {"operator": [url]}, {}, {url: {"text": NOTE}}, {}, [])
    client = Client()
    client.force_login(ann.user)
    with pytest.raises(Exception, match="UnicodeEncodeError"):
        post_fuzzed(client, url, scene, settings(FUZZ, max_examples=40, derandomize=True))
