"""A pytest plugin: the machine's CPU time and the wall time spent in each test file, written as JSON when the run
ends (to RECKON_CPU_PER_FILE, default cpu-per-file.json) — to find where a CI pass's CPU goes (docs/testing.md).

    PYTHONPATH=. ./dev test -p harness.cpu_per_file -m "not once_postgres"   # writes cpu-per-file.json

The CPU is the whole machine's (/proc/stat: user, nice, system, irq, softirq), so that the processes a test starts —
workers, web servers, Chromium — count: run one pass alone, without xdist, on an otherwise idle machine."""

import json
import os
import time
from pathlib import Path

import pytest

_spent: dict[str, list[float]] = {}
_current: dict[str, str | float] = {}


def _machine_cpu_seconds() -> float:
    # harness.bench's reading, imported once tests run (it imports Django, which is set up after plugins load)
    from harness.bench import machine_cpu_seconds

    return machine_cpu_seconds() or 0.0


def _close() -> None:
    if "file" in _current:
        row = _spent.setdefault(str(_current["file"]), [0.0, 0.0])
        row[0] += _machine_cpu_seconds() - float(_current["cpu"])
        row[1] += time.monotonic() - float(_current["wall"])


def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    file = item.nodeid.split("::")[0]
    if _current.get("file") != file:
        _close()
        _current.update(file=file, cpu=_machine_cpu_seconds(), wall=time.monotonic())


def pytest_sessionfinish(session: pytest.Session) -> None:
    _close()
    rows = sorted(_spent.items(), key=lambda row: -row[1][0])
    path = Path(os.environ.get("RECKON_CPU_PER_FILE", "cpu-per-file.json"))
    table = {file: {"cpu_s": round(cpu, 1), "wall_s": round(wall, 1)} for file, (cpu, wall) in rows}
    path.write_text(json.dumps(table, indent=1))
