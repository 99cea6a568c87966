"""The production web server: ``./dev serve`` runs the deployment checks, migrate and collectstatic, then gunicorn
with console/gunicorn.conf.py — several worker processes serving the console (its CSS from WhiteNoise, hashed and
compressed) and the agent API against the test database. Requests land on more than one worker, and SIGTERM stops
the master and every worker after the request in flight is answered. ``./dev serve`` refuses to start without a
real secret key, or with DEBUG on."""

import base64
import importlib.util
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.hashers import make_password

from api.tokens import api_token_issue
from harness.killmatrix import database_url
from harness.ports import free_port
from harness.wait_for import alive
from tasks.engine.plans import task_create
from tasks.models import Task
from tests.conftest import chain_plan, person
from tests.simulator_fixture import ROOT

WORKERS = 2
START_SECONDS = 120  # deployment checks, migrate, collectstatic (~200 files, hashed and gzipped) and the boot
STOP_SECONDS = 40  # more than the config's graceful_timeout (25 s)
CONFIG = ROOT / "console" / "gunicorn.conf.py"


def _wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Polls ``condition``; the bound only turns a hang into a failure, no assertion is about time."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g}s")
        time.sleep(0.1)


@dataclass
class Served:
    """``./dev serve`` running as a process (after its exec, gunicorn's master itself) and its output."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def access_pids(self, agent: str) -> list[int]:
        """The worker pids of the access-log lines of requests sent with User-Agent ``agent``."""
        return [int(pid) for pid in re.findall(rf'"{re.escape(agent)}" pid=<(\d+)>', self.output())]

    def booted_workers(self) -> set[int]:
        return {int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", self.output())}


def _serve(tmp_path: Path, extra_env: dict[str, str], *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_DEBUG", "DJANGO_SECRET_KEY")} | extra_env
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603
            [str(ROOT / "dev"), "serve", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the cleanup can stop whatever is left of it
        )
    return process, log


@pytest.fixture
def served(transactional_db: None, tmp_path: Path) -> Iterator[Served]:
    """Two workers on a free port, with the test database; static files collected into tmp_path. Each worker holds
    one connection at a time here (``--worker-connections 1``, through GUNICORN_CMD_ARGS, which gunicorn applies
    over the config file): a connection held open on one worker makes the next go to the other, so the test can
    show two processes serving without relying on how the kernel happens to spread connections."""
    port = free_port()
    env = {
        "DATABASE_URL": database_url(),
        "RECKON_DATA_DIR": str(tmp_path / "data"),
        "RECKON_BIND": f"127.0.0.1:{port}",
        "RECKON_WEB_WORKERS": str(WORKERS),
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        # ./dev serve runs in the production mode: everything a deployment must set (docs/operations.md, Secure
        # defaults).
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "RECKON_RETENTION_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_ANCHOR_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_ANCHOR_PATH": str(tmp_path / "anchors" / "heads.log"),
        "GUNICORN_CMD_ARGS": "--worker-connections 1",
    }
    process, log = _serve(tmp_path, env)
    server = Served(process=process, url=f"http://127.0.0.1:{port}", log=log)
    try:
        _wait_until(
            lambda: not alive(process.pid) or (len(server.booted_workers()) >= WORKERS and _answers(server.url)),
            START_SECONDS,
            "gunicorn answering with its workers booted",
        )
        assert alive(process.pid), f"./dev serve ended:\n{server.output()}"
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        for pid in server.booted_workers():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    try:
        return get(url, "/login/").status_code == 200
    except httpx.TransportError:
        return False


def get(base: str, path: str, agent: str = "reckon-test", **headers: str) -> httpx.Response:
    """One request on a connection of its own, closed after the answer (no keep-alive holding a worker's slot)."""
    with httpx.Client(base_url=base, timeout=30) as client:
        return client.get(path, headers={"User-Agent": agent, "Connection": "close", **headers})


class _Assets(HTMLParser):
    """Every src and href of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, str]] = []  # (tag, rel, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for name in ("src", "href"):
            if found.get(name):
                self.links.append((tag, found.get("rel") or "", str(found[name])))


def stylesheets(html: str) -> list[str]:
    parser = _Assets()
    parser.feed(html)
    return [url for tag, rel, url in parser.links if tag == "link" and rel == "stylesheet"]


def test_gunicorn_serves_the_console_and_the_api_from_several_workers_and_stops_on_sigterm(served: Served) -> None:
    # The console's login page, its stylesheets collected with hashed names and served by WhiteNoise, compressed.
    login = get(served.url, "/login/")
    assert login.status_code == 200 and "text/html" in login.headers["content-type"]
    sheets = stylesheets(login.text)
    assert sheets, login.text
    for sheet in sheets:
        assert re.fullmatch(r"/static/console/[\w-]+\.[0-9a-f]{12}\.css", sheet), sheet
        css = get(served.url, sheet, **{"Accept-Encoding": "gzip"})
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert css.headers["content-encoding"] == "gzip"  # collectstatic made the .gz once
        assert "immutable" in css.headers["cache-control"]  # the name changes with the content
        assert css.text.strip()
    assert get(served.url, "/static/console/no-such-file.css").status_code == 404

    # A person logs in to the console: the CSRF token and the session work whichever worker answers each request
    # (the session lives in the database, the secret key is the same in every worker).
    admin = person("root", "admin")
    password = secrets.token_urlsafe(16)
    admin.user.password = make_password(password, hasher="pbkdf2_sha256")  # the server's hasher, not the tests'
    admin.user.save(update_fields=["password"])
    with httpx.Client(base_url=served.url, timeout=30, headers={"Connection": "close"}) as browser:
        form = browser.get("/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert csrf, form.text
        fields = {"csrfmiddlewaretoken": csrf.group(1), "username": "root", "password": password}
        logged_in = browser.post("/login/", data=fields, headers={"Referer": f"{served.url}/login/"})
        assert logged_in.status_code == 302 and "/login/" not in logged_in.headers["location"], logged_in.text
        for _ in range(WORKERS + 1):
            page = browser.get("/")
            assert page.status_code == 200 and "/login/" not in str(page.url), page.status_code

    # The agent API: its OpenAPI document, and a read with a token (and without one, refused).
    document = get(served.url, "/api/v1/openapi.json")
    assert document.status_code == 200 and document.json()["openapi"].startswith("3.1")
    token = api_token_issue(actor=admin, agent_id="agent-web", kinds=("copy",), projects=())[1]
    task = task_create(kind="copy", title="served by gunicorn", plan=chain_plan("a", "b"), created_by="agent:web")
    read = get(served.url, f"/api/v1/tasks/{task.pk}", Authorization=f"Bearer {token}")
    assert read.status_code == 200, read.text
    assert read.json()["id"] == task.pk and read.headers["etag"] == f'"{Task.objects.get(pk=task.pk).version}"'
    refused = get(served.url, f"/api/v1/tasks/{task.pk}")
    assert refused.status_code == 401 and refused.headers["content-type"] == "application/problem+json"

    # Two workers serve: a request held half-sent occupies the worker that took it, so the next is the other's.
    held = HeldRequest.send(served.url, f"/api/v1/tasks/{task.pk}", token, agent="held-request")
    other = get(served.url, "/api/v1/openapi.json", agent="other-request")
    assert other.status_code == 200
    _wait_until(lambda: len(served.access_pids("other-request")) == 1, 10, "the access log line of other-request")

    # SIGTERM while the held request is still in flight: the master stops its workers gracefully, the held request
    # is answered all the same, then every process ends.
    served.process.send_signal(signal.SIGTERM)
    _wait_until(lambda: "Handling signal: term" in served.output(), 10, "gunicorn handling SIGTERM")
    status, body = held.finish()
    assert status == 200, body
    assert served.process.wait(STOP_SECONDS) == 0, served.output()

    [held_pid] = served.access_pids("held-request")
    [other_pid] = served.access_pids("other-request")
    workers = served.booted_workers()
    assert held_pid != other_pid and {held_pid, other_pid} <= workers
    assert served.process.pid not in workers  # the master serves nothing itself
    for pid in workers:
        assert not alive(pid), f"worker {pid} outlived the master"
        assert f"Worker exiting (pid: {pid})" in served.output()
    assert "Shutting down: Master" in served.output()


@dataclass
class HeldRequest:
    """A connection whose request stopped before its last header: the worker thread that took it waits for the
    rest, and its worker takes no other connection meanwhile (one connection per worker here)."""

    conn: socket.socket
    token: str

    @classmethod
    def send(cls, url: str, path: str, token: str, agent: str) -> "HeldRequest":
        host, port = url.removeprefix("http://").split(":")
        conn = socket.create_connection((host, int(port)), timeout=30)
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {agent}\r\n".encode())
        return cls(conn, token)

    def finish(self) -> tuple[int, str]:
        """The rest of the request; the answer's status and body."""
        with self.conn:
            self.conn.sendall(f"Authorization: Bearer {self.token}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := self.conn.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body.decode(errors="replace")


# --- ./dev serve refuses to run insecurely ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "needs DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "reckon-dev-only-not-secret"}, "needs DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "a" * 50, "DJANGO_DEBUG": "1"}, "runs with DEBUG off"),
    ],
    ids=["no-secret-key", "the-development-key", "debug-on"],
)
def test_serve_refuses_without_a_secret_key_or_with_debug_on(tmp_path: Path, env: dict[str, str], says: str) -> None:
    port = free_port()
    env = {"RECKON_DATA_DIR": str(tmp_path / "data"), "RECKON_BIND": f"127.0.0.1:{port}"} | env
    process, log = _serve(tmp_path, env)
    assert process.wait(120) == 1
    output = log.read_text()
    assert says in output
    assert "== deployment checks" not in output and "Starting gunicorn" not in output
    assert not (tmp_path / "data" / "static").exists()  # nothing collected, nothing migrated, nothing started


# --- the configuration ------------------------------------------------------------------------------------------


def _config(monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    for name in ("RECKON_BIND", "RECKON_WEB_WORKERS", "RECKON_WEB_THREADS", "RECKON_WEB_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("reckon_gunicorn_conf", CONFIG)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_defaults_to_loopback_and_two_workers_a_core_plus_one_capped(monkeypatch) -> None:
    config = _config(monkeypatch)
    assert config.bind == ["127.0.0.1:8000"] and config.worker_class == "gthread"
    assert [config.default_workers(cores) for cores in (1, 2, 3, 4, 64)] == [3, 5, 7, 8, 8]
    assert config.workers == config.default_workers(len(os.sched_getaffinity(0)))
    assert config.accesslog == "-" and "%(p)s" in config.access_log_format
    assert config.graceful_timeout < config.timeout + 30 and not config.preload_app


def test_the_config_takes_its_bind_and_sizes_from_the_environment(monkeypatch) -> None:
    config = _config(monkeypatch, RECKON_BIND="0.0.0.0:9000, unix:/run/reckon.sock", RECKON_WEB_WORKERS="12")
    assert config.bind == ["0.0.0.0:9000", "unix:/run/reckon.sock"] and config.workers == 12
    with pytest.raises(ValueError, match="RECKON_WEB_THREADS"):
        _config(monkeypatch, RECKON_WEB_THREADS="0")
