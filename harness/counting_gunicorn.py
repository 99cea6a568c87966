"""gunicorn's configuration for bench_http: Reckon's own (console/gunicorn.conf.py, loaded as it is) plus a count of
what each worker's database connections send — statements, commits (harness.bench.StatementCounter) and Django's
connection health check (one ``SELECT 1`` per request that reuses a connection), and the worker's CPU time — written
by a thread of each worker to ``$RECKON_BENCH_COUNTS/<pid>.json`` within 50 ms of a change (not after every request:
a file written per request cost the server 12 % of its time in a profile), which the benchmark sums before and after
a run, reading until two readings agree."""

import json
import os
import runpy
import threading
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
globals().update(
    {k: v for k, v in runpy.run_path(str(_ROOT / "console" / "gunicorn.conf.py")).items() if not k.startswith("__")}
)

_counters: list[Any] = []
_health_checks = [0]
_requests = [0]
_lock = threading.Lock()


def post_worker_init(worker: Any) -> None:
    from django.db.backends.signals import connection_created

    from harness.bench import StatementCounter

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        counter = StatementCounter(connection)
        installed = counter.installed()
        installed.__enter__()  # for the connection's whole life (kept referenced: a collected one would uninstall)
        usable = connection.is_usable

        def is_usable() -> bool:
            _health_checks[0] += 1
            return bool(usable())

        connection.is_usable = is_usable
        with _lock:
            _counters.append((counter, installed))

    connection_created.connect(count, weak=False)
    threading.Thread(target=_write_counts, name="bench-counts", daemon=True).start()


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    with _lock:
        _requests[0] += 1


def _write_counts() -> None:
    directory = Path(os.environ["RECKON_BENCH_COUNTS"])
    written: dict[str, int] = {}
    while True:
        with _lock:
            totals = {
                "requests": _requests[0],
                "statements": sum(c.statements for c, _installed in _counters) + _health_checks[0],
                "commits": sum(c.commits for c, _installed in _counters),
                "health_checks": _health_checks[0],
            }
        if totals != written:
            # The worker's CPU as of now (within 50 ms of its last request): what serving them cost this process.
            cpu_us = int(time.process_time() * 1_000_000)
            temporary = directory / f".{os.getpid()}.tmp"
            temporary.write_text(json.dumps({**totals, "cpu_us": cpu_us}))
            temporary.replace(directory / f"{os.getpid()}.json")
            written = totals
        time.sleep(0.05)
