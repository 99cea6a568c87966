"""The servers of the connectors' suite, started once per run, and ``remote``: each connector's adapter with a fault
proxy of its own between the connector and its server (tests/connectors/remotes.py)."""

import logging
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from harness.faultproxy import FaultProxy
from harness.idempotent_api import IdempotentApi
from tests.connectors.remotes import (
    SOURCE_NAME,
    AtomicMotoServer,
    HttpRemote,
    PgDatabases,
    PgRemote,
    Remote,
    S3Remote,
    drop_pg_databases,
    make_bucket,
    make_pg_databases,
)


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[PgDatabases]:
    databases = make_pg_databases(secrets.token_hex(4))
    try:
        yield databases
    finally:
        drop_pg_databases(databases)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[tuple[str, Any]]:
    """moto's S3 at ``http://127.0.0.1:<port>``, and an admin client that talks to it directly."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = AtomicMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint_url = f"http://{host}:{port}"
    try:
        yield endpoint_url, make_bucket(endpoint_url)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def idempotent_api() -> Iterator[IdempotentApi]:
    with IdempotentApi() as api:
        api.set_source(SOURCE_NAME, "1")
        yield api


@pytest.fixture
def api(idempotent_api: IdempotentApi) -> Iterator[IdempotentApi]:
    """The harness API, its faults cleared after the test."""
    yield idempotent_api
    idempotent_api.resume()
    idempotent_api.fail_after_effect(0)
    idempotent_api.stall_answers(0)


def _upstream(address: str) -> tuple[str, int]:
    host, port = address.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def pg(pg_databases: PgDatabases) -> Iterator[PgRemote]:
    with FaultProxy(("127.0.0.1", 5432)) as proxy:
        yield PgRemote(pg_databases, proxy)


@pytest.fixture
def s3(moto_endpoint: tuple[str, Any]) -> Iterator[S3Remote]:
    endpoint_url, admin = moto_endpoint
    with FaultProxy(_upstream(endpoint_url)) as proxy:
        yield S3Remote(admin, proxy, endpoint_url)


@pytest.fixture
def http(api: IdempotentApi) -> Iterator[HttpRemote]:
    with FaultProxy(_upstream(api.url)) as proxy:
        yield HttpRemote(api, proxy)


@pytest.fixture(params=["postgres", "s3", "http"])
def remote(request: pytest.FixtureRequest) -> Remote:
    fixture = {"postgres": "pg", "s3": "s3", "http": "http"}[request.param]
    found: Remote = request.getfixturevalue(fixture)
    return found
