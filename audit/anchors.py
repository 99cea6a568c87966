"""Chain heads anchored outside the database: a signed checkpoint of the heads, appended to a file.

The triggers keep the audit chain and the event logs append-only against everyone but a database superuser (or
whoever can write SQLite's file). Such a person can cut a chain's tail and roll its head back so that the database
reads consistently; only a record kept elsewhere shows the chain once went further. A checkpoint is one JSON line —
when, the audit chain's head (seq, digest), and what the other apps' head sources add (the tasks' log heads,
tasks/engine/anchors.py) — signed with HMAC-SHA256 under RECKON_ANCHOR_KEY, a key the database never holds, and
appended to
RECKON_ANCHOR_PATH (opened O_APPEND, created 0600, fsynced). Each line also names the MAC of the line before it, so a
line taken out of the middle is seen. A line whose MAC does not verify is reported and never trusted.

Without a key anchoring is off and the verify commands say "not anchored": nothing pretends.

``audit`` imports no app of the project: the other apps' heads come from head sources registered by their own
``anchors`` module, found with Django's ``autodiscover_modules`` when a checkpoint is written.
"""

import base64
import binascii
import fcntl
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from audit.models import AuditEvent, AuditHead

FORMAT = 1


class AnchorKeyInvalid(Exception):
    """RECKON_ANCHOR_KEY is set but is not the base64 text of 32 bytes: refused rather than used weakened."""

    code = "anchor_key_invalid"


@dataclass(frozen=True)
class Checkpoint:
    """One verified line of the anchor file."""

    line: int  # its number in the file; 0 when read alone (the line a new checkpoint follows, or the one written)
    at: str
    audit_seq: int
    audit_digest: str
    sections: Mapping[str, Any]
    mac: str


@dataclass(frozen=True)
class AnchorFile:
    """What the anchor file holds: its verified checkpoints (oldest first) and the lines that are not trusted."""

    path: Path
    enabled: bool
    checkpoints: tuple[Checkpoint, ...] = ()
    bad_lines: tuple[str, ...] = field(default=())

    @property
    def newest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def status(self) -> str:
        """One sentence on what anchoring can vouch for, for the verify commands."""
        if not self.enabled:
            return "not anchored (RECKON_ANCHOR_KEY is not set): a chain cut and its head rolled back is not found"
        if self.newest is None:
            return f"not anchored yet: no valid checkpoint in {self.path}"
        return f"anchored: {len(self.checkpoints)} checkpoint(s) in {self.path}, the newest of {self.newest.at}"


# name → a function given the newest checkpoint (or None) that returns the section it adds to a new checkpoint.
type HeadSource = Callable[[Checkpoint | None], Any]
_SOURCES: dict[str, HeadSource] = {}


def register_head_source(name: str, source: HeadSource) -> None:
    """An app's ``anchors`` module adds its heads to every checkpoint under ``name``."""
    _SOURCES[name] = source


def anchor_key() -> bytes | None:
    text = getattr(settings, "RECKON_ANCHOR_KEY", "")
    if not text:
        return None
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise AnchorKeyInvalid("RECKON_ANCHOR_KEY must be the base64 text of 32 random bytes")
    return key


def anchor_path() -> Path:
    configured = getattr(settings, "RECKON_ANCHOR_PATH", "")
    return Path(configured) if configured else Path(settings.DATA_DIR) / "anchors" / "heads.log"


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(key: bytes, body: Mapping[str, Any]) -> str:
    return hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()


def _verified(key: bytes, raw: str) -> tuple[dict[str, Any], str] | None:
    """The line's body and MAC if the MAC verifies under the key, else None."""
    try:
        body = json.loads(raw)
        mac = body.pop("mac")
    except (ValueError, TypeError, AttributeError, KeyError):
        return None
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, body)):
        return None
    return body, mac


def _checkpoint(line: int, body: Mapping[str, Any], mac: str) -> Checkpoint:
    audit = body.get("audit", {})
    return Checkpoint(
        line=line,
        at=str(body.get("at", "")),
        audit_seq=int(audit.get("seq", 0)),
        audit_digest=str(audit.get("digest", "")),
        sections={k: v for k, v in body.items() if k not in ("v", "at", "prev", "audit")},
        mac=mac,
    )


def _parse(key: bytes, path: Path, text: str) -> tuple[list[Checkpoint], list[str]]:
    good: list[Checkpoint] = []
    bad: list[str] = []
    prev = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        verified = _verified(key, raw)
        if verified is None:
            bad.append(f"anchor file {path} line {number} fails its HMAC: altered or not ours, not trusted")
            continue
        body, mac = verified
        if body.get("prev", "") != prev:
            bad.append(f"anchor file {path} line {number} does not follow the line before it: a line was removed")
        good.append(_checkpoint(number, body, mac))
        prev = mac
    return good, bad


_cache: dict[tuple[str, bytes, int, int], AnchorFile] = {}


def read_anchors() -> AnchorFile:
    """The anchor file, verified line by line. Read again only when it grew (it is only appended to), so checking
    many tasks one by one reads it once."""
    path = anchor_path()
    key = anchor_key()
    if key is None:
        return AnchorFile(path=path, enabled=False)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return AnchorFile(path=path, enabled=True)
    cache_key = (str(path), hashlib.sha256(key).digest(), stat.st_size, stat.st_mtime_ns)
    if cache_key not in _cache:
        good, bad = _parse(key, path, path.read_text(encoding="utf-8", errors="replace"))
        _cache.clear()
        _cache[cache_key] = AnchorFile(path=path, enabled=True, checkpoints=tuple(good), bad_lines=tuple(bad))
    return _cache[cache_key]


def _open_for_append(path: Path) -> int:
    """The anchor file's own append-only place: private to the service's user, appended to (O_APPEND: every write
    lands at the end), never rewritten; read only for the line a new checkpoint follows."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)


def _last_line(fd: int) -> bytes:
    """The file's last line, read backwards from its end: a checkpoint reads only the line it follows, not the file."""
    end = os.lseek(fd, 0, os.SEEK_END)
    tail = b""
    position = end
    while position > 0:
        step = min(65536, position)
        position -= step
        tail = os.pread(fd, step, position) + tail
        stripped = tail.rstrip(b"\n")
        if b"\n" in stripped:
            return stripped.rsplit(b"\n", 1)[1]
    return tail.rstrip(b"\n")


def _previous(fd: int, key: bytes) -> Checkpoint | None:
    """The checkpoint a new one follows: the last line if it verifies, else (rare: a line not ours at the end) the
    newest verified line of a full read."""
    last = _last_line(fd).decode("utf-8", errors="replace")
    if not last.strip():
        return None
    verified = _verified(key, last)
    if verified is not None:
        return _checkpoint(0, *verified)
    return read_anchors().newest


def anchor_heads(*, at: datetime | None = None) -> Checkpoint | None:
    """Write one checkpoint of every chain's head; None when anchoring is off (no key).

    Run periodically by the beat (audit.anchor_heads, RECKON_ANCHOR_SECONDS) and by ``manage.py anchor_heads``.
    The file is locked while the line before is read and the new one written, so two writers never fork the line
    chain.
    """
    key = anchor_key()
    if key is None:
        return None
    autodiscover_modules("anchors")
    path = anchor_path()
    fd = _open_for_append(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        previous = _previous(fd, key)
        head = AuditHead.objects.filter(pk=1).first()
        body: dict[str, Any] = {
            "v": FORMAT,
            "at": (at or timezone.now()).isoformat(),
            "prev": previous.mac if previous else "",
            "audit": {"seq": head.seq if head else 0, "digest": head.digest if head else ""},
        }
        for name, source in sorted(_SOURCES.items()):
            body[name] = source(previous)
        mac = _mac(key, body)
        os.write(fd, _canonical({**body, "mac": mac}) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock
    return _checkpoint(0, body, mac)


@dataclass(frozen=True)
class AnchoredHead:
    seq: int
    digest: str
    at: str


def anchored_audit_head(anchors: AnchorFile) -> AnchoredHead | None:
    """The furthest audit head any verified checkpoint vouches for (heads only move forward)."""
    best = max(anchors.checkpoints, key=lambda c: c.audit_seq, default=None)
    if best is None or best.audit_seq == 0:
        return None
    return AnchoredHead(best.audit_seq, best.audit_digest, best.at)


def audit_anchor_problem(anchors: AnchorFile) -> str | None:
    """The audit chain against the furthest head a checkpoint anchored, without walking it (verify_audit walks it):
    the head still at or past the anchored seq, the event there still the anchored one. Two queries."""
    anchored = anchored_audit_head(anchors)
    if anchored is None:
        return None
    head = AuditHead.objects.filter(pk=1).values_list("seq", flat=True).first() or 0
    digest = AuditEvent.objects.filter(seq=anchored.seq).values_list("digest", flat=True).first()
    if head < anchored.seq or digest is None:
        return (
            f"the audit chain ends at #{head} but the checkpoint of {anchored.at} anchored it at #{anchored.seq}: "
            "its tail was cut and its head rolled back"
        )
    if digest != anchored.digest:
        return (
            f"audit event #{anchored.seq} is not the one the checkpoint of {anchored.at} anchored: the chain was "
            "rewritten from there back"
        )
    return None


# --- the verdict: what the anchors say of every chain now ---------------------------------------------------------

# name → a function given the verified anchor file that returns one sentence per chain of its app that no longer
# reaches the head a checkpoint vouched for (tasks/engine/anchors.py: a task's log cut, rewritten, or the task gone).
type HeadChecker = Callable[[AnchorFile], list[str]]
_CHECKERS: dict[str, HeadChecker] = {}

MAX_LISTED_FINDINGS = 50  # sentences kept; the count is always complete

type AnchorState = Literal["consistent", "cut", "untrusted", "not_anchored"]


def register_head_checker(name: str, checker: HeadChecker) -> None:
    """An app's ``anchors`` module checks its chains against the checkpoints under ``name``."""
    _CHECKERS[name] = checker


@dataclass(frozen=True)
class AnchorVerdict:
    """What the anchor file says of the chains now, in plain words for a person (the console's "Verify now").

    ``consistent``: every chain still reaches the heads the signed checkpoints vouch for. ``cut``: one does not —
    its tail was cut and its head rolled back, it was rewritten, or an anchored task is gone — even though the
    database may read consistently. ``untrusted``: nothing found cut, but lines of the anchor file fail their HMAC
    or a line was taken out. ``not_anchored``: no key, or no checkpoint yet: a cut would not be found."""

    state: AnchorState
    summary: str
    findings: tuple[str, ...] = ()
    found: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "summary": self.summary, "findings": list(self.findings), "found": self.found}

    @classmethod
    def from_json(cls, data: Any) -> "AnchorVerdict | None":
        """A verdict stored with as_json; None for anything else (a run recorded before verdicts were kept)."""
        if not isinstance(data, Mapping) or data.get("state") not in ("consistent", "cut", "untrusted", "not_anchored"):
            return None
        findings = data.get("findings")
        return cls(
            state=data["state"],
            summary=str(data.get("summary", "")),
            findings=tuple(str(f) for f in findings) if isinstance(findings, list) else (),
            found=int(data.get("found") or 0),
        )


def anchors_verify() -> AnchorVerdict:
    """Every chain against the anchor file: the audit chain (audit_anchor_problem) and each app's chains (their
    registered checkers), and the file's own lines. Reads the file once; what it costs beyond is the checkers'."""
    anchors = read_anchors()
    if not anchors.enabled:
        return AnchorVerdict(
            "not_anchored",
            "Not anchored: RECKON_ANCHOR_KEY is not set, so a chain whose tail was cut and whose head was rolled back "
            "would not be found.",
        )
    autodiscover_modules("anchors")
    cuts = [problem for problem in [audit_anchor_problem(anchors)] if problem]
    for _name, checker in sorted(_CHECKERS.items()):
        cuts += checker(anchors)
    untrusted = list(anchors.bad_lines)
    findings = cuts + untrusted
    listed = tuple(findings[:MAX_LISTED_FINDINGS])
    if cuts:
        return AnchorVerdict(
            "cut",
            f"A cut found in {len(cuts)} chain{'s' if len(cuts) != 1 else ''}: the head a signed checkpoint outside "
            "the database vouched for is no longer there (a tail cut and a head rolled back, a rewrite, or a task "
            "deleted), however consistent the database reads.",
            listed,
            len(findings),
        )
    if untrusted:
        return AnchorVerdict(
            "untrusted",
            f"Anchor file not trusted in part: {len(untrusted)} line{'s' if len(untrusted) != 1 else ''} altered, "
            "not ours or taken out; the other checkpoints hold and found no cut.",
            listed,
            len(findings),
        )
    newest = anchors.newest
    if newest is None:
        return AnchorVerdict(
            "not_anchored",
            f"Not anchored yet: no checkpoint in {anchors.path} (the beat writes one every RECKON_ANCHOR_SECONDS), "
            "so a cut would not be found.",
        )
    count = len(anchors.checkpoints)
    return AnchorVerdict(
        "consistent",
        "Anchored and consistent: the audit chain and every anchored task's log still reach the heads vouched for by "
        f"{count} signed checkpoint{'s' if count != 1 else ''} (the newest of {_when(newest.at)}, in {anchors.path}).",
    )


def _when(at: str) -> str:
    """A checkpoint's time as a person reads it (UTC, to the second); the stored text if it is not a time."""
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        return at
    if moment.tzinfo is None:
        return at
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
