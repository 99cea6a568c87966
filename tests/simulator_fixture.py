"""Runs the object-store simulator as a real process on a free loopback port, for tests."""

import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness.killmatrix import StoreProcess
from tasks.core.lifecycle import FailureClass

ROOT = Path(__file__).resolve().parent.parent

# The store's refusal fault modes and the failure class (DESIGN §6) a connector must give each.
REFUSALS = [
    ("dependency_unavailable", FailureClass.DEPENDENCY_UNAVAILABLE),
    ("permission_revoked", FailureClass.PERMISSION_REVOKED),
    ("invalid_params", FailureClass.INVALID_PARAMS),
    ("version_conflict", FailureClass.CONFLICT),
]


class Simulator:
    """The store's process (harness/killmatrix.py's StoreProcess), restartable on the same state file."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.running: StoreProcess | None = None
        self.url = ""

    def start(self) -> "Simulator":
        self.running = StoreProcess(self.state)
        self.url = self.running.url
        return self

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything the store did not already persist."""
        assert self.running is not None
        os.kill(self.running.process.pid, signal.SIGKILL)
        self.running.process.wait(5)

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()

    def control(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.running is not None
        return self.running.call(path, body)

    def fault(self, mode: str, times: int = 1, **extra: Any) -> None:
        self.control("/_faults", {"mode": mode, "times": times, **extra})

    def set_source(self, locator: str, version: str, digest: str = "") -> None:
        self.control("/_sources", {"locator": locator, "version": version, "digest": digest})

    def stats(self) -> dict[str, Any]:
        return self.control("/_stats")

    def snapshot(self) -> dict[str, Any]:
        """The store's whole state (objects, targets, references, ops, tags, stats)."""
        return self.control("/_state")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """A raw request to the store's API, answering (status, body) for refusals too."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read() or b"{}")
