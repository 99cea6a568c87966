"""Named failpoints, in the manner of TiKV's fail-rs: inert unless a test or the kill matrix sets them.

    failpoint("before_call", task_id=7)     # in the code, at a point where a crash must be survivable

Configured per process by ``RECKON_FAILPOINTS`` (``name=action;name=action``), or in-process with ``configure``.
Actions:

- ``kill``: SIGKILL this process on every hit (nothing is flushed, no ``finally`` runs: a real crash).
- ``kill_once``: SIGKILL on the first hit per (point, task) across every process that shares
  ``RECKON_FAILPOINT_DIR`` (a marker file is created with O_EXCL before dying, so the restarted worker goes on).
- ``raise``: raise FailpointHit (in-process tests of the same points).
- ``sleep(ms)``: pause, e.g. to hold a lease across an expiry.

The points, in the order the step protocol meets them (tasks/engine/runner.py, tasks/engine/protocol.py,
tasks/engine/cleanup.py):
"""

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POINTS = {
    "before_intent": "the directive said execute; no intent registered yet",
    "before_call": "the intent is registered and marked dispatched; the external call has not been made",
    "after_call": "the remote committed and answered; the answer is not recorded yet",
    "after_receipt": "the receipt is built and goes into the same commit as the advance; nothing of it is committed",
    "after_advance": "the receipt and the node's advance are committed; the loop has not gone on",
    "mid_cleanup": "a temp resource's delete committed remotely; its cleanup receipt is not recorded yet",
}
__doc__ = (__doc__ or "") + "".join(f"\n- ``{name}``: {what}." for name, what in POINTS.items())

ENV = "RECKON_FAILPOINTS"
DIR_ENV = "RECKON_FAILPOINT_DIR"

_configured: dict[str, str] = {}


class FailpointHit(Exception):
    """Raised at a failpoint set to ``raise``."""


class UnknownFailpoint(ValueError):
    """A configuration names a point or an action that does not exist."""


def parse(spec: str) -> dict[str, str]:
    """``"before_call=kill;after_call=sleep(200)"`` → {point: action}; unknown names are refused."""
    actions: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        name, _, action = item.partition("=")
        name, action = name.strip(), action.strip()
        if name not in POINTS:
            raise UnknownFailpoint(f"no failpoint {name!r} (known: {', '.join(POINTS)})")
        if action not in ("kill", "kill_once", "raise", "off") and not _sleep_ms(action):
            raise UnknownFailpoint(f"failpoint {name}: unknown action {action!r} (kill, kill_once, raise, sleep(ms))")
        actions[name] = action
    return actions


def _sleep_ms(action: str) -> int:
    if action.startswith("sleep(") and action.endswith(")") and action[6:-1].isdigit():
        return int(action[6:-1])
    return 0


@contextmanager
def configure(name: str, action: str) -> Iterator[None]:
    """Set one point in this process for the duration of a ``with`` block (tests)."""
    parse(f"{name}={action}")
    previous = _configured.get(name)
    _configured[name] = action
    try:
        yield
    finally:
        if previous is None:
            _configured.pop(name, None)
        else:
            _configured[name] = previous


def _action(name: str) -> str:
    if name in _configured:
        return _configured[name]
    spec = os.environ.get(ENV, "")
    return parse(spec).get(name, "") if spec else ""


def failpoint(name: str, *, task_id: int | None = None) -> None:
    """Trigger ``name`` if it is set; otherwise return at once."""
    action = _action(name)
    if not action or action == "off":
        return
    if action == "raise":
        raise FailpointHit(name)
    if ms := _sleep_ms(action):
        time.sleep(ms / 1000)
        return
    if action == "kill_once" and not _first_hit(name, task_id):
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _first_hit(name: str, task_id: int | None) -> bool:
    directory = Path(os.environ.get(DIR_ENV) or "data/failpoints")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(directory / f"{name}-{task_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def hits(name: str, directory: Path) -> int:
    """How many tasks a ``kill_once`` point has fired for (the matrix reports it)."""
    return sum(1 for _ in directory.glob(f"{name}-*"))
