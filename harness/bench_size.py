"""``./dev manage bench size`` — a step's cost against the plan's size: steps/s and client CPU per step at 10, 1,000
and 10,000 nodes per task (goal: within 10 % of each other), in one run.

Each size drives the same number of steps (``--size-steps``, 2,000 by default) through ``run_steps`` in this process
against an in-process connector (harness/bench.py's): at 10 nodes, 200 tasks of 10; at 1,000 nodes, two tasks; at
10,000 nodes, the first 2,000 steps of one task. Every task is one fan-out node of that many members
(tasks/core/plan.py): the plan the reference agent sends. The sizes are measured in interleaved rounds (10, 1,000,
10,000, 10, …), each figure the median of its rounds. A task's creation (validation, its nodes inserted) is timed
apart, per node, and so is its first snapshot (every node read once); every later step reads only what the step's
write changed.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection

from harness.bench import ACTION, BenchConnector, scratch_database


@dataclass(frozen=True)
class SizeConfig:
    sizes: tuple[int, ...] = (10, 1_000, 10_000)
    steps: int = 2_000  # per size and round
    rounds: int = 3

    def check(self) -> None:
        from tasks.core.plan import MAX_NODES

        if not self.sizes or min(self.sizes) < 1 or max(self.sizes) > MAX_NODES:
            raise ValueError(f"sizes are nodes per task, from 1 to {MAX_NODES}")
        if self.steps < 1 or self.rounds < 1:
            raise ValueError("steps and rounds must be at least 1")


def fan_out_plan(nodes: int) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "key": "n",
                "action": ACTION,
                "fan_out": {"total": nodes, "batch": 1},
                "evidence": {"remote_id": True, "count": 1},
                "rerun": "idempotent by op key",
            }
        ]
    }


def _one_size(nodes: int, steps: int, label: str) -> dict[str, Any]:
    from leases.services import lease_acquire
    from tasks.engine.plans import task_create
    from tasks.engine.runner import run_steps
    from tasks.engine.snapshot import task_snapshot

    tasks = max(1, -(-steps // nodes))
    plan = fan_out_plan(nodes)
    create_wall = first_read = 0.0
    made = []
    for n in range(tasks):
        started = time.perf_counter()
        task = task_create(kind="bench", title=f"bench size {label}.{n}", plan=plan, created_by="bench")
        create_wall += time.perf_counter() - started
        lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="bench", ttl=timedelta(hours=1))
        started = time.perf_counter()
        snap = task_snapshot(task_id=task.pk, lease=lease)
        first_read += time.perf_counter() - started
        made.append((task.pk, lease, snap))
    connector = BenchConnector()
    done = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for task_id, lease, snap in made:
        # The task's first snapshot (read above, timed apart), then each write's: no step reads the plan again.
        report = run_steps(
            task_id=task_id, lease=lease, connector=connector, max_steps=min(nodes, steps - done), snapshot=snap
        )
        done += report.steps
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "nodes": nodes,
        "tasks": tasks,
        "steps": done,
        "steps_per_second": done / wall if wall else 0.0,
        "cpu_ms_per_step": 1000 * cpu / done if done else 0.0,
        "create_ms_per_node": 1000 * create_wall / (tasks * nodes),
        "first_read_ms": 1000 * first_read / tasks,
    }


def run_size(config: SizeConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    config.check()
    rounds: dict[int, list[dict[str, Any]]] = {size: [] for size in config.sizes}
    with scratch_database():
        for round_number in range(1, config.rounds + 1):
            for size in config.sizes:
                figures = _one_size(size, config.steps, f"{round_number}.{size}")
                rounds[size].append(figures)
                log(
                    f"round {round_number}, {size} nodes: {figures['steps_per_second']:.1f} steps/s, "
                    f"{figures['cpu_ms_per_step']:.2f} ms CPU a step"
                )
    base = config.sizes[0]
    rows = []
    for size in config.sizes:
        row = {
            key: statistics.median(r[key] for r in rounds[size])
            for key in ("steps_per_second", "cpu_ms_per_step", "create_ms_per_node", "first_read_ms")
        }
        rows.append({"nodes": size, "steps": rounds[size][0]["steps"], **row})
    for row in rows:
        first = rows[0]
        row["steps_ratio"] = row["steps_per_second"] / first["steps_per_second"] if first["steps_per_second"] else 0
        row["cpu_ratio"] = row["cpu_ms_per_step"] / first["cpu_ms_per_step"] if first["cpu_ms_per_step"] else 0
    return {
        "backend": connection.vendor,
        "rounds": config.rounds,
        "steps": config.steps,
        "base": base,
        "sizes": rows,
        "raw": {str(size): figures for size, figures in rounds.items()},
    }


def format_size(report: dict[str, Any]) -> str:
    lines = [
        f"A step's cost by the plan's size ({report['backend']}, in process, {report['steps']} steps a size, "
        f"median of {report['rounds']} interleaved rounds; ratios against {report['base']} nodes)",
        f"{'nodes':>7} {'steps/s':>9} {'ratio':>6} {'CPU ms/step':>12} {'ratio':>6} {'create ms/node':>15}"
        f" {'first read ms':>14}",
    ]
    for row in report["sizes"]:
        lines.append(
            f"{row['nodes']:>7} {row['steps_per_second']:>9.1f} {row['steps_ratio']:>6.2f}"
            f" {row['cpu_ms_per_step']:>12.2f} {row['cpu_ratio']:>6.2f}"
            f" {row['create_ms_per_node']:>15.3f} {row['first_read_ms']:>14.1f}"
        )
    return "\n".join(lines)
