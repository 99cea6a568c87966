"""Headers as raw bytes over a real socket, to a real server process (gunicorn with the deployment's configuration,
console/gunicorn.conf.py, on the test database): what the test client cannot send, because it takes headers as text.

An agent's write whose ``If-Match``, ``Reckon-Lease``, ``Idempotency-Key`` or ``Authorization`` holds a Latin-1 byte
(0xB2 is "²" in Latin-1, as a WSGI server decodes it), 0xFF, a superscript in UTF-8, a NUL or another control
character, digits past 64 bits, or an over-long value: each is answered 4xx — a problem document of the API, or
gunicorn's own 400 for what never reaches Django (a NUL, a header past its size limit) — never a 5xx, and nothing is
written. The same request with good headers is then accepted, so the refusals were the headers'. One server for the
module: it starts once (a second or two)."""

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from api.errors import CONTENT_TYPE
from api.tokens import api_token_issue
from harness.killmatrix import database_url
from harness.ports import free_port
from leases.services import lease_acquire
from tasks.engine.plans import task_create
from tests.conftest import chain_plan, person, snapshot
from tests.simulator_fixture import ROOT
from tests.test_agent_e2e import _stop as stop

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "copy"
AGENT = "agent-raw"
START_SECONDS = 60

# A header value as bytes on the wire → what the server must answer with: "api" (a problem document, 4xx) or
# "server" (gunicorn's own 400: the request never reaches Django).
BAD_VALUES: dict[str, tuple[bytes, str]] = {
    "latin-1 superscript two": (b"\xb2", "api"),
    "latin-1 y with diaeresis": (b"\xff", "api"),
    "a quoted latin-1 byte": (b'"\xb2"', "api"),
    "digits then a latin-1 byte": (b"12\xb2", "api"),
    "utf-8 superscript two": ("²".encode(), "api"),
    "utf-8 superscripts one two": ("¹²".encode(), "api"),
    "utf-8 arabic-indic digits": ("١٢".encode(), "api"),
    "digits past 64 bits": (b"9" * 30, "api"),  # a version or a lease id: no column holds it (a key may be digits)
    "a long value": (b"7" * 4000, "api"),
    "a NUL": (b"1\x00", "server"),
    "a control character": (b"1\x01", "server"),
    "over-long": (b"9" * 9000, "server"),  # past gunicorn's limit_request_field_size (8190)
}
HEADERS = ("If-Match", "Reckon-Lease", "Idempotency-Key", "Authorization")


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def _send(port: int, request: bytes) -> Answer:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(lines[0].split()[1]), headers, body)


def raw(port: int, method: str, path: str, headers: dict[str, bytes], body: bytes = b"") -> Answer:
    """One request as these bytes exactly: no client library between the test and the socket."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [b"Content-Type: application/json", f"Content-Length: {len(body)}".encode()]
    lines += [name.encode() + b": " + value for name, value in headers.items()]
    return _send(port, b"\r\n".join(lines) + b"\r\n\r\n" + body)


@pytest.fixture(scope="module")
def port(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """gunicorn with the deployment's configuration, one worker, on the test database: one for the module."""
    port, log = free_port(), tmp_path_factory.mktemp("web") / "web.log"
    env = os.environ | {
        "DATABASE_URL": database_url(),
        "RECKON_BIND": f"127.0.0.1:{port}",
        "RECKON_WEB_WORKERS": "1",
        "RECKON_LOG_LEVEL": "WARNING",
    }
    command = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "console" / "gunicorn.conf.py")]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                raw(port, "GET", "/api/v1/tasks", {})  # any answer (401) means it serves
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gunicorn did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield port
    finally:
        stop(process)


@dataclass(frozen=True)
class Write:
    """An intent for node ``a`` that the server would accept with ``good`` headers."""

    path: str
    good: dict[str, bytes]
    body: bytes


@pytest.fixture
def write(port: int) -> Write:
    _, token = api_token_issue(actor=person("root", "admin"), agent_id=AGENT, kinds=[KIND], projects=())
    task = task_create(kind=KIND, title="raw headers", plan=chain_plan("a"), created_by=f"agent:{AGENT}")
    lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id=AGENT)
    task.refresh_from_db()
    good = {
        "Authorization": f"Bearer {token}".encode(),
        "Reckon-Lease": str(lease.pk).encode(),
        "If-Match": f'"{task.version}"'.encode(),
        "Idempotency-Key": b"raw-headers-1",
    }
    seen = raw(port, "GET", f"/api/v1/tasks/{task.pk}", {"Authorization": good["Authorization"]})
    assert seen.status == 200, seen  # and the token's last-use hint is written now, not by a case below
    return Write(f"/api/v1/tasks/{task.pk}/operations", good, json.dumps({"node_key": "a"}).encode())


def _verdict(answer: Answer, expected: str) -> str | None:
    """What is wrong with ``answer`` to a request with a bad header (None: nothing)."""
    if not 400 <= answer.status < 500:
        return f"answered {answer.status}: {answer.body[:300]!r}"
    problem = answer.headers.get("content-type") == CONTENT_TYPE
    if expected == "api" and not problem:
        return f"answered {answer.status} {answer.headers.get('content-type')}, not a problem document"
    if problem and not json.loads(answer.body).get("code"):
        return f"a problem document without a code: {answer.body[:300]!r}"
    return None


@pytest.mark.parametrize("header", HEADERS)
def test_a_header_of_bytes_no_header_should_hold_is_a_4xx_and_writes_nothing(
    port: int, write: Write, header: str
) -> None:
    before = snapshot()
    wrong = []
    for name, (value, expected) in BAD_VALUES.items():
        if header == "Idempotency-Key" and name == "digits past 64 bits":
            continue
        sent = b"Bearer " + value if header == "Authorization" else value
        answer = raw(port, "POST", write.path, write.good | {header: sent}, write.body)
        if (problem := _verdict(answer, expected)) is not None:
            wrong.append(f"{header}: {name}: {problem}")
    assert not wrong, "\n".join(wrong)
    assert snapshot() == before, f"a request with a bad {header} wrote"

    accepted = raw(port, "POST", write.path, write.good, write.body)
    assert accepted.status == 201, accepted  # the same request with good headers: the refusals were the header's
    assert snapshot() != before
