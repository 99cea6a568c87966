"""harness/zygote.py: a forked worker is a process of its own, with its own environment and settings, and what ended
it reads as subprocess.Popen would read it."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.killmatrix import database_url
from harness.zygote import ForkedProcess, start_worker, worker_command
from tests.test_secure_defaults import production_environment


def _ready(log: Path, process: ForkedProcess | subprocess.Popen[bytes], seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if "ready." in text:
            return text
        if process.poll() is not None:
            pytest.fail(f"the worker exited with {process.returncode}: {text[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"the worker was not ready within {seconds} s: {log.read_text()[-2000:]}")


def test_a_forked_worker_reads_its_own_environment_and_its_end_reads_as_popen_reads_it(tmp_path: Path) -> None:
    env = dict(os.environ) | {"DATABASE_URL": database_url(), "RECKON_LOG_LEVEL": "INFO"}
    log = tmp_path / "worker.log"
    worker = start_worker(worker_command(f"zygote-{uuid.uuid4().hex[:8]}", loglevel="INFO"), env=env, log=log)
    assert isinstance(worker, ForkedProcess)
    _ready(log, worker)
    assert worker.pid != os.getpid() and worker.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(0.1)
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(10) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):  # reaped: not a zombie that a kill(pid, 0) would still find
        os.kill(worker.pid, 0)
    worker.kill()  # a process that has ended is not signalled again (its pid may be another's by now)


def test_a_forked_worker_takes_its_settings_from_its_environment_not_the_zygotes(tmp_path: Path) -> None:
    """A production environment without a secret key: the worker refuses to start as a worker started from the
    command line does (tests/test_secure_defaults.py), with the status Popen reports for the same command."""
    env = production_environment(tmp_path / "data")
    del env["DJANGO_SECRET_KEY"]
    log = tmp_path / "worker.log"
    forked = start_worker(worker_command("zygote-refused"), env=env, log=log)
    assert isinstance(forked, ForkedProcess)
    code = forked.wait(60)
    assert "DJANGO_SECRET_KEY is not set" in log.read_text(), log.read_text()[-2000:]
    command = worker_command("zygote-refused")
    with (tmp_path / "popen.log").open("ab") as out:
        started = subprocess.Popen(command, env=env, stdout=out, stderr=out)  # noqa: S603
    assert code == started.wait(60) != 0
    assert command[:3] == [sys.executable, "-m", "celery"]


def test_what_cannot_be_forked_is_started_as_a_process_of_its_own(tmp_path: Path) -> None:
    """A preloaded library (libfaketime's LD_PRELOAD) only takes effect in a new program: Popen."""
    env = dict(os.environ) | {"LD_PRELOAD": "/nonexistent/libnothing.so", "DATABASE_URL": database_url()}
    worker = start_worker(worker_command(f"zygote-{uuid.uuid4().hex[:8]}"), env=env, log=tmp_path / "w.log")
    try:
        assert isinstance(worker, subprocess.Popen)
    finally:
        worker.kill()
        worker.wait(10)
