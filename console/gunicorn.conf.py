"""Gunicorn's configuration for Reckon's web processes (the console and the agent API): ``./dev serve`` runs
``gunicorn -c console/gunicorn.conf.py``. Everything a deployment tunes comes from the environment:

RECKON_BIND          where to listen (default 127.0.0.1:8000; several addresses separated by commas)
RECKON_WEB_WORKERS   worker processes (default 2 x cores + 1, at most 8)
RECKON_WEB_THREADS   threads per worker (default 4)
RECKON_WEB_TIMEOUT   seconds a worker may go silent before the master replaces it (default 30)

Worker class: gthread. A request to Reckon is a few short database round trips (a read, or one conditional write),
so a worker spends most of a request waiting on the database, not on the CPU: threads let one process overlap
those waits, and their connections are kept alive between an agent's requests (the Python client reuses its
connection; a sync worker closes it after every response). A slow or idle client holds one thread, never a whole
process (gunicorn parks a connection that sends nothing on its poller). Each thread keeps its own persistent
database connection (CONN_MAX_AGE), so a machine opens at most workers x threads connections: 8 x 4 = 32 by
default, which leaves room in PostgreSQL's default 100 for the Celery workers and a second web machine.

Not preloaded: each worker imports Django itself after the fork, so no database connection or lock made in the
master is ever shared by two processes, and ``kill -HUP`` reloads the code worker by worker.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# More processes than this cost memory and database connections without adding throughput: the database is the
# bottleneck long before eight processes of four threads are busy.
MAX_DEFAULT_WORKERS = 8


def _cores() -> int:
    """The CPUs this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(cores: int) -> int:
    return min(2 * cores + 1, MAX_DEFAULT_WORKERS)


def _positive(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    value = int(text)
    if value < 1:
        raise ValueError(f"{name} must be a positive whole number, not {text!r}")
    return value


wsgi_app = "console.wsgi:application"
chdir = str(ROOT)
bind = [address.strip() for address in os.environ.get("RECKON_BIND", "127.0.0.1:8000").split(",") if address.strip()]

worker_class = "gthread"
workers = _positive("RECKON_WEB_WORKERS", default_workers(_cores()))
threads = _positive("RECKON_WEB_THREADS", 4)
preload_app = False

# A worker whose main loop is silent this long is killed and replaced (its threads' requests are lost: the agents
# retry them, every write is idempotent or compare-and-set).
timeout = _positive("RECKON_WEB_TIMEOUT", 30)
# SIGTERM is the graceful stop: the workers stop accepting, requests in flight finish within this many seconds, then
# everything exits (SIGINT and SIGQUIT stop at once). A deployment's stop timeout (systemd's TimeoutStopSec,
# Kubernetes' terminationGracePeriodSeconds) should be longer than this.
graceful_timeout = 25
# An agent's client or a reverse proxy reuses a connection for the next request within this many seconds.
keepalive = 5

# One line per request on stdout, with the worker process that served it (the "pid=" field).
accesslog = "-"
access_log_format = '%(h)s %(t)s "%(r)s" %(s)s %(b)s %(M)sms "%(a)s" pid=%(p)s'
errorlog = "-"
loglevel = os.environ.get("RECKON_LOG_LEVEL", "info").lower()
proc_name = "reckon-web"

# The heartbeat file each worker touches: in memory where there is /dev/shm, so a slow disk never stalls a worker.
worker_tmp_dir = "/dev/shm" if Path("/dev/shm").is_dir() else None  # noqa: S108
# Gunicorn's runtime control socket (gunicornc) lives at one path per user: two servers on a machine would fight over
# it, and Reckon does not use it.
control_socket_disable = True
