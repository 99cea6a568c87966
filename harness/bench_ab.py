"""``./dev manage bench ab --variants MODULE`` — an in-process A/B of the step path.

MODULE defines ``VARIANTS``: a mapping of a name to two functions, one that switches the variant on (a monkeypatch,
a setting, DDL on the scratch database) and one that switches it off again; the first variant is the baseline,
usually ``(lambda: None, lambda: None)``. Batches of tasks run through ``tasks.engine.runner.run_steps`` in one process
and one scratch database, the variants taking turns batch by batch (A, B, A, B, …), so that the machine's moments
— which move the bench's figures by tens of percent within minutes on a shared machine — hit every variant alike.
Per variant it reports the median and the minimum of the batches' client CPU, wall time and, for a PostgreSQL
server on this machine, the connection's backend CPU (from /proc), each per step, and the medians against the
baseline's. This is how the changes in docs/benchmark.md were judged.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.bench import BenchConnector, bench_tasks, process_cpu, scratch_database

type Switch = Callable[[], None]
FIGURES = ("cpu_ms_per_step", "wall_ms_per_step", "server_cpu_ms_per_step")


class AbError(Exception):
    pass


@dataclass(frozen=True)
class AbConfig:
    variants: str  # the module that defines VARIANTS
    tasks: int = 20  # per batch
    nodes: int = 10
    batches: int = 15  # per variant

    def check(self) -> None:
        if self.tasks < 1 or self.nodes < 1 or self.batches < 1:
            raise ValueError("tasks, nodes and batches must be at least 1")


def load_variants(module: str) -> dict[str, tuple[Switch, Switch]]:
    try:
        found = importlib.import_module(module).VARIANTS
    except (ImportError, AttributeError) as exc:
        raise AbError(f"{module} must be an importable module that defines VARIANTS: {exc}") from exc
    if not isinstance(found, dict) or len(found) < 2:
        raise AbError(f"{module}.VARIANTS must map at least two names to (on, off) pairs")
    for name, pair in found.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(callable(f) for f in pair)):
            raise AbError(f"{module}.VARIANTS[{name!r}] must be a pair of functions (on, off)")
    return dict(found)


def _backend_cpu_seconds() -> float | None:
    """The CPU time of this connection's PostgreSQL backend, when the server runs on this machine."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        found = process_cpu(cursor.fetchone()[0])
    return None if found is None else found[1]


def _run(made: list[tuple[int, Any]], nodes: int) -> None:
    from tasks.engine.runner import run_steps

    connector = BenchConnector()
    for task_id, lease in made:
        report = run_steps(task_id=task_id, lease=lease, connector=connector, max_steps=4 * nodes + 20)
        if report.directive is None or report.directive.kind != "done" or report.stopped_by:
            raise AbError(f"task {task_id} did not complete: {report.directive} {report.stopped_by}")


def run_ab(config: AbConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    config.check()
    variants = load_variants(config.variants)
    from django.conf import settings

    batches: dict[str, list[dict[str, float | None]]] = {name: [] for name in variants}
    order: list[str] = []
    debug, settings.DEBUG = settings.DEBUG, False  # as the workers run: no query log
    try:
        with scratch_database():
            for name, (on, off) in variants.items():  # warm-up: caches, prepared statements; not recorded
                made = bench_tasks(2, config.nodes, label=f"ab warm-{name}", holder="bench-ab")
                on()
                try:
                    _run(made, config.nodes)
                finally:
                    off()
            for round_ in range(config.batches):
                for name, (on, off) in variants.items():
                    made = bench_tasks(config.tasks, config.nodes, label=f"ab {round_}-{name}", holder="bench-ab")
                    on()
                    try:
                        server = _backend_cpu_seconds()
                        cpu, wall = time.process_time(), time.perf_counter()
                        _run(made, config.nodes)
                        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                        after = _backend_cpu_seconds()
                    finally:
                        off()
                    steps = config.tasks * config.nodes
                    batches[name].append(
                        {
                            "cpu_ms_per_step": 1000 * cpu / steps,
                            "wall_ms_per_step": 1000 * wall / steps,
                            "server_cpu_ms_per_step": None
                            if server is None or after is None
                            else 1000 * (after - server) / steps,
                        }
                    )
                    order.append(name)
                log(f"  batch {round_ + 1}/{config.batches} done")
    finally:
        settings.DEBUG = debug
    return _report(config, batches, order)


def _report(config: AbConfig, batches: dict[str, list[dict[str, float | None]]], order: list[str]) -> dict[str, Any]:
    figures: dict[str, dict[str, Any]] = {}
    for name, runs in batches.items():
        cell: dict[str, Any] = {}
        for figure in FIGURES:
            values = [value for r in runs if (value := r[figure]) is not None]
            cell[figure] = statistics.median(values) if values else None
            cell[figure.replace("_per_step", "_min")] = min(values) if values else None
        figures[name] = cell
    baseline = next(iter(figures.values()))
    against = {
        name: {
            figure: (cell[figure] / baseline[figure] if cell[figure] is not None and baseline[figure] else None)
            for figure in FIGURES
        }
        for name, cell in figures.items()
    }
    return {
        "config": {
            "variants": config.variants,
            "tasks": config.tasks,
            "nodes": config.nodes,
            "batches": config.batches,
        },
        "order": order,
        "figures": figures,
        "against_baseline": against,
        "batches": batches,
    }


def format_ab(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"A/B of {cfg['variants']}: {cfg['batches']} batches per variant, interleaved, {cfg['tasks']} tasks x"
        f" {cfg['nodes']} nodes each, in one process; per step, median (min), x baseline",
        f"{'variant':16}{'cpu ms':>22}{'wall ms':>22}{'server cpu ms':>22}",
    ]
    for name, cell in report["figures"].items():
        ratio = report["against_baseline"][name]
        row = f"{name:16}"
        for figure in FIGURES:
            low = cell[figure.replace("_per_step", "_min")]
            times = "-" if ratio[figure] is None else f"x{ratio[figure]:.2f}"
            text = "-" if cell[figure] is None else f"{cell[figure]:.3f} ({low:.3f}) {times}"
            row += f"{text:>22}"
        lines.append(row)
    return "\n".join(lines)
