"""A fault proxy in the manner of toxiproxy: a TCP relay put between a worker and what it talks to (PostgreSQL, the
simulator), whose faults a test or the partition scenarios switch on and off while the worker runs.

    with FaultProxy(("127.0.0.1", 5432)) as proxy:      # listens on 127.0.0.1:<free port>
        ...  # the worker's DATABASE_URL names proxy.port
        proxy.blackhole()                                # both directions: bytes are read and held
        proxy.heal()                                     # held bytes delivered, in order; everything passes again

Stdlib only (threads; toxiproxy itself is a Go server not in the registries this project installs from). The proxy
runs inside the controlling process — the test, or harness/partitions.py — and the workers, other processes, connect
through it, so the controller needs no control channel of its own: it calls the methods below.

Faults, per direction (``"up"``: client → upstream, ``"down"``: upstream → client, ``"both"``):

- ``pass_through``: bytes are relayed as they come.
- ``latency(ms)``: each chunk is held ``ms`` milliseconds before it is relayed (in order).
- ``blackhole``: the connection stays open and the proxy goes on reading, but nothing is relayed — a partition.
  ``heal`` delivers what was held, in order, as TCP's retransmissions would once a partition heals before the
  sockets give up: a write sent before the partition reaches the server late. ``cut`` (the sockets gave up) drops it.

And for the whole proxy:

- ``cut``: every open connection is reset (RST on both sides); held bytes are dropped. New connections are accepted.
- ``refuse``: new connections are reset as soon as they are accepted (the client's connect or first read fails);
  open ones are untouched.
- ``heal``: everything passes again, nothing is refused; held bytes are delivered.

``stats()`` counts connections accepted, refused and cut, and bytes relayed and held, per direction.
"""

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, TypedDict

Direction = Literal["up", "down", "both"]
DIRECTIONS: tuple[Literal["up"], Literal["down"]] = ("up", "down")
CHUNK = 65536


class FaultProxyError(ValueError):
    """A fault asked for with a bad argument (an unknown direction, a negative latency)."""


class ProxyStats(TypedDict):
    open: int
    accepted: int
    refused: int
    cut: int
    relayed: dict[str, int]  # bytes, per direction
    held: dict[str, int]  # bytes a blackhole took in, per direction (delivered on heal or dropped by a cut)
    modes: dict[str, str]
    refusing: bool


@dataclass
class _Mode:
    kind: Literal["pass", "latency", "blackhole"] = "pass"
    ms: int = 0


@dataclass
class _Stats:
    accepted: int = 0
    refused: int = 0
    cut: int = 0
    relayed: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    held: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets an RST, not an orderly FIN (a connection that broke, not one closed)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)  # wakes a pump blocked in recv (sends nothing); the close then sends the RST
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its upstream connection: two pumps, and the bytes a blackhole holds."""

    def __init__(self, proxy: "FaultProxy", client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.lock = threading.Lock()  # a pump's relay and a heal's flush of the same direction never interleave
        self.held: dict[str, list[bytes]] = {"up": [], "down": []}
        self.ended: set[str] = set()  # directions whose source has closed
        self.closed = False

    def start(self) -> None:
        for direction, source, target in (("up", self.client, self.upstream), ("down", self.upstream, self.client)):
            threading.Thread(
                target=self._pump, args=(direction, source, target), daemon=True, name=f"faultproxy-{direction}"
            ).start()

    def _pump(self, direction: str, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    break
                mode = self.proxy._mode(direction)
                if mode.kind == "latency":
                    time.sleep(mode.ms / 1000)
                with self.lock:
                    if self.closed:
                        return
                    if self.proxy._mode(direction).kind == "blackhole" or self.held[direction]:
                        # Held, and behind anything already held: a heal delivers it all in order.
                        self.held[direction].append(data)
                        self.proxy._count("held", direction, len(data))
                        if self.proxy._mode(direction).kind != "blackhole":
                            self._flush(direction)
                        continue
                    self.proxy._count("relayed", direction, len(data))
                    target.sendall(data)
        except OSError:
            pass
        # One side closed (or broke): pass the end of stream on once everything held is out (a heal does it then).
        with self.lock:
            self.ended.add(direction)
            if self.closed:
                return
            if not self.held[direction]:
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)
            if self.ended == {"up", "down"}:
                self.closed = True
                self.client.close()
                self.upstream.close()

    def _flush(self, direction: str) -> None:
        """Deliver what ``direction`` holds (the caller holds the lock)."""
        target = self.upstream if direction == "up" else self.client
        while self.held[direction]:
            data = self.held[direction].pop(0)
            self.proxy._count("relayed", direction, len(data))
            try:
                target.sendall(data)
            except OSError:
                self.held[direction].clear()
                return
        if direction in self.ended:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)

    def heal(self) -> None:
        with self.lock:
            for direction in DIRECTIONS:
                if self.proxy._mode(direction).kind != "blackhole":
                    self._flush(direction)

    def cut(self) -> None:
        with self.lock:
            self.closed = True
            self.held = {"up": [], "down": []}
        _reset(self.client)
        _reset(self.upstream)


class FaultProxy:
    """A TCP relay from ``listen`` (127.0.0.1, a free port by default) to ``upstream``, with faults switched at
    run time. Start it with ``start()`` or ``with``; ``port`` is the port to give the client."""

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._modes: dict[str, _Mode] = {"up": _Mode(), "down": _Mode()}
        self._refusing = False
        self._links: list[_Link] = []
        self._stats = _Stats()
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._thread: threading.Thread | None = None
        self._stopped = False

    # -- life ----------------------------------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        if self._thread is None:
            self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="faultproxy-accept")
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and reset every open connection."""
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self._take_links():
            link.cut()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- faults --------------------------------------------------------------------------------------------------

    def pass_through(self, direction: Direction = "both") -> None:
        self._set(direction, _Mode())

    def latency(self, ms: int, direction: Direction = "both") -> None:
        if not isinstance(ms, int) or ms < 0:
            raise FaultProxyError(f"latency must be a non-negative number of milliseconds, not {ms!r}")
        self._set(direction, _Mode("latency", ms))

    def blackhole(self, direction: Direction = "both") -> None:
        self._set(direction, _Mode("blackhole"))

    def refuse(self, refusing: bool = True) -> None:
        with self._lock:
            self._refusing = refusing

    def cut(self) -> int:
        """Reset every open connection; return how many."""
        links = self._take_links()
        for link in links:
            link.cut()
        with self._lock:
            self._stats.cut += len(links)
        return len(links)

    def heal(self) -> None:
        """Every direction passes, new connections are accepted, held bytes are delivered in order."""
        with self._lock:
            self._modes = {"up": _Mode(), "down": _Mode()}
            self._refusing = False
            links = list(self._links)
        for link in links:
            link.heal()

    def stats(self) -> ProxyStats:
        with self._lock:
            self._links = [link for link in self._links if not link.closed]
            return {
                "open": len(self._links),
                "accepted": self._stats.accepted,
                "refused": self._stats.refused,
                "cut": self._stats.cut,
                "relayed": dict(self._stats.relayed),
                "held": dict(self._stats.held),
                "modes": {d: m.kind + (f"({m.ms})" if m.kind == "latency" else "") for d, m in self._modes.items()},
                "refusing": self._refusing,
            }

    # -- internals -----------------------------------------------------------------------------------------------

    def _set(self, direction: Direction, mode: _Mode) -> None:
        if direction not in ("up", "down", "both"):
            raise FaultProxyError(f"unknown direction {direction!r} (up, down, both)")
        with self._lock:
            for d in DIRECTIONS if direction == "both" else (direction,):
                self._modes[d] = mode
            links = list(self._links)
        for link in links:  # a direction that passes again delivers what it held
            link.heal()

    def _mode(self, direction: str) -> _Mode:
        with self._lock:
            return self._modes[direction]

    def _count(self, what: Literal["relayed", "held"], direction: str, n: int) -> None:
        with self._lock:
            getattr(self._stats, what)[direction] += n

    def _take_links(self) -> list[_Link]:
        with self._lock:
            links, self._links = self._links, []
        return links

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
                self._stats.accepted += not refusing
                self._stats.refused += refusing
            if refusing:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)  # the upstream itself refuses: so does the proxy
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self._lock:
                self._links.append(link)
            link.start()
