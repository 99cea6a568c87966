"""OpenTelemetry traces: a request (console or agent API) → the Celery wake-up it queues → each connector call, one
trace, with the task id, the task version and the op key as attributes.

Off unless the environment asks (``RECKON_TRACES``): then nothing is configured, the OpenTelemetry API is a no-op
and this costs one attribute check per request. On:

    RECKON_TRACES=console      spans as JSON lines on stderr (a developer's look)
    RECKON_TRACES=file:<path>  spans as JSON lines appended to <path> (the tests read it)
    RECKON_TRACES=otlp         spans to an OTLP/HTTP collector (OTEL_EXPORTER_OTLP_ENDPOINT, the standard
                               variables), with the package opentelemetry-exporter-otlp-proto-http installed (the
                               optional extra "otlp": ``uv sync --frozen --extra otlp``; not installed by default).
                               Without it the process refuses to start (ImproperlyConfigured naming the package),
                               never a failure mid-request.

How the pieces join, without the domain knowing: a middleware opens a server span per request (the task id from
the URL); Celery's ``before_task_publish`` puts the current trace context in the message headers (W3C traceparent)
and ``task_prerun`` continues it in the worker as the span of ``tasks.drive_task(task_id, seen_version)``; every
connector a registered task kind builds is wrapped (``TracedConnector``), one span per remote call, carrying the
op key. Spans carry ``reckon.task_id``, ``reckon.task_version``, ``reckon.op_key``; each state change a span's code
made (an event appended to the task's log) is an event on that span with the version it made and its op key.
"""

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from observability.logs import _BOUND, state_change_line

TRACER_NAME = "reckon"
TASK_ID, TASK_VERSION, OP_KEY = "reckon.task_id", "reckon.task_version", "reckon.op_key"
# A scrape every few seconds would bury the traces that matter.
UNTRACED_PATHS = frozenset({"/metrics"})
_enabled = False
_configured = False


def enabled() -> bool:
    return _enabled


def _one_line(span: Any) -> str:
    return str(span.to_json(indent=None)) + "\n"


def processor_for(setting: str) -> SpanProcessor | None:
    """The span processor ``RECKON_TRACES`` names; None when tracing is off."""
    if not setting:
        return None
    if setting == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr, formatter=_one_line))
    if setting.startswith("file:"):
        out = open(setting.removeprefix("file:"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (process-long)
        return SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_one_line))
    if setting == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as missing:
            raise ImproperlyConfigured(
                "RECKON_TRACES=otlp needs the package opentelemetry-exporter-otlp-proto-http, which is not installed:"
                " install the optional extra (uv sync --frozen --extra otlp), or unset RECKON_TRACES"
            ) from missing
        exporter: SpanExporter = OTLPSpanExporter()
        return BatchSpanProcessor(exporter)
    raise ImproperlyConfigured(f"RECKON_TRACES must be console, file:<path> or otlp, not {setting!r}")


def configure(processor: SpanProcessor | None) -> None:
    """Install a tracer provider with ``processor`` as the process's global one (once: OpenTelemetry allows one
    global provider, so a second processor is ignored) and make spans."""
    global _enabled, _configured
    if processor is None:
        return
    if not _configured:
        service = os.environ.get("OTEL_SERVICE_NAME", "reckon")
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _configured = True
    _enabled = True


def disable() -> None:
    """Stop making spans (the provider stays): a test that traced leaves the next ones untraced."""
    global _enabled
    _enabled = False


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def _task_attributes() -> dict[str, Any]:
    """The task the code runs for, as the log context knows it (observability.logs.bound, the wake-up's binding)."""
    bound = _BOUND.get()
    names = {"task_id": TASK_ID, "task_version": TASK_VERSION, "op_key": OP_KEY}
    return {names[k]: v for k, v in bound.items() if k in names and v is not None}


# --- requests -----------------------------------------------------------------------------------------------------


class TracingMiddleware:
    """A server span per request, named by its route, with the task id and expected version when the URL and the
    If-Match header carry them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not _enabled or request.path in UNTRACED_PATHS:
            return self.get_response(request)
        parent = propagate.extract(dict(request.headers))
        with tracer().start_as_current_span(
            f"{request.method} {request.path}", context=parent, kind=SpanKind.SERVER
        ) as span:
            span.set_attribute("http.request.method", request.method or "")
            response = self.get_response(request)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response

    def process_view(self, request: HttpRequest, view: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if not _enabled:
            return
        span = trace.get_current_span()
        match = request.resolver_match
        if match is not None and match.route:
            span.update_name(f"{request.method} {match.route}")
            span.set_attribute("http.route", match.route)
        for name in ("task_id", "pk"):
            value = kwargs.get(name)
            if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
                span.set_attribute(TASK_ID, int(value))
                break
        version = request.headers.get("If-Match", "").strip('W/"')
        if version.isdigit():
            span.set_attribute(TASK_VERSION, int(version))


# --- Celery -------------------------------------------------------------------------------------------------------


def inject_into(headers: dict[str, Any]) -> None:
    """``before_task_publish``: the current trace context into the message's headers."""
    if _enabled:
        propagate.inject(headers)


class _RequestGetter:
    """Reads W3C trace headers from a Celery task request (message headers become its attributes)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


_RUNNING: dict[str, tuple[Span, object]] = {}


def job_started(task_id: str, task: Any, args: Any) -> None:
    """``task_prerun``: a span for the job, a child of the request that queued it."""
    if not _enabled or task is None:
        return
    parent: otel_context.Context | None = propagate.extract(task.request, getter=_RequestGetter())  # type: ignore[arg-type]
    if not trace.get_current_span(parent).get_span_context().is_valid:
        parent = None  # no trace in the message (a job run in place, eagerly): the current one, if any, goes on
    span = tracer().start_span(str(getattr(task, "name", "celery.task")), context=parent, kind=SpanKind.CONSUMER)
    if getattr(task, "name", "") == "tasks.drive_task" and args:
        span.set_attribute(TASK_ID, args[0])
        if len(args) > 1 and args[1] is not None:
            span.set_attribute(TASK_VERSION, args[1])
    token = otel_context.attach(trace.set_span_in_context(span))
    _RUNNING[task_id] = (span, token)


def job_finished(task_id: str, state: str | None) -> None:
    """``task_postrun``: the job's span ends."""
    running = _RUNNING.pop(task_id, None)
    if running is None:
        return
    span, token = running
    if state and state not in ("SUCCESS", "RETRY"):
        span.set_status(Status(StatusCode.ERROR, state))
    otel_context.detach(token)  # type: ignore[arg-type]
    span.end()


# --- state changes ------------------------------------------------------------------------------------------------


def record_state_change(task: Any, event: Any) -> None:
    """tasks.engine.events observer: each state change is an event on the span that made it (the request's or the
    job's),
    named as its log line, with the task id, the version the change made and the op key — so the trace shows which
    versions a request or a wake-up wrote, and which op keys it registered and settled."""
    if not _enabled:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    message, fields = state_change_line(
        task_id=task.pk, version=event.seq, event_type=event.type, payload=event.payload
    )
    span.add_event(message, {f"reckon.{name}": value for name, value in fields.items()})


# --- connectors ---------------------------------------------------------------------------------------------------


@contextmanager
def _remote_call(name: str, op_key: str | None = None, **attributes: Any) -> Iterator[Span]:
    with tracer().start_as_current_span(f"connector.{name}", kind=SpanKind.CLIENT) as span:
        for key, value in (_task_attributes() | attributes).items():
            span.set_attribute(key, value)
        if op_key is not None:
            span.set_attribute(OP_KEY, op_key)
        yield span


class TracedConnector:
    """A connector (tasks/engine/connectors.py's contract) whose every remote call is a span; the outcome's class is
    recorded on it. Everything else is the wrapped connector's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _outcome(self, span: Span, outcome: Any) -> Any:
        span.set_attribute("reckon.outcome", type(outcome).__name__)
        failure = getattr(outcome, "failure_class", None)
        if failure:
            span.set_attribute("reckon.failure_class", str(failure))
        return outcome

    def submit(self, op_key: str, request: dict[str, Any]) -> Any:
        with _remote_call("submit", op_key, **{"reckon.action": str(request.get("action", ""))}) as span:
            return self._outcome(span, self._inner.submit(op_key, request))

    def compensate(self, op_key: str, request: dict[str, Any]) -> Any:
        with _remote_call("compensate", op_key, **{"reckon.action": str(request.get("action", ""))}) as span:
            return self._outcome(span, self._inner.compensate(op_key, request))

    def delete(self, op_key: str, locator: str) -> Any:
        with _remote_call("delete", op_key) as span:
            return self._outcome(span, self._inner.delete(op_key, locator))

    def lookup(self, op_key: str) -> Any:
        with _remote_call("lookup", op_key) as span:
            return self._outcome(span, self._inner.lookup(op_key))

    def fence(self, op_key: str) -> Any:
        """The wrapped connector's fence — or, when it cannot fence, its lookup (a not found is then final only past
        the deadline). Spelled out: the Fencing protocol is checked on the class, past ``__getattr__``."""
        with _remote_call("fence", op_key) as span:
            inner_fence = getattr(self._inner, "fence", None)
            outcome = inner_fence(op_key) if callable(inner_fence) else self._inner.lookup(op_key)
            return self._outcome(span, outcome)

    def current_version(self, locator: str) -> str:
        with _remote_call("current_version"):
            return str(self._inner.current_version(locator))


def trace_registered_connectors() -> None:
    """Wrap the connector factory of every task kind registered so far (the apps before this one in
    INSTALLED_APPS register theirs in ready())."""
    from tasks.engine import registry

    for kind in registry.known_kinds():
        spec = registry._KINDS[kind]
        if getattr(spec.connector, "_reckon_traced", False):
            continue
        registry.register_kind(kind, connector=_traced_factory(spec.connector))


def _traced_factory(factory: Callable[[], Any]) -> Callable[[], Any]:
    def build() -> Any:
        return TracedConnector(factory())

    build._reckon_traced = True  # type: ignore[attr-defined]
    return build
