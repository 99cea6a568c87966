"""No named refusal reaches the browser as a server error, on any console action URL (read from console.urls, so an
action added later is covered without editing this file):

- every named refusal the project defines (TaskError and its kin, LeaseError, PermissionDenied, the retention and
  hygiene errors) raised inside every action that accepts a POST answers with the status console/errors.py maps its
  code to, or the page it redirects to, and shows its sentence — the view's own handling or, for a refusal no view
  caught, console.middleware.RefusalMiddleware;
- a person whose takeover lease lapsed while the pages were open posts every action with a form that would
  otherwise pass: nothing answers 5xx, and every action that writes under the lease writes nothing.
"""

import html
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.converters import IntConverter

import console.views
from audit.errors import Refused
from console import access
from console.errors import SENTENCES, message_for, status_for
from leases.clock import ControllableClock
from leases.errors import LeaseError
from leases.services import lease_open
from tasks.core.errors import TaskError
from tasks.core.parsing import IdConverter
from tasks.models import Operation, Task
from tests.conftest import person, snapshot
from tests.test_console_reconcile import NOTE, taken_over, version

pytestmark = pytest.mark.django_db

# Not the console's actions: the login pages (their own forms), the agent API and Django's admin (their own
# errors), the metrics and health endpoints (no session).
NOT_CONSOLE = {"login", "logout", "password_change", "password_change_done", "metrics", "healthz", "readyz"}
EXPIRED_AGO = 44


def _patterns(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[URLPattern]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            if str(entry.pattern) not in ("admin/", "api/v1/"):
                yield from _patterns(entry.url_patterns, prefix + str(entry.pattern))
        elif entry.name and entry.name not in NOT_CONSOLE:
            yield entry


def console_url(pattern: URLPattern, task: Task, op: Operation) -> str:
    kwargs: dict[str, object] = {}
    for name, converter in pattern.pattern.converters.items():
        if name == "task_id":
            kwargs[name] = task.pk
        elif name == "op_key":
            kwargs[name] = op.op_key
        else:
            kwargs[name] = 1 if isinstance(converter, IntConverter | IdConverter) else "x"
    return reverse(str(pattern.name), kwargs=kwargs)


def console_names() -> list[str]:
    return sorted({str(p.name) for p in _patterns(get_resolver().url_patterns)})


def _subclasses(base: type) -> set[type]:
    found: set[type] = set()
    sub: type
    for sub in base.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def every_refusal() -> list[type[Exception]]:
    """Every named refusal class of the project (their modules loaded first)."""
    for package in ("tasks", "leases", "retention", "audit"):
        for found in pkgutil.walk_packages(importlib.import_module(package).__path__, prefix=f"{package}."):
            if not found.ispkg and ".migrations." not in found.name and ".management." not in found.name:
                importlib.import_module(found.name)
    classes = _subclasses(Refused) | _subclasses(LeaseError) | {Refused, TaskError, LeaseError}
    return sorted(classes, key=lambda cls: (cls.__module__, cls.__name__))


def instance(cls: type[Exception]) -> Exception:
    """A refusal of ``cls`` as a service raises it (their constructors differ: the message and no details)."""
    error = cls.__new__(cls)
    Exception.__init__(error, f"refused for the test: {cls.__name__}")
    error.details = {}  # type: ignore[attr-defined]
    return error


def text(response: Any) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", response.content.decode())))


def form(task: Task) -> dict[str, Any]:
    """A form every action would accept, but for what the test makes it refuse."""
    lease = lease_open(task.pk)
    return {
        "version": version(task),
        "expected_version": version(task),
        "epoch": lease.epoch if lease else 1,
        "renewal_seq": lease.renewal_seq if lease else 0,
        "confirm": str(task.pk),
        "reason": NOTE,
        "justification": NOTE,
        "impact": NOTE,
        "resolution": "not_done",
        "stage": "confirm",
        "decision": "resume_agent",
        "node_key": "a",
        "approving": "sha256:" + "0" * 64,
        "revision_id": 1,
        "plan": '{"nodes": []}',
        "note": NOTE,
    }


@pytest.fixture
def scene(make_task: Callable[..., Task], agent_lease: Any, clock: ControllableClock) -> tuple[Task, Any, Operation]:
    task, ann, op = taken_over(make_task, agent_lease)
    return task, ann, op


def post_routes(client: Client, task: Task, op: Operation) -> list[str]:
    """Every console URL that accepts a POST (the others answer 405), as the given client sees it."""
    found = []
    for pattern in _patterns(get_resolver().url_patterns):
        url = console_url(pattern, task, op)
        if client.post(url, {}).status_code != 405:
            found.append(url)
    return found


def test_the_console_has_post_routes_of_every_screen(client: Client, scene) -> None:
    task, _ann, op = scene
    client.force_login(person("ada", "admin").user)
    routes = post_routes(client, task, op)
    for expected in ("/settle/", "/query/", "/takeover/submit/", "/replan/accept/", "/cancel/", "/roles/grant/"):
        assert any(expected in route for route in routes), expected
    assert len(routes) >= 25


def test_every_named_refusal_raised_in_every_action_is_a_4xx_with_its_sentence(
    client: Client, scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each refusal class is raised where every action starts: asking who the person is (console.access.principal,
    and each view module's own import of it)."""
    task, _ann, op = scene
    admin = person("ada", "admin")
    client.force_login(admin.user)
    routes = post_routes(client, task, op)
    modules = [importlib.import_module(m.name) for m in pkgutil.iter_modules(console.views.__path__, "console.views.")]
    raising: list[Exception] = []

    def refuse(_request: Any) -> Any:
        raise raising[0]

    for module in [access, *modules]:
        if hasattr(module, "principal"):
            monkeypatch.setattr(module, "principal", refuse)
    failures = []
    for cls in every_refusal():
        error = instance(cls)
        raising[:] = [error]
        sentence = message_for(error)
        for url in routes:
            response = client.post(url, form(task), headers={"HX-Request": "true"} if "lease" in url else {})
            if response.status_code == 303:  # post/redirect/get: the page it goes to says it
                response = client.get(response["Location"])
                shown = response.status_code < 500 and sentence in text(response)
            else:
                shown = response.status_code == status_for(error) and sentence in text(response)
            if not shown:
                failures.append(f"{cls.__name__} at {url}: {response.status_code}")
    assert not failures, failures[:20]


def test_every_code_has_one_status_and_one_sentence() -> None:
    for cls in every_refusal():
        error = instance(cls)
        code = str(getattr(cls, "code", ""))
        assert 400 <= status_for(error) < 500, code
        if issubclass(cls, TaskError | LeaseError):
            assert code in SENTENCES, code


def test_with_a_lapsed_lease_no_action_is_a_server_error_and_none_writes_under_it(
    client: Client, scene, clock: ControllableClock
) -> None:
    """The person's takeover lease lapsed while their pages were open; they post every action with a form that would
    otherwise pass (the version and epoch their page showed)."""
    task, ann, op = scene
    lease = lease_open(task.pk)
    assert lease is not None
    data = form(task)
    clock.set(lease.expires_at + timedelta(seconds=EXPIRED_AGO))
    client.force_login(ann.user)
    routes = post_routes(client, task, op)
    under_the_lease = ("/settle/", "/query/", "/takeover/submit/", "/takeover/approve/", "/replan/", "/renew/")
    for url in routes:
        before = snapshot()
        response = client.post(url, data)
        assert response.status_code < 500, (url, response.status_code)
        if any(part in url for part in under_the_lease):
            assert snapshot() == before, f"{url} wrote under a lapsed lease"
            assert response.status_code in (303, 400, 403, 409), (url, response.status_code)


def test_a_named_refusal_on_any_console_page_read_is_a_4xx_with_its_sentence(
    client: Client, scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same net under every page a person reads (GET), for a refusal of each status."""
    task, _ann, op = scene
    client.force_login(person("ada", "admin").user)
    urls = [console_url(p, task, op) for p in _patterns(get_resolver().url_patterns)]
    modules = [importlib.import_module(m.name) for m in pkgutil.iter_modules(console.views.__path__, "console.views.")]
    samples = {cls.__name__: cls for cls in every_refusal()}
    chosen = [samples[name] for name in ("PermissionDenied", "TaskNotFound", "PayloadTooLarge", "LeaseExpired")]
    raising: list[Exception] = []

    def refuse(_request: Any) -> Any:
        raise raising[0]

    for module in [access, *modules]:
        if hasattr(module, "principal"):
            monkeypatch.setattr(module, "principal", refuse)
    for cls in chosen:
        error = instance(cls)
        raising[:] = [error]
        for url in urls:
            response = client.get(url, headers={"HX-Request": "true"} if url.endswith("/lease/") else {})
            assert response.status_code < 500, (cls.__name__, url, response.status_code)
            if response.status_code >= 400 and response.status_code != 405:  # 405: an action, posted above
                assert response.status_code == status_for(error), (cls.__name__, url)
                assert message_for(error) in text(response), (cls.__name__, url)
