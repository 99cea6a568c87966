"""A free TCP port for a server the harness or a test starts (or for an address nothing listens on)."""

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that the operating system had free when asked. Nothing listens on it once this returns;
    another process could take it before the caller binds it, which the callers (servers started at once, or an
    address meant to refuse connections) accept."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
