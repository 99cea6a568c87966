"""Celery worker processes for the tests and the harness, started by one function (``start_worker``) and, by default,
forked from a process that has already imported what a worker imports (a zygote, as Android and Chromium start
their processes).

A worker started with ``python -m celery`` spends about 0.8 s of CPU importing Celery, Django, psycopg, pydantic and
the rest before it reads a message; CI starts about 150 of them on two cores. The zygote imports the third-party
modules once — never Reckon's own, never Django's settings, whose values come from each worker's environment — and
forks each worker from there: the child takes the environment, the working directory and the log it was given, and
runs Celery's own command line (``celery.__main__.main``) with the arguments ``python -m celery`` would get. A forked
worker is a real process of its own: SIGTERM and SIGKILL reach it as they reach any other, and its exit status is
the one ``subprocess.Popen`` would report (the zygote reaps it and answers ``poll``).

What cannot be forked is started with ``subprocess.Popen`` as before: a worker whose environment preloads a library
(``LD_PRELOAD``: libfaketime, harness/partitions.py's skewed clocks) or any worker when ``RECKON_TEST_FORK=0``.

    python -m harness.zygote <socket>   # the zygote itself (started by Zygote, one per test process)
"""

import atexit
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# What a worker imports before it reads a message, as far as it can be imported without settings (measured with
# python -X importtime on a worker): Celery's command line and worker, the broker transports, Django's ORM and HTTP
# layers, the database drivers, pydantic, httpx, cryptography (ninja reads settings as it is imported: not here).
PRELOAD = (
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.worker.consumer",
    "celery.concurrency.solo",
    "kombu.transport.redis",
    "kombu.transport.filesystem",
    "kombu.transport.pyamqp",
    "django.db.models",
    "django.http",
    "django.urls",
    "django.core.checks",
    "django.core.serializers.json",
    "django.utils.log",
    "django.views.generic",
    "django.db.backends.postgresql.base",
    "django.db.backends.sqlite3.base",
    "psycopg",
    "redis",
    "pydantic.main",
    "pydantic.fields",
    "httpx",
    "cryptography.hazmat.primitives.ciphers.aead",
    "cryptography.hazmat.primitives.hmac",
)


def worker_command(queues: str, name: str | None = None, *, loglevel: str = "WARNING") -> list[str]:
    """The command line of a solo-pool worker consuming ``queues`` (comma-separated), as ``python -m celery`` takes it:
    no heartbeat, mingle or gossip (a test's worker talks to no other)."""
    command = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool=solo", "-Q", queues]
    if name is not None:
        command += ["-n", name]
    return [*command, "--without-heartbeat", "--without-mingle", "--without-gossip", f"--loglevel={loglevel}"]


class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use, for a process the zygote forked: its pid, ``poll``, ``wait``,
    ``terminate``, ``kill``, ``send_signal`` and ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, zygote: "Zygote", pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Process = subprocess.Popen[bytes] | ForkedProcess


def start_worker(command: list[str], *, env: dict[str, str], cwd: Path = ROOT, log: Path | None = None) -> Process:
    """Start ``command`` (from ``worker_command``) with exactly ``env``, in ``cwd``, its output appended to ``log``
    (or to this process's own): forked from this process's zygote unless it cannot be (the module's docstring)."""
    if os.environ.get("RECKON_TEST_FORK", "1") == "0" or env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        return _popen(command, env, cwd, log)
    return _zygote().start(command, env=env, cwd=cwd, log=log)


def _popen(command: list[str], env: dict[str, str], cwd: Path, log: Path | None) -> subprocess.Popen[bytes]:
    if log is None:
        return subprocess.Popen(command, cwd=cwd, env=env)  # noqa: S603
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=out)  # noqa: S603


class Zygote:
    """The zygote process of this (test) process, and the requests sent to it over its Unix socket: one JSON line
    each way per request."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="reckon-zygote-")
        self.path = str(Path(self.directory) / "socket")
        self.process = subprocess.Popen(  # noqa: S603 - this interpreter, this module
            [sys.executable, "-m", "harness.zygote", self.path], cwd=ROOT, stdout=subprocess.PIPE
        )
        assert self.process.stdout is not None  # noqa: S101 - stdout=PIPE
        if self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the zygote exited with {self.process.wait()} before it was ready")
        self.lock = threading.Lock()

    def start(self, command: list[str], *, env: dict[str, str], cwd: Path, log: Path | None) -> ForkedProcess:
        if command[:3] != [sys.executable, "-m", "celery"]:
            raise ValueError(f"the zygote forks Celery workers of this interpreter only, not {command[:3]}")
        request = {"start": command[3:], "env": env, "cwd": str(cwd), "log": None if log is None else str(log)}
        return ForkedProcess(self, int(self._ask(request)["pid"]), command)

    def status(self, pid: int) -> int | None:
        code = self._ask({"status": pid})["returncode"]
        return None if code is None else int(code)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer: dict[str, Any] = json.loads(sock.makefile("rb").readline())
        if "error" in answer:
            raise RuntimeError(f"the zygote refused {request}: {answer['error']}")
        return answer

    def close(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.directory)


_current: dict[int, Zygote] = {}  # by pid: a process forked from one that had a zygote starts its own


def _zygote() -> Zygote:
    pid = os.getpid()
    if pid not in _current:
        _current[pid] = Zygote()
        atexit.register(_current[pid].close)
    return _current[pid]


# -- the zygote process ----------------------------------------------------------------------------------------------


_exited: dict[int, int] = {}


def _reap(*_: object) -> None:
    """Record every child that has ended, as Popen reports it (negative: the signal that ended it)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _exited[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _serve(path: str) -> None:
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)  # no module may read settings here: they are each worker's
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # a module that needs settings is imported by the worker instead
            importlib.import_module(name)
    from django.conf import settings

    if settings.configured:  # pragma: no cover - a module of PRELOAD configured them: every worker would share them
        raise RuntimeError("the zygote's imports configured Django's settings")
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, _reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    print("ready", flush=True)
    os.dup2(2, 1)  # a worker started without a log writes where the test process does, not to this pipe
    while os.getppid() == parent:  # the test process is gone: so is its zygote
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(None)
            request = json.loads(conn.makefile("rb").readline())
            _reap()
            if "status" in request:
                answer: dict[str, Any] = {"returncode": _exited.get(int(request["status"]))}
            else:
                try:
                    answer = {"pid": _fork(request, listener, conn)}
                except OSError as exc:
                    answer = {"error": str(exc)}
            conn.sendall(json.dumps(answer).encode() + b"\n")


def _fork(request: dict[str, Any], listener: socket.socket, conn: socket.socket) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the worker: never returns to the zygote's loop
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        listener.close()
        conn.close()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        with open(os.devnull, "rb") as null:
            os.dup2(null.fileno(), 0)
        if request["log"] is not None:
            fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        sys.argv = ["celery", *request["start"]]
        from celery.__main__ import main

        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(sys.argv[1])
