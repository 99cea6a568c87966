"""Throughput of the step protocol on the configured database backend, in a throw-away database.

    ./dev manage bench_protocol --tasks 20 --nodes 10
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/reckon ./dev manage bench_protocol

Each task runs the README's agent loop against an in-process stand-in that commits at once, so the
figures are the cost of Reckon's own writes (CAS, event append, receipt), not of a remote.
"""

import statistics
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from leases.services import lease_acquire
from tasks.outcomes import Committed
from tasks.plans import task_create
from tasks.protocol import next_directive, operation_dispatch, record_outcome, register_intent


def _chain(nodes: int) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "key": f"n{i}",
                "action": "store.copy_batch",
                "depends_on": [f"n{i - 1}"] if i else [],
                "evidence": {"remote_id": True, "count": 1},
            }
            for i in range(nodes)
        ]
    }


class Command(BaseCommand):
    help = "Measure step-protocol writes per second on the configured backend (uses a temporary database)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=20)
        parser.add_argument("--nodes", type=int, default=10)

    def handle(self, *args: Any, **options: Any) -> None:
        old_name = connection.settings_dict["NAME"]
        connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
        try:
            self._run(options["tasks"], options["nodes"])
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    def _run(self, tasks: int, nodes: int) -> None:
        latencies: list[float] = []

        def timed(call: Any) -> Any:
            started = time.perf_counter()
            result = call()
            latencies.append(time.perf_counter() - started)
            return result

        started = time.perf_counter()
        for n in range(tasks):
            task = task_create(kind="bench", title=f"bench {n}", plan=_chain(nodes), created_by="bench")
            lease = lease_acquire(task_id=task.pk, holder_kind="agent", holder_id="bench")
            while True:
                d = next_directive(task_id=task.pk, lease=lease)
                if d.kind == "execute" and not d.op_key:
                    timed(
                        lambda d=d, t=task, le=lease: register_intent(
                            task_id=t.pk, node_key=d.node_key, expected_version=d.task_version, lease=le
                        )
                    )
                elif d.kind == "execute":
                    op = timed(
                        lambda d=d, le=lease: operation_dispatch(
                            op_key=d.op_key, expected_version=d.task_version, lease=le
                        )
                    )
                    receipt = Committed(remote_id=f"r-{op.op_key}", count=1)
                    timed(
                        lambda d=d, op=op, r=receipt, le=lease: record_outcome(
                            op_key=op.op_key, outcome=r, expected_version=d.task_version + 1, lease=le
                        )
                    )
                else:
                    break
        elapsed = time.perf_counter() - started
        ms = sorted(x * 1000 for x in latencies)
        self.stdout.write(
            f"bench_protocol [{connection.vendor}]: {tasks} tasks x {nodes} nodes = {tasks * nodes} nodes, "
            f"{len(ms)} protocol writes in {elapsed:.2f}s (incl. task creation and directives)\n"
            f"  nodes/s {tasks * nodes / elapsed:.1f}   writes/s {len(ms) / elapsed:.1f}\n"
            f"  write latency ms: p50 {statistics.median(ms):.2f}  p95 {ms[int(len(ms) * 0.95) - 1]:.2f}  "
            f"max {ms[-1]:.2f}"
        )
