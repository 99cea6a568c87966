"""The fault proxy (harness/faultproxy.py): each fault against a trivial echo server, then against real PostgreSQL
through psycopg — a blackholed query hangs and is answered late once healed, a cut is an OperationalError, a refusal
fails the connect, a heal lets a new connection work."""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from harness.faultproxy import FaultProxy, FaultProxyError


class Echo:
    """An upstream that sends back what it reads and counts the bytes it got (so a test can tell 'the request
    arrived, the answer was held' from 'the request never arrived')."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a connection the proxy resets
            while data := conn.recv(4096):
                self.received += len(data)
                conn.sendall(data)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: Echo) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", echo.port)) as p:
        yield p


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    sock.settimeout(2)
    return sock


def nothing_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        sock.recv(100)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(2)
    return False


def test_pass_relays_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"ping")
        assert sock.recv(100) == b"ping"
    assert proxy.stats()["relayed"] == {"up": 4, "down": 4}


def test_latency_delays_each_chunk_then_relays_it(proxy: FaultProxy) -> None:
    proxy.latency(200, "up")
    with connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"slow")
        assert sock.recv(100) == b"slow"
        assert time.monotonic() - started >= 0.2  # a lower bound: the proxy slept at least that long
    with pytest.raises(FaultProxyError, match="non-negative"):
        proxy.latency(-1)


def test_blackhole_up_holds_the_request_and_heal_delivers_it_late(proxy: FaultProxy, echo: Echo) -> None:
    with connect(proxy) as sock:
        proxy.blackhole("up")
        sock.sendall(b"held")
        assert nothing_within(sock, 0.3)
        assert echo.received == 0  # the request never reached the server
        assert proxy.stats()["held"]["up"] == 4
        proxy.heal()
        assert sock.recv(100) == b"held"  # delivered late, as TCP would once the partition heals


def test_blackhole_down_lets_the_request_through_and_holds_the_answer(proxy: FaultProxy, echo: Echo) -> None:
    with connect(proxy) as sock:
        proxy.blackhole("down")
        sock.sendall(b"done")
        assert nothing_within(sock, 0.3)
        assert echo.received == 4  # the server did the work; its answer never arrived
        proxy.pass_through("down")  # one direction healed: what it held goes out
        assert sock.recv(100) == b"done"


def test_cut_resets_open_connections_and_new_ones_work(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert sock.recv(10) == b"a"
        proxy.blackhole()
        sock.sendall(b"lost")
        assert proxy.cut() == 1
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
    proxy.heal()
    with connect(proxy) as sock:
        sock.sendall(b"new")
        assert sock.recv(10) == b"new"
    assert proxy.stats()["cut"] == 1


def test_refuse_resets_new_connections_but_not_open_ones(proxy: FaultProxy) -> None:
    with connect(proxy) as open_one:
        open_one.sendall(b"1")
        assert open_one.recv(10) == b"1"  # accepted by the proxy, not only by the kernel's backlog
        proxy.refuse()
        with pytest.raises(ConnectionResetError), connect(proxy) as refused:  # at the connect, or at the first read
            refused.sendall(b"x")
            refused.recv(10)
        open_one.sendall(b"still")
        assert open_one.recv(10) == b"still"
    proxy.heal()
    with connect(proxy) as sock:
        sock.sendall(b"ok")
        assert sock.recv(10) == b"ok"
    assert proxy.stats()["refused"] == 1


def test_a_bad_direction_is_refused_by_name(proxy: FaultProxy) -> None:
    with pytest.raises(FaultProxyError, match="unknown direction"):
        proxy.blackhole("sideways")  # type: ignore[arg-type]


# -- real PostgreSQL ---------------------------------------------------------------------------------------------

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason=f"a psycopg connection through the proxy needs PostgreSQL (database vendor is {connection.vendor})",
)


@pytest.fixture
def pg_proxy() -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    db = connection.settings_dict
    with FaultProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))) as p:
        params = {"host": "127.0.0.1", "port": p.port, "user": db["USER"], "dbname": "postgres"}
        params |= {"password": db["PASSWORD"]} if db["PASSWORD"] else {}
        yield p, params


@postgres_only
def test_postgres_blackholed_query_hangs_and_is_answered_once_healed(
    pg_proxy: tuple[FaultProxy, dict[str, Any]],
) -> None:
    proxy, params = pg_proxy
    with psycopg.connect(**params, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.blackhole()
        answer: list[Any] = []
        query = threading.Thread(target=lambda: answer.append(conn.execute("SELECT 2").fetchone()), daemon=True)
        query.start()
        query.join(0.5)
        assert query.is_alive() and not answer  # hangs: the server never saw it
        proxy.heal()
        query.join(5)
        assert answer == [(2,)]  # the held query reached the server late and was answered


@postgres_only
def test_postgres_blackholed_connect_times_out_on_the_client(pg_proxy: tuple[FaultProxy, dict[str, Any]]) -> None:
    proxy, params = pg_proxy
    proxy.blackhole()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**params, connect_timeout=2)  # libpq's smallest timeout: 2 s


@postgres_only
def test_postgres_cut_is_an_operational_error_and_heal_lets_a_new_connection_work(
    pg_proxy: tuple[FaultProxy, dict[str, Any]],
) -> None:
    proxy, params = pg_proxy
    conn = psycopg.connect(**params, autocommit=True)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert proxy.cut() == 1
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()
    proxy.refuse()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**params, connect_timeout=2)
    proxy.heal()
    with psycopg.connect(**params, autocommit=True) as again:
        assert again.execute("SELECT 3").fetchone() == (3,)
