"""Prometheus metrics computed from the database at scrape time.

Every figure here is a query, not an in-process counter: the web processes, the workers and the beat are separate
processes (often on separate hosts), and a counter kept in one of them would be per process and lost on restart.
The database holds the whole history already (the event log, lease rows, operation rows, verification runs), so a
scrape of any one web process reports what the whole deployment did, and the figures match the database exactly.

Counters of events ("…_total") are counts of append-only or history rows, so they only grow (unless history is
deleted, which the append-only triggers refuse for events). Gauges describe the state now.

"Now" is the database's clock (leases.clock), the one leases and wake-up claims are written with.

Cost: each scrape runs a fixed number of grouped counts (see ``QUERIES``). The open-operation counts use the partial
index ``operation_open_idx``; tasks by status use ``task_status_idx``; the event, lease and operation histories are
counted in full (one grouped scan each). A scrape result is kept for ``RECKON_METRICS_CACHE_SECONDS`` so that many
scrapers (or a fast scrape interval) cost no more than one scrape per period.
"""

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Exists, OuterRef, Q, Sum
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from audit.models import VerificationRun
from leases import clock
from leases.models import ForcedRelease, Lease
from leases.state import grace_q, lapsed_q, live_q
from tasks.core.lifecycle import PauseReason, TaskStatus, TempResourceStatus
from tasks.models import ArchivedEventCount, Event, Operation, Task, TaskWakeUp, TempResource

# A step's settlement (commit 2 of tasks/engine/protocol.py) appends exactly one of these events: the step's outcome.
STEP_OUTCOME_EVENTS: dict[str, str] = {
    "node_succeeded": "succeeded",
    "evidence_insufficient": "evidence_insufficient",
    "operation_accepted": "accepted",
    "operation_rejected": "rejected",
    "operation_unknown": "unknown",
    "operation_unprovable": "unprovable",
    "operation_not_found": "not_found",
    "operation_not_found_yet": "not_found_not_final",
    "operation_fenced": "fenced",
    "operation_refused_again": "refused_again",
    "operation_resolved_not_done": "resolved_not_done",
}
OPEN_OPERATION_STATUSES = ("dispatched", "accepted", "unknown")
# Seconds from an operation's registration to its settlement, for operations that went unknown on the way (their
# settlement is the reconciler's: a query by op key). Prometheus' usual buckets, stretched to an hour.
RECONCILIATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


@dataclass
class Scrape:
    """One reading of the database: the metric families and how long the reading took."""

    families: list[Metric]
    seconds: float
    at: float = field(default_factory=time.monotonic)


def _tasks_by_state() -> Metric:
    family = GaugeMetricFamily(
        "reckon_tasks",
        "Tasks now, by status and pause reason (reason is empty unless paused).",
        labels=["status", "reason"],
    )
    counts = {(s.value, ""): 0 for s in TaskStatus if s != TaskStatus.PAUSED}
    counts |= {(TaskStatus.PAUSED.value, r.value): 0 for r in PauseReason}
    rows = Task.objects.order_by().values_list("status", "status_reason").annotate(n=Count("pk"))
    for status, reason, n in rows:
        counts[(status, reason)] = n
    for (status, reason), n in sorted(counts.items()):
        family.add_metric([status, reason], n)
    return family


def _operations_now() -> Iterator[Metric]:
    open_ops = GaugeMetricFamily(
        "reckon_operations_open",
        "Operations sent and not settled now, by status (unknown: the answer was lost; only a query by op key "
        "settles it).",
        labels=["status"],
    )
    counts = dict.fromkeys(OPEN_OPERATION_STATUSES, 0)
    rows = (
        Operation.objects.filter(status__in=OPEN_OPERATION_STATUSES)
        .order_by()
        .values_list("status")
        .annotate(n=Count("pk"))
    )
    counts |= dict(rows)
    for status, n in counts.items():
        open_ops.add_metric([status], n)
    yield open_ops
    unprovable = Operation.objects.filter(status="unknown", failure_class="unprovable").count()
    yield GaugeMetricFamily(
        "reckon_operations_unprovable",
        "Operations now unknown that the remote can neither dedupe nor be queried for: a person must decide.",
        value=unprovable,
    )
    oldest = (
        Operation.objects.filter(status="unknown").order_by("registered_at").values_list("registered_at", flat=True)
    ).first()
    yield GaugeMetricFamily(
        "reckon_operations_unknown_oldest_seconds",
        "Age of the oldest operation now unknown (0: none): how far reconciliation is behind.",
        value=_age(oldest),
    )


def _age(moment: datetime | None) -> float:
    return max(0.0, (clock.now() - moment).total_seconds()) if moment is not None else 0.0


def _reconciliation_latency() -> Metric:
    """Registration to settlement of every settled operation that was unknown on the way (its failure class says
    the connection was interrupted, or it could not be proven): how long reconciling took."""
    rows = Operation.objects.filter(
        settled_at__isnull=False, failure_class__in=["connection_interrupted", "unprovable"]
    ).values_list("registered_at", "settled_at")
    durations = [(settled - registered).total_seconds() for registered, settled in rows if settled is not None]
    return _histogram(
        "reckon_reconciliation_seconds",
        "Seconds from an operation's registration to its settlement, for operations whose answer was lost "
        "(settled by a query by op key or a person).",
        durations,
        RECONCILIATION_BUCKETS,
    )


def _histogram(name: str, documentation: str, values: Iterable[float], bounds: tuple[float, ...]) -> Metric:
    ordered = sorted(values)
    buckets: list[tuple[str, float]] = []
    for bound in bounds:
        buckets.append((repr(bound), float(sum(1 for v in ordered if v <= bound))))
    buckets.append(("+Inf", float(len(ordered))))
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], buckets, sum_value=sum(ordered))
    return family


def _events() -> Iterator[Metric]:
    """Steps by outcome and quarantines: one grouped read of the hot table for both, plus the archive's counts."""
    family = CounterMetricFamily(
        "reckon_steps",
        "Steps settled since the database began, by outcome (one settlement event each).",
        labels=["outcome"],
    )
    counts = dict.fromkeys(STEP_OUTCOME_EVENTS.values(), 0)
    wanted = [*STEP_OUTCOME_EVENTS, "quarantined"]
    # The hot table counted, the archive's count by type added (kept by the archive step as it moves events): the
    # counters never go down, and a scrape does not count the archive's millions of rows.
    rows = Counter(dict(Event.objects.filter(type__in=wanted).order_by().values_list("type").annotate(n=Count("pk"))))
    rows.update(dict(ArchivedEventCount.objects.filter(type__in=wanted).values_list("type", "events")))
    for event_type, outcome in STEP_OUTCOME_EVENTS.items():
        counts[outcome] += rows.get(event_type, 0)
    for outcome, n in counts.items():
        family.add_metric([outcome], n)
    yield family
    yield CounterMetricFamily(
        "reckon_quarantines",
        "Tasks quarantined (the log and the projection disagreed), one event each.",
        value=rows.get("quarantined", 0),
    )


def _failures_and_retries() -> Iterator[Metric]:
    """Each operation that failed is one attempt its failure class then decided on (DESIGN §6): retried after
    backoff (dependency_unavailable), queried by op key (connection_interrupted), or handed to a person or a
    re-plan (the others). A retry is a rejected operation after which its node was tried again under a new op key:
    a later operation of the same node and purpose (found through the node's foreign-key index). An unknown one
    settled by a query is not a retry: nothing was sent again."""
    failures = CounterMetricFamily(
        "reckon_operation_failures",
        "Operations that failed, by failure class (each then retried, queried, paused or failed by its class).",
        labels=["failure_class"],
    )
    failed = Operation.objects.exclude(failure_class="")
    for failure_class, n in sorted(failed.order_by().values_list("failure_class").annotate(n=Count("pk"))):
        failures.add_metric([failure_class], n)
    yield failures
    retries = CounterMetricFamily(
        "reckon_retries",
        "Nodes tried again after a failed operation, by the failure class of the one that failed.",
        labels=["failure_class"],
    )
    tried_again = Operation.objects.filter(node=OuterRef("node"), purpose=OuterRef("purpose"), pk__gt=OuterRef("pk"))
    rows = (
        failed.filter(status="rejected")
        .filter(Exists(tried_again))
        .order_by()
        .values_list("failure_class")
        .annotate(n=Count("pk"))
    )
    for failure_class, n in sorted(rows):
        retries.add_metric([failure_class], n)
    yield retries


def _leases() -> Iterator[Metric]:
    grants = CounterMetricFamily(
        "reckon_lease_grants", "Leases granted (one lease row each), by holder kind.", labels=["holder_kind"]
    )
    by_kind = dict.fromkeys(("agent", "operator"), 0)
    by_reason = dict.fromkeys(("released", "expired", "forced"), 0)
    for kind, reason, n in (
        Lease.objects.order_by().values_list("holder_kind", "release_reason").annotate(n=Count("pk"))
    ):
        by_kind[kind] = by_kind.get(kind, 0) + n
        if reason:
            by_reason[reason] = by_reason.get(reason, 0) + n
    for kind, n in by_kind.items():
        grants.add_metric([kind], n)
    yield grants
    releases = CounterMetricFamily(
        "reckon_lease_releases",
        "Leases closed, by reason: released by the holder, expired (closed by the next grant after TTL and grace), "
        "forced (an admin removed the holder).",
        labels=["reason"],
    )
    for reason, n in by_reason.items():
        releases.add_metric([reason], n)
    yield releases
    now = clock.now()
    open_leases = Lease.objects.open()
    held = GaugeMetricFamily(
        "reckon_leases_open",
        "Leases not closed now: live (before expiry), in grace (only the holder may renew), lapsed (past expiry and "
        "grace, closed by the next grant).",
        labels=["state"],
    )
    aggregate = open_leases.aggregate(
        live=Count("pk", filter=live_q(now)),
        grace=Count("pk", filter=grace_q(now)),
        lapsed=Count("pk", filter=lapsed_q(now)),
    )
    for state in ("live", "grace", "lapsed"):
        held.add_metric([state], aggregate[state])
    yield held
    forced = CounterMetricFamily(
        "reckon_forced_releases", "Forced releases by an admin, by review status.", labels=["review"]
    )
    by_review = dict.fromkeys(("pending", "accepted", "disputed"), 0)
    by_review |= dict(ForcedRelease.objects.order_by().values_list("status").annotate(n=Count("pk")))
    for review, n in by_review.items():
        forced.add_metric([review], n)
    yield forced


def _cleanup_backlog() -> Metric:
    family = GaugeMetricFamily(
        "reckon_cleanup_backlog",
        "Temp resources not deleted yet, by status (stuck: the remote refused every delete; a person must look).",
        labels=["status"],
    )
    waiting = [s for s in TempResourceStatus.values if s != TempResourceStatus.DELETED]
    counts = dict.fromkeys(waiting, 0)
    counts |= dict(
        TempResource.objects.filter(status__in=waiting).order_by().values_list("status").annotate(n=Count("pk"))
    )
    for status, n in counts.items():
        family.add_metric([status], n)
    return family


def _chain_verification() -> Iterator[Metric]:
    runs = VerificationRun.objects.aggregate(
        runs=Count("pk"),
        tasks=Sum("tasks_with_problems"),
        audit=Count("pk", filter=~Q(audit_problem="")),
    )
    failures = CounterMetricFamily(
        "reckon_chain_verification_failures",
        "Problems found by log verification runs: tasks whose event log failed, runs whose audit chain failed.",
        labels=["chain"],
    )
    failures.add_metric(["task_events"], runs["tasks"] or 0)
    failures.add_metric(["audit"], runs["audit"])
    yield failures
    yield CounterMetricFamily("reckon_chain_verification_runs", "Log verification runs recorded.", value=runs["runs"])


def _wake_ups() -> Iterator[Metric]:
    """What tasks/engine/recovery.py records of wake-ups, in one pass over its rows: the claim taken when one is queued
    (at most one per task version), the counts of claims taken and refused (a second wake-up for a version already
    queued is deduplicated at enqueue: tasks.engine.recovery.wake_up_claim returned False and nothing was sent), and a
    remote that stays down. The counts live on the task's row (``TaskWakeUp.queued_count`` /
    ``deduplicated_count``), bumped by the claim's own statement, so every process's wake-ups are counted."""
    now = clock.now()
    rows = TaskWakeUp.objects.aggregate(
        pending=Count("pk", filter=Q(queued_version__isnull=False, queued_until__gt=now)),
        remote_down=Count("pk", filter=Q(remote_down_tries__gt=0)),
        queued=Sum("queued_count"),
        deduplicated=Sum("deduplicated_count"),
    )
    yield CounterMetricFamily(
        "reckon_wake_ups_queued",
        "Wake-ups queued for a worker (a claim taken and its message sent), since the database began.",
        value=rows["queued"] or 0,
    )
    yield CounterMetricFamily(
        "reckon_wake_ups_deduplicated",
        "Wake-ups not queued because one for the same task version was queued already (refused at enqueue).",
        value=rows["deduplicated"] or 0,
    )
    yield GaugeMetricFamily(
        "reckon_wake_ups_pending",
        "Tasks with a wake-up on the broker now (its claim not lapsed): another for the same version is not queued.",
        value=rows["pending"],
    )
    yield GaugeMetricFamily(
        "reckon_tasks_remote_down",
        "Tasks whose remote could not be reached on the last try: asked again after a growing, jittered backoff.",
        value=rows["remote_down"],
    )


# The readings, in exposition order. Each is a fixed number of grouped queries.
QUERIES = (
    lambda: [_tasks_by_state()],
    _operations_now,
    lambda: [_reconciliation_latency()],
    _events,
    _failures_and_retries,
    _leases,
    lambda: [_cleanup_backlog()],
    _wake_ups,
    _chain_verification,
)


def read_database() -> Scrape:
    started = time.perf_counter()
    families: list[Metric] = [family for query in QUERIES for family in query()]
    seconds = time.perf_counter() - started
    families.append(
        GaugeMetricFamily(
            "reckon_metrics_scrape_seconds", "Seconds the database reading of this scrape took.", value=seconds
        )
    )
    return Scrape(families, seconds)


class DatabaseCollector(Collector):
    """Reads the database when scraped; a reading is reused for ``max_age`` seconds (0: never reused)."""

    def __init__(self, max_age: float = 0.0) -> None:
        self.max_age = max_age
        self._last: Scrape | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            last = self._last
            if last is None or time.monotonic() - last.at >= self.max_age:
                last = self._last = read_database()
            return list(last.families)


def exposition(collector: DatabaseCollector) -> bytes:
    """The Prometheus text format of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
