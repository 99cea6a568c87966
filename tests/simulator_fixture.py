"""Runs the object-store simulator as a real process on a free loopback port, for tests."""

import json
import os
import select
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tasks.lifecycle import FailureClass

ROOT = Path(__file__).resolve().parent.parent

# The store's refusal fault modes and the failure class (DESIGN §6) a connector must give each.
REFUSALS = [
    ("dependency_unavailable", FailureClass.DEPENDENCY_UNAVAILABLE),
    ("permission_revoked", FailureClass.PERMISSION_REVOKED),
    ("invalid_params", FailureClass.INVALID_PARAMS),
    ("version_conflict", FailureClass.CONFLICT),
]


class Simulator:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> "Simulator":
        command = [sys.executable, "-m", "tasks.connectors.simulator", "--port", "0", "--state", str(self.state)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # noqa: S603
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 10)
        line = self.process.stdout.readline() if ready else ""
        assert line.startswith("listening on "), f"the simulator did not start: {line!r}"
        self.url = line.removeprefix("listening on ").strip()
        return self

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything the store did not already persist."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def control(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method="POST" if data is not None else "GET")  # noqa: S310
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            answer: dict[str, Any] = json.loads(response.read())
            return answer

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
