"""A real Celery worker process for a test: on a queue of the test's own (runs share the broker), with the test
database and the simulator the connectors talk to. Used by the worker, bulk and browser tests."""

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from harness.killmatrix import database_url
from harness.zygote import start_worker, worker_command
from tests.simulator_fixture import ROOT


@contextmanager
def celery_worker(
    store_url: str, *, prefix: str = "test", drop_env: tuple[str, ...] = (), also: tuple[str, ...] = ()
) -> Iterator[str]:
    """Start a solo-pool worker consuming a fresh queue; yield the queue's name; stop the worker (TERM, then KILL).

    ``also``: suffixes of more queues the worker consumes, each named ``<queue>-<suffix>`` — e.g. ``("scan",)``
    for harness.killmatrix.scan_queue(queue), where recovery scans go so that they never wait behind wake-ups."""
    queue = f"{prefix}-{uuid.uuid4().hex[:10]}"
    queues = ",".join([queue, *(f"{queue}-{suffix}" for suffix in also)])
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env |= {"DATABASE_URL": database_url(), "RECKON_OBJECTSTORE_URL": store_url}
    process = start_worker(worker_command(queues), env=env, cwd=ROOT)
    try:
        yield queue
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
