"""The failover row of ``verify_matrix --partitions --scenario failover``: the primary killed mid-run, its synchronous
standby promoted, every process reconnecting through a multi-host connection string.

The row makes two PostgreSQL clusters of its own on free ports (``initdb``; ``pg_basebackup`` of the first, streaming
from it as its synchronous standby: ``synchronous_standby_names``, ``synchronous_commit = on``) — never the
machine's cluster. Every process — this controller and the Celery workers — reaches them through one URL,
``postgres://…@127.0.0.1:<primary>,127.0.0.1:<standby>/reckon?target_session_attrs=read-write``
(console/database_url.py): libpq tries the hosts in turn and keeps the one that takes writes. Once a third of the
tasks have begun, the primary is stopped in immediate mode (every backend killed, no checkpoint: a crash) and the
standby promoted. The workers are never restarted: a wake-up that meets the dead connection is retried, and the next
connection finds the new primary. The row is judged as the kill matrix judges it (duplicates, skips, unknowns left,
every task completed) and, beside it:

- **lost commits**: each task's version read on the primary just before the kill, against the same task's version
  on the new primary after the run — a version that went back is a commit lost (a synchronous standby makes a commit
  visible only once the standby has it);
- **the log**: every task's event log verifies on the new primary (``find_log_problem``);
- **one holder at a time**: no lease of a task was granted before the previous one ended — released, or expired on
  the database clock of the server that granted the next (after the promotion, the new primary's). The two servers
  share this machine's clock here, so the row proves the judgement is the database's, not that a clock difference
  between them is absorbed (docs/operations.md says what keeps servers' clocks close).
"""

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connection

from harness.ports import free_port

DATABASE = "reckon"
STANDBY_NAME = "reckon_standby"


class NeedsPostgresBinaries(RuntimeError):
    """The failover row makes its own clusters: PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup)."""


def _binary(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    if shutil.which(name):
        return name
    raise NeedsPostgresBinaries(f"the failover row needs PostgreSQL's {name} (apt-get install postgresql)")


def _as_owner(command: list[str], owner: str) -> list[str]:
    """Run as the clusters' owner when this process is root (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", owner, "--", *command] if os.geteuid() == 0 else command


@dataclass
class Cluster:
    data: Path
    port: int
    owner: str

    def run(self, *command: str, timeout: float = 120) -> None:
        subprocess.run(  # noqa: S603 - fixed binaries, our own paths
            _as_owner(list(command), self.owner),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )

    def start(self) -> None:
        log = str(self.data / "server.log")
        self.run(_binary("pg_ctl"), "-D", str(self.data), "-l", log, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        with suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.run(_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def promote(self) -> None:
        self.run(_binary("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def query(self, sql: str, database: str = "postgres") -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database, autocommit=True, connect_timeout=5
        ) as conn:
            cursor = conn.execute(sql)  # fixed statements of this module
            return list(cursor.fetchall()) if cursor.description is not None else []


@dataclass
class Pair:
    primary: Cluster
    standby: Cluster

    @property
    def url(self) -> str:
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgres://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write&connect_timeout=2"


SERVER_SETTINGS = (
    "listen_addresses = '127.0.0.1'",
    "wal_level = replica",
    "max_wal_senders = 4",
    "synchronous_commit = on",
    "max_connections = 80",
    "shared_buffers = 64MB",
    "jit = off",
)


@contextmanager
def pg_pair(workdir: Path) -> Iterator[Pair]:
    """A primary and its synchronous standby, streaming, on free ports; stopped and deleted after."""
    import pwd

    base = workdir / "pg"
    base.mkdir()
    owner = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        record = pwd.getpwnam(owner)
        for path in (workdir, base):
            os.chown(path, record.pw_uid, record.pw_gid)
    primary = Cluster(base / "primary", free_port(), owner)
    standby = Cluster(base / "standby", free_port(), owner)
    try:
        primary.run(_binary("initdb"), "-D", str(primary.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        _configure(primary, base, f"synchronous_standby_names = '{STANDBY_NAME}'")
        primary.start()
        primary.run(
            _binary("pg_basebackup"),
            "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.data), "-X", "stream", "-R", "--checkpoint=fast",
        )  # fmt: skip
        # The standby's own port and name; once promoted it waits for no standby of its own.
        _configure(standby, base, "synchronous_standby_names = ''")
        with (standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
                f"application_name={STANDBY_NAME}'\n"
            )
        standby.start()
        _wait_until_synchronous(primary)
        primary.query(f"CREATE DATABASE {DATABASE}")
        yield Pair(primary, standby)
    finally:
        for cluster in (standby, primary):
            if cluster.data.exists():
                cluster.stop("immediate")


def _configure(cluster: Cluster, sockets: Path, *extra: str) -> None:
    with (cluster.data / "postgresql.conf").open("a") as conf:
        for line in (*SERVER_SETTINGS, f"port = {cluster.port}", f"unix_socket_directories = '{sockets}'", *extra):
            conf.write(line + "\n")


def _wait_until_synchronous(primary: Cluster, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = primary.query("SELECT application_name, sync_state FROM pg_stat_replication")
        if (STANDBY_NAME, "sync") in states:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the standby did not become synchronous in {seconds:.0f} s")


@contextmanager
def connected_to(url: str) -> Iterator[None]:
    """This process's default connection on ``url`` (migrated), the configured one again after."""
    from console.database_url import parse_database_url, with_postgres_options

    config = with_postgres_options(parse_database_url(url, conn_max_age=0, conn_health_checks=True))
    kept = {name: connection.settings_dict.get(name) for name in config}
    connection.close()
    connection.settings_dict.update(config)
    settings.DATABASES["default"].update(config)
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield
    finally:
        connection.close()
        connection.settings_dict.update(kept)
        settings.DATABASES["default"].update(kept)


def versions(ids: list[int]) -> dict[int, int]:
    from tasks.models import Task

    return dict(Task.objects.filter(pk__in=ids).values_list("pk", "version"))


def lost_commits(before: dict[int, int], after: dict[int, int]) -> list[str]:
    """Each task whose version on the new primary is below the one the old primary showed before its crash."""
    return [
        f"task {task_id}: version {version} before the failover, {after.get(task_id)} after"
        for task_id, version in sorted(before.items())
        if after.get(task_id, -1) < version
    ]


def log_problems(ids: list[int]) -> list[str]:
    from tasks.engine.events import find_log_problem
    from tasks.models import Task

    found = []
    for task in Task.objects.filter(pk__in=ids):
        problem = find_log_problem(task)
        if problem:
            found.append(f"task {task.pk}: {problem}")
    return found


def lease_problems(ids: list[int]) -> list[str]:
    """Two holders of one task at once: a lease granted before the previous one ended (released, or expired — on the
    database clock of the server that granted the next). Across a failover this is the lease judged on the new
    primary's clock: a takeover granted there before the old holder's time was up would show here."""
    from leases.models import Lease

    found = []
    by_task: dict[int, list[Lease]] = {}
    for lease in Lease.objects.filter(task_id__in=ids).order_by("task_id", "epoch"):
        by_task.setdefault(lease.task_id, []).append(lease)
    for task_id, leases in by_task.items():
        for before, after in pairwise(leases):
            ended = before.released_at if before.released_at is not None else before.expires_at
            if after.granted_at < ended:
                found.append(
                    f"task {task_id}: lease epoch {after.epoch} granted at {after.granted_at}, before epoch "
                    f"{before.epoch} ended at {ended}"
                )
    return found
