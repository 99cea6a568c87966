"""RECKON_TRACES=otlp (observability/tracing.py): the OTLP exporter is an optional extra ("otlp" in pyproject.toml,
not installed by ``uv sync --frozen``). Without it a process asked to export refuses to start, naming the package and
the extra; with it (``uv sync --frozen --extra otlp``) spans reach an OTLP/HTTP collector — here a stand-in that
records what is posted to /v1/traces."""

import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPORTER = "opentelemetry.exporter.otlp.proto.http"


def _installed() -> bool:
    try:
        return importlib.util.find_spec(EXPORTER) is not None
    except ModuleNotFoundError:
        return False


def start(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = os.environ | {"DJANGO_SETTINGS_MODULE": "console.settings", "RECKON_TRACES": "otlp"} | env
    return subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(_installed(), reason="the otlp extra is installed here")
def test_without_the_exporter_a_process_refuses_to_start_naming_the_package_and_the_extra() -> None:
    run = start("import django; django.setup(); print('started')")
    assert run.returncode != 0 and "started" not in run.stdout
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: RECKON_TRACES=otlp needs the package")
    assert "opentelemetry-exporter-otlp-proto-http" in last and "--extra otlp" in last


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """An OTLP/HTTP collector's stand-in: answers 200 to every POST and keeps (path, body)."""
    posted: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append((self.path, self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", posted
    finally:
        server.shutdown()
        server.server_close()


SPAN = """
import django
django.setup()
from opentelemetry import trace
from observability import tracing
assert tracing.enabled()
with tracing.tracer().start_as_current_span("connector.submit") as span:
    span.set_attribute(tracing.TASK_ID, 7)
    span.set_attribute(tracing.TASK_VERSION, 12)
    span.set_attribute(tracing.OP_KEY, "rk-otlp-test-0")
trace.get_tracer_provider().shutdown()  # the batch processor flushes (as at a process's exit)
"""


@pytest.mark.skipif(not _installed(), reason="the otlp extra is not installed (uv sync --frozen --extra otlp)")
def test_with_the_exporter_spans_reach_the_collector(collector: tuple[str, list[tuple[str, bytes]]]) -> None:
    url, posted = collector
    run = start(SPAN, OTEL_EXPORTER_OTLP_ENDPOINT=url, OTEL_SERVICE_NAME="reckon-test")
    assert run.returncode == 0, run.stderr
    [(path, body)] = posted
    assert path == "/v1/traces"
    for text in (b"connector.submit", b"reckon.op_key", b"rk-otlp-test-0", b"reckon.task_id", b"reckon-test"):
        assert text in body, text
