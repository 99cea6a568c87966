"""DATABASE_URL → Django's DATABASES entry, with PostgreSQL's multi-host form.

``postgres://user@db1:5432,db2:5432/reckon?target_session_attrs=read-write`` names a primary and its standbys: libpq
tries each host in turn and keeps the first that takes writes, so after a failover every process reconnects to the
promoted standby by itself (docs/operations.md, "Highly available PostgreSQL"). dj-database-url reads one host; this
reads the list and hands it to psycopg as libpq's comma-separated ``host`` and ``port``.
"""

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url


class MultiHostInvalid(ValueError):
    """A multi-host DATABASE_URL that names no host, or a port that is not a number."""


def parse_database_url(url: str, **options: Any) -> dict[str, Any]:
    """``dj_database_url.parse(url, **options)``, reading every host of a PostgreSQL multi-host URL."""
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if parts.scheme not in ("postgres", "postgresql", "pgsql") or "," not in hostlist:
        return dict(dj_database_url.parse(url, **options))
    hosts, ports = [], []
    for entry in hostlist.split(","):
        host, colon, port = entry.rpartition(":") if not entry.endswith("]") else (entry, "", "")
        if not colon:
            host, port = entry, ""
        if not host:
            raise MultiHostInvalid(f"DATABASE_URL names an empty host in {hostlist!r}")
        if port and not port.isdigit():
            raise MultiHostInvalid(f"DATABASE_URL: port {port!r} of host {host!r} is not a number")
        hosts.append(host)
        ports.append(port or "5432")
    first = urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hosts[0]}:{ports[0]}"))
    config = dict(dj_database_url.parse(first, **options))
    config["HOST"], config["PORT"] = ",".join(hosts), ",".join(ports)
    return config


def with_postgres_options(config: dict[str, Any], *, prepare: bool = True) -> dict[str, Any]:
    """``config`` (a PostgreSQL entry) with Reckon's connection options, the URL's own kept where it sets them. The
    step's statements bind on the server (leases/db.py) and are prepared after five runs on a connection (Django's
    own cursors bind on the client and are never prepared); ``prepare=False`` keeps preparing off, for a pooler in
    transaction mode that does not track prepared statements. Reckon's queries are short OLTP reads and writes: JIT
    compilation costs more than it saves whenever the planner over-estimates (measured: 7 s of a needs-attention page
    over 100,000 tasks was JIT compiling)."""
    options = config.setdefault("OPTIONS", {})
    options["prepare_threshold"] = 5 if prepare else None
    options.setdefault("options", "-c jit=off")
    return config
