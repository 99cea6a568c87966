"""Steps per second through the agent API: N tasks of M nodes whose connector answers at once (no external system),
run by C agents in threads, each task with ``Reckon.run`` — the HTTP figure to put beside the in-process one
(``./dev manage bench``).

    python examples/bench_http.py --url http://127.0.0.1:8000 --token rk_… --tasks 20 --nodes 10 --agents 4

A node in steady state is one request and one commit: its outcome, whose answer carries the next node's operation,
started in the same commit; a task adds its create, lease, first directive, first intent and release. The server's
rate limit (RECKON_API_RATE requests a minute per token, default 6000) caps what one token can do: start the server
with RECKON_API_RATE=0 to measure the server, not the limit.
"""

import argparse
import sys
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from reckon_client import Committed, NotFound, Outcome, Reckon, RunResult

KIND = "migrate_project_api"


class Instant:
    """A connector whose remote commits every write at once and remembers it (so a lookup finds it)."""

    def __init__(self) -> None:
        self.committed: set[str] = set()

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        self.committed.add(op_key)
        return Committed(remote_id=op_key)

    def lookup(self, op_key: str) -> Outcome:
        return Committed(remote_id=op_key) if op_key in self.committed else NotFound()

    def current_version(self, locator: str) -> str:
        return "1"


def plan(nodes: int) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "key": f"n{i}",
                "action": "store.prepare_target",
                "input": {"project": f"bench-{i}"},
                "evidence": {"remote_id": True},
            }
            for i in range(1, nodes + 1)
        ]
    }


@dataclass(frozen=True)
class Figures:
    tasks: int
    nodes: int
    seconds: float
    done: int

    @property
    def steps_per_second(self) -> float:
        return self.tasks * self.nodes / self.seconds if self.seconds else 0.0


def bench(url: str, token: str, *, tasks: int, nodes: int, agents: int) -> Figures:
    """Create the tasks first (not timed), then time running them all."""
    run_id = uuid.uuid4().hex[:8]
    with Reckon(url, token) as reckon:
        ids = [reckon.create_task(KIND, f"bench {run_id} #{n}", plan(nodes)).id for n in range(tasks)]
        connector = Instant()

        def drive(task_id: int) -> RunResult:
            return reckon.run(task_id, connector)

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=agents) as pool:
            results = list(pool.map(drive, ids))
        seconds = time.perf_counter() - started
    return Figures(tasks, nodes, seconds, sum(result.done for result in results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--agents", type=int, default=4, help="tasks run at once (threads)")
    args = parser.parse_args(argv)
    figures = bench(args.url, args.token, tasks=args.tasks, nodes=args.nodes, agents=args.agents)
    print(
        f"{figures.done}/{figures.tasks} tasks of {figures.nodes} nodes done by {args.agents} agents in "
        f"{figures.seconds:.2f} s: {figures.steps_per_second:.1f} steps/s over HTTP",
        flush=True,
    )
    return 0 if figures.done == figures.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
