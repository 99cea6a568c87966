"""The three remotes of the contract suite, each a real server, and one adapter per connector giving the suite what it
needs: a connector (through a fault proxy of its own), a fresh write, the remote's effect count for that write (read at
the remote directly, never through the connector or the proxy), and a source whose version the test can change.

- PostgreSQL: the machine's server (127.0.0.1:5432, user postgres), two databases made for the run and dropped after
  it; a write copies 50 rows of ``items`` into a fresh target table without a primary key, so a copy made twice shows
  as 100 rows.
- S3: moto's standalone server in this process, one versioned bucket: a write puts a fresh key, and every PUT that
  lands on it is a version of its own.
- HTTP: harness/idempotent_api.py, counting transfers per ``ref``.
"""

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import uuid4

import boto3  # type: ignore[import-untyped]
import psycopg
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from psycopg import sql
from reckon_client.connectors.http import HttpConnector
from reckon_client.connectors.postgres import PostgresConnector
from reckon_client.connectors.s3 import S3Connector
from werkzeug.serving import make_server

from harness.faultproxy import FaultProxy
from harness.idempotent_api import IdempotentApi
from tests.connectors.specs import HARNESS_API

PG_SERVER = "host=127.0.0.1 port=5432 user=postgres"
BUCKET = "reckon-connectors"
SOURCE_KEY = "sources/source.txt"
BATCH = (101, 150)  # the rows a PostgreSQL write copies: 50 of them
BATCH_ROWS = BATCH[1] - BATCH[0] + 1

ITEMS_COLUMNS = (
    "id int {key}, name text NOT NULL, price numeric(10, 2), at timestamptz, tags text[], payload jsonb, blob bytea"
)
ITEMS_ROWS = """
INSERT INTO items
SELECT g,
       'item ' || g || CASE WHEN g % 7 = 0 THEN ' "quoted", (comma) ü' ELSE '' END,
       g * 1.25,
       timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour 1 second',
       ARRAY['t' || (g % 3), NULL],
       jsonb_build_object('g', g, 'half', g / 2.0),
       decode(lpad(to_hex(g), 6, '0'), 'hex')
FROM generate_series(1, 400) AS g
"""

_names = itertools.count(1)


def op_key() -> str:
    return f"rk-test-{uuid4().hex}"


def deadline(seconds: float = 30.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


class Remote(Protocol):
    """What the contract suite asks of each remote."""

    kind: str
    proxy: FaultProxy
    source_locator: str
    missing_locator: str

    def connector(self, **options: Any) -> Any: ...
    def write(self, not_after: str | None = None) -> dict[str, Any]: ...
    def effects(self, request: dict[str, Any]) -> int: ...
    def change_source(self) -> None: ...
    def bad_requests(self) -> list[object]: ...
    def spec(self) -> dict[str, Any]: ...


# -- PostgreSQL ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PgDatabases:
    source: str
    target: str


def make_pg_databases(suffix: str) -> PgDatabases:
    names = (f"reckon_conn_src_{suffix}", f"reckon_conn_dst_{suffix}")
    with psycopg.connect(f"{PG_SERVER} dbname=postgres", autocommit=True) as admin:
        for name in names:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    databases = PgDatabases(f"{PG_SERVER} dbname={names[0]}", f"{PG_SERVER} dbname={names[1]}")
    with psycopg.connect(databases.source) as source:
        source.execute(sql.SQL("CREATE TABLE items (" + ITEMS_COLUMNS.format(key="PRIMARY KEY") + ")"))
        source.execute(ITEMS_ROWS)
    return databases


def drop_pg_databases(databases: PgDatabases) -> None:
    with psycopg.connect(f"{PG_SERVER} dbname=postgres", autocommit=True) as admin:
        for conninfo in (databases.source, databases.target):
            name = conninfo.rsplit("dbname=", 1)[1]
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def pg_query(conninfo: str, query: Any, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cursor = conn.execute(query, tuple(params))
        return cursor.fetchall() if cursor.description else []


def new_target_table(databases: PgDatabases) -> str:
    """A fresh table at the target with the source's columns and no primary key: a copy made twice shows."""
    name = f"copy_{next(_names)}_{uuid4().hex[:6]}"
    pg_query(
        databases.target, sql.SQL("CREATE TABLE {} (" + ITEMS_COLUMNS.format(key="") + ")").format(sql.Identifier(name))
    )
    return name


class PgRemote:
    kind = "postgres"
    source_locator = "public.items"
    missing_locator = "public.no_such_table"

    def __init__(self, databases: PgDatabases, proxy: FaultProxy) -> None:
        self.databases, self.proxy = databases, proxy
        dbname = databases.target.rsplit("dbname=", 1)[1]
        self.target_via_proxy = f"host=127.0.0.1 port={proxy.port} user=postgres dbname={dbname}"

    def connector(self, **options: Any) -> PostgresConnector:
        return PostgresConnector(source=self.databases.source, target=self.target_via_proxy, **options)

    def write(self, not_after: str | None = None) -> dict[str, Any]:
        table = new_target_table(self.databases)
        given = {"source": "public.items", "target": f"public.{table}", "key": "id", "range": list(BATCH)}
        return {"action": "copy_batch", "input": given, "not_after": not_after or deadline()}

    def effects(self, request: dict[str, Any]) -> int:
        table = request["input"]["target"].split(".")
        (rows,) = pg_query(self.databases.target, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*table)))[0]
        assert rows % BATCH_ROWS == 0, f"{rows} rows: a batch landed in part"
        return int(rows) // BATCH_ROWS

    def change_source(self) -> None:
        pg_query(self.databases.source, "UPDATE items SET name = name || '!' WHERE id = 1")

    def bad_requests(self) -> list[object]:
        good = self.write()["input"]
        return [
            {"action": "drop_everything", "input": good},
            {"action": "copy_batch", "input": good | {"source": "items; DROP TABLE items"}},
            {"action": "copy_batch", "input": good | {"target": 'public."items"'}},
            {"action": "copy_batch", "input": good | {"key": "id = id OR 1"}},
            {"action": "copy_batch", "input": good | {"range": "1-50"}},
            {"action": "copy_batch", "input": good | {"range": [1, "50"]}},
            {"action": "copy_batch", "input": good | {"range": [50, 1]}},
            {"action": "copy_batch", "input": good | {"keys": [1, 2]}},
            {"action": "copy_batch", "input": {k: v for k, v in good.items() if k != "key"}},
            {"action": "copy_batch", "input": good | {"source": "public.no_such_table"}},
            {"action": "copy_batch", "input": good | {"key": "no_such_column"}},
            {"action": "switch", "input": {"view": "v", "table": "a.b.c"}},
        ]

    def spec(self) -> dict[str, Any]:
        return {"kind": "postgres", "source": self.databases.source, "target": self.databases.target}


# -- S3 -----------------------------------------------------------------------------------------------------------


class AtomicMotoServer(ThreadedMotoServer):
    """moto's standalone server, one request at a time. moto checks a conditional write's precondition and then
    stores the object in two steps without a lock; S3 does both atomically. Serialized, moto is atomic as S3 is, so a
    race the tests run is between the connector's requests, not inside moto."""

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        lock = threading.Lock()

        def one_at_a_time(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
            with lock:
                return list(app(environ, start_response))

        self._server = make_server(
            self._ip_address, self._port, one_at_a_time, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()


def s3_client(endpoint_url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def make_bucket(endpoint_url: str) -> Any:
    admin = s3_client(endpoint_url)
    admin.create_bucket(Bucket=BUCKET)
    admin.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    admin.put_object(Bucket=BUCKET, Key=SOURCE_KEY, Body=b"the source, first version")
    return admin


class S3Remote:
    kind = "s3"
    source_locator = SOURCE_KEY
    missing_locator = "sources/no-such-object.txt"

    def __init__(self, admin: Any, proxy: FaultProxy, endpoint_url: str) -> None:
        self.admin, self.proxy, self.endpoint_url = admin, proxy, endpoint_url

    def connector(self, **options: Any) -> S3Connector:
        return S3Connector.connect(
            BUCKET,
            endpoint_url=f"http://127.0.0.1:{self.proxy.port}",
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            timeout=5.0,
            prefix="reckon",
            **options,
        )

    def write(self, not_after: str | None = None) -> dict[str, Any]:
        key = f"objects/{uuid4().hex}.txt"
        return {
            "action": "put",
            "input": {"key": key, "body": f"content of {key}"},
            "not_after": not_after or deadline(),
        }

    def effects(self, request: dict[str, Any]) -> int:
        key = request["input"]["key"]
        versions = self.admin.list_object_versions(Bucket=BUCKET, Prefix=key).get("Versions") or []
        return sum(1 for version in versions if version["Key"] == key)

    def change_source(self) -> None:
        self.admin.put_object(Bucket=BUCKET, Key=SOURCE_KEY, Body=f"the source, changed {uuid4().hex}".encode())

    def bad_requests(self) -> list[object]:
        good = self.write()["input"]
        return [
            {"action": "overwrite_everything", "input": good},
            {"action": "put", "input": {"body": "no key"}},
            {"action": "put", "input": good | {"body": 42}},
            {"action": "put", "input": good | {"key": "reckon/.reckon/ops/forged"}},
            {"action": "put", "input": good | {"key": "k" * 1025}},
            {"action": "put", "input": good | {"replaces": 7}},
            {"action": "copy", "input": {"key": good["key"], "source": "sources/no-such-object.txt"}},
        ]

    def spec(self) -> dict[str, Any]:
        return {"kind": "s3", "bucket": BUCKET, "endpoint_url": self.endpoint_url, "options": {"prefix": "reckon"}}


# -- HTTP ---------------------------------------------------------------------------------------------------------

SOURCE_NAME = "ledger-2026"


class HttpRemote:
    kind = "http"
    source_locator = SOURCE_NAME
    missing_locator = "no-such-source"

    def __init__(self, api: IdempotentApi, proxy: FaultProxy) -> None:
        self.api, self.proxy = api, proxy

    def connector(self, **options: Any) -> HttpConnector:
        return HttpConnector(f"http://127.0.0.1:{self.proxy.port}", options.pop("api", HARNESS_API), **options)

    def write(self, not_after: str | None = None) -> dict[str, Any]:
        given = {"ref": uuid4().hex, "amount": 100, "to": "acct_1"}
        return {"action": "transfer", "input": given, "not_after": not_after or deadline()}

    def effects(self, request: dict[str, Any]) -> int:
        return self.api.effects(request["input"]["ref"])

    def change_source(self) -> None:
        self.api.set_source(SOURCE_NAME, uuid4().hex)

    def bad_requests(self) -> list[object]:
        good = self.write()["input"]
        return [
            {"action": "steal", "input": good},
            {"action": "transfer", "input": good | {"amount": "a lot"}},
            {"action": "transfer", "input": {"ref": good["ref"]}},
            {"action": "reverse", "input": {"ref": good["ref"]}},
            {"action": "reverse", "input": {"id": ""}},
        ]

    def spec(self) -> dict[str, Any]:
        return {"kind": "http", "url": self.api.url}
