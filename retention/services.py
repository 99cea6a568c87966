"""Retained objects: the only writers of RetainedObject rows and of the files under ``<data>/retention``.

- ``retain`` seals the content (AES-GCM, the object's identity as associated data), writes the file
  atomically, then inserts the row: no I/O inside a transaction. A file whose row never landed is an
  orphan, removed by the sweep once it is older than ORPHAN_GRACE.
- Checkpoints hold ``Ref.as_checkpoint()`` — ``{"retained": id, "version": n}`` — never the content;
  ``fetch`` turns one (as a Ref) into its content (a Retained). An object past its expiry raises
  RetentionExpired, which names its kind and name: rebuild the input from external facts and retain it again,
  never go on with something that is gone (the agent API answers 410 with them, and the Python client's
  ``fetch_or_recreate`` does exactly that: the agent holds the external facts, not Reckon).
- ``retention_extend``: a person who may operate the task, with a reason, bounded in time and in count,
  audited in the same transaction (the console's retention page).
- ``retention_sweep``: claim (live → purging, conditional), remove the file, mark purged. Each step is
  idempotent, so a crash anywhere is finished by the next sweep, and concurrent sweeps purge each object
  once. It removes only the file its row names, in that row's task folder, and orphans in task folders;
  receipts and attachments are never read, let alone deleted.

Every time decision reads ``leases.clock`` (the database server's clock).
"""

import hashlib
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from audit.hygiene import PayloadTooLarge, canonical_json, check_payload
from audit.principals import Principal
from audit.reasons import MIN_REASON
from audit.services import audit_append
from leases import clock
from retention.crypto import HEADER_BYTES, seal, unseal, written_at
from retention.errors import (
    ExtensionBeyondBound,
    ExtensionLimitReached,
    ExtensionReasonMissing,
    ExtensionRefused,
    RetentionCorrupt,
    RetentionExpired,
    RetentionNotFound,
    RetentionRefused,
)
from retention.models import RetainedKind, RetainedObject, RetainedStatus
from tasks.access.permissions import require_operate
from tasks.core.errors import TaskNotFound
from tasks.models import Task

ORPHAN_GRACE = timedelta(minutes=1)
# retain inserts its row within half the grace of sealing the file, or starts again: so a file older than the
# grace with no row is one whose row will never come, and the sweep may remove it.
_ROW_DEADLINE = ORPHAN_GRACE / 2
# Concurrent retains of one name race for its next version; each round of the race has one winner.
_RETAIN_ATTEMPTS = 10
NAME_MAX = 200
# Debug artifacts are minimal fields (ids, status codes, a short excerpt), not transcripts.
DEBUG_ARTIFACT_CAP_BYTES = 64 * 1024
DEFAULT_SWEEP_LIMIT = 500

_FILE_NAME = re.compile(r"(?P<uid>[0-9a-f-]{36})-v(?P<version>[1-9][0-9]*)\.bin(?P<partial>\.[0-9]+\.partial)?")


@dataclass(frozen=True)
class Ref:
    """What a checkpoint keeps of a retained object: its id and version, nothing else."""

    id: int
    version: int

    def as_checkpoint(self) -> dict[str, int]:
        return {"retained": self.id, "version": self.version}


@dataclass(frozen=True)
class Retained:
    """What ``fetch`` reads: the plaintext, checked against its digest, and what a reader needs beside it — the
    kind (a debug artifact's plaintext is the canonical JSON of its fields) and how long it stays readable."""

    ref: Ref
    kind: str
    name: str
    expires_at: datetime
    content: bytes


# --- where and how ----------------------------------------------------------------------------------------------


def retention_root() -> Path:
    return Path(settings.DATA_DIR) / "retention"


def object_path(task_uid: uuid.UUID, uid: uuid.UUID, version: int) -> Path:
    return retention_root() / str(task_uid) / f"{uid}-v{version}.bin"


def _path_of(row: RetainedObject) -> Path:
    return object_path(row.task.uid, row.uid, row.version)


def _identity(*, task_uid: uuid.UUID, uid: uuid.UUID, kind: str, name: str, version: int) -> bytes:
    """The associated data: a file moved to another object, task or version does not authenticate."""
    return canonical_json(
        {"task": str(task_uid), "object": str(uid), "kind": kind, "name": name, "version": version}
    ).encode()


def _identity_of(row: RetainedObject) -> bytes:
    return _identity(task_uid=row.task.uid, uid=row.uid, kind=row.kind, name=row.name, version=row.version)


def default_ttl(kind: str) -> timedelta:
    ttls: Mapping[str, timedelta] = settings.RECKON_RETENTION_TTL
    return ttls[kind]


def max_lifetime() -> timedelta:
    """How long after its creation an object may be kept at most, extensions included."""
    bound: timedelta = settings.RECKON_RETENTION_MAX_EXTENSION
    return bound


def max_extensions() -> int:
    return int(settings.RECKON_RETENTION_MAX_EXTENSIONS)


def _describe(row: RetainedObject) -> str:
    return f"retained {row.kind} {row.name!r} v{row.version} (#{row.pk}) of task {row.task_id}"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        partial.replace(path)  # atomic: a reader never sees half a file
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


# --- retain -----------------------------------------------------------------------------------------------------


class _RowTooLate(Exception):
    pass


def _plaintext(kind: str, name: str, content: bytes | Mapping[str, Any]) -> bytes:
    if kind not in RetainedKind.values:
        raise RetentionRefused(f"unknown retained kind {kind!r}: one of {', '.join(RetainedKind.values)}")
    if not name or len(name) > NAME_MAX:
        raise RetentionRefused(f"a retained object's name is 1 to {NAME_MAX} characters")
    # The name is stored in the clear, beside the checkpoint's reference: no credentials in it.
    check_payload({"name": name}, what="a retained object's name")
    if kind == RetainedKind.DEBUG_ARTIFACT:
        if not isinstance(content, Mapping):
            raise RetentionRefused(
                f"debug artifact {name!r} must be a dict of minimal fields (ids, status, an excerpt), not raw bytes"
            )
        # The sealed artifact itself, under its own cap: neither an event nor an audit row.
        check_payload(dict(content), what=f"debug artifact {name!r}", cap=DEBUG_ARTIFACT_CAP_BYTES)
        plaintext = canonical_json(content).encode()
    elif isinstance(content, bytes):
        plaintext = content
    else:
        raise RetentionRefused(f"{kind} {name!r} must be bytes")
    cap = int(settings.RECKON_RETENTION_MAX_BYTES)
    if len(plaintext) > cap:
        raise PayloadTooLarge(
            f"{kind} {name!r} is {len(plaintext)} bytes, over the {cap}-byte cap", size=len(plaintext), cap=cap
        )
    return plaintext


def _checked_ttl(kind: str, ttl: timedelta | None) -> timedelta:
    ttl = default_ttl(kind) if ttl is None else ttl
    if ttl <= timedelta(0):
        raise RetentionRefused(f"a retention must be positive, not {ttl}")
    if ttl > max_lifetime():
        raise RetentionRefused(f"a retention of {ttl} is over the bound of {max_lifetime()}")
    return ttl


def retain(
    *, task_id: int, kind: str, name: str, content: bytes | Mapping[str, Any], ttl: timedelta | None = None
) -> Ref:
    """Seal ``content`` for ``task_id`` as the next version of ``name``, expiring after ``ttl`` (by default the
    kind's retention). Debug artifacts are a dict of minimal fields and are refused if credential-like.

    Raises RetentionRefused, PayloadTooLarge, SecretInPayload or TaskNotFound before anything is written.
    """
    plaintext = _plaintext(kind, name, content)
    ttl = _checked_ttl(kind, ttl)
    task_uid = Task.objects.filter(pk=task_id).values_list("uid", flat=True).first()
    if task_uid is None:
        raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
    digest = hashlib.sha256(plaintext).hexdigest()
    for _ in range(_RETAIN_ATTEMPTS):
        uid = uuid.uuid4()
        version = (RetainedObject.objects.filter(task_id=task_id, name=name).aggregate(m=Max("version"))["m"] or 0) + 1
        sealed_at = clock.now()
        identity = _identity(task_uid=task_uid, uid=uid, kind=kind, name=name, version=version)
        path = object_path(task_uid, uid, version)
        try:
            _write_atomically(path, seal(plaintext, identity=identity, written_at=sealed_at))
        except FileNotFoundError:
            continue  # a sweep removed the folder's stale partial under us; write a fresh one
        try:
            with transaction.atomic():
                if clock.now() - sealed_at > _ROW_DEADLINE:
                    raise _RowTooLate
                row = RetainedObject.objects.create(
                    uid=uid,
                    task_id=task_id,
                    kind=kind,
                    name=name,
                    version=version,
                    sha256=digest,
                    size=len(plaintext),
                    created_at=sealed_at,
                    expires_at=sealed_at + ttl,
                )
        except _RowTooLate:
            path.unlink(missing_ok=True)  # a sweep may already count it an orphan: seal a fresh one
            continue
        except IntegrityError:
            path.unlink(missing_ok=True)
            if RetainedObject.objects.filter(task_id=task_id, name=name, version=version).exists():
                continue  # another retain of the same name took this version
            raise
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return Ref(row.pk, row.version)
    raise RetentionRefused(f"could not retain {name!r} for task {task_id}: {_RETAIN_ATTEMPTS} attempts lost a race")


# --- read -------------------------------------------------------------------------------------------------------


def _row(ref: Ref, task_id: int | None) -> RetainedObject:
    rows = RetainedObject.objects.select_related("task").filter(pk=ref.id, version=ref.version)
    if task_id is not None:
        rows = rows.filter(task_id=task_id)
    row = rows.first()
    if row is None:
        owner = f" of task {task_id}" if task_id is not None else ""
        raise RetentionNotFound(f"no retained object #{ref.id} v{ref.version}{owner}", retained=ref.id)
    return row


def _require_live(row: RetainedObject, now: datetime) -> None:
    """RetentionExpired, naming what to re-create (its kind and name), unless the object is live at ``now``."""
    named = {"retained": row.pk, "version": row.version, "kind": row.kind, "name": row.name}
    if row.status == RetainedStatus.PURGED:
        raise RetentionExpired(f"{_describe(row)} was purged at {row.purged_at}", **named)
    if row.status != RetainedStatus.LIVE or row.expires_at <= now:
        raise RetentionExpired(f"{_describe(row)} expired at {row.expires_at}", **named)


def fetch(ref: Ref, *, task_id: int | None = None) -> Retained:
    """The plaintext, checked against its digest, with its kind, name and expiry. Raises RetentionNotFound,
    RetentionExpired (at or after expiry, or purged: re-create it from external facts and retain it again) or
    RetentionCorrupt (missing, altered or foreign file; RetentionKeyMismatch: wrong key) — a corrupt object is
    never re-created: something is wrong that re-creating would hide."""
    row = _row(ref, task_id)
    _require_live(row, clock.now())
    try:
        blob = _path_of(row).read_bytes()
    except FileNotFoundError:
        row.refresh_from_db()
        _require_live(row, clock.now())  # a sweep purged it while we read: that is expiry, not corruption
        raise RetentionCorrupt(f"{_describe(row)}: its file is missing", retained=row.pk) from None
    try:
        plaintext, _ = unseal(blob, identity=_identity_of(row))
    except RetentionCorrupt as exc:
        raise type(exc)(f"{_describe(row)}: {exc}", retained=row.pk) from exc
    if len(plaintext) != row.size or hashlib.sha256(plaintext).hexdigest() != row.sha256:
        raise RetentionCorrupt(f"{_describe(row)}: the content does not match its digest", retained=row.pk)
    return Retained(ref=ref, kind=row.kind, name=row.name, expires_at=row.expires_at, content=plaintext)


# --- extend -----------------------------------------------------------------------------------------------------


def retention_extend(
    *,
    actor: Principal,
    ref: Ref,
    until: datetime,
    reason: str,
    task_id: int | None = None,
    seen_extensions: int | None = None,
) -> RetainedObject:
    """Keep a live object until ``until``: a person who may operate the task, with a reason of at least
    MIN_REASON characters, no later than created_at + RECKON_RETENTION_MAX_EXTENSION, at most
    RECKON_RETENTION_MAX_EXTENSIONS times. ``task_id``: the object must be that task's (RetentionNotFound
    otherwise); ``seen_extensions``: how many extensions the person saw, refused (changed meanwhile) if another was
    granted since. Audited; a refusal writes nothing."""
    reason = reason.strip()
    if len(reason) < MIN_REASON:
        raise ExtensionReasonMissing(f"extending a retention needs a reason of at least {MIN_REASON} characters")
    if timezone.is_naive(until):
        raise ExtensionRefused("`until` must carry a time zone")
    row = _row(ref, task_id)
    require_operate(actor, row.task)
    if seen_extensions is not None and seen_extensions != row.extended_count:
        raise ExtensionRefused(
            f"{_describe(row)} changed meanwhile: extended {row.extended_count} times, not {seen_extensions} as "
            f"seen; it now lasts until {row.expires_at}. Re-read it",
            retained=row.pk,
        )
    bound = row.created_at + max_lifetime()
    if until > bound:
        raise ExtensionBeyondBound(
            f"{_describe(row)} may be kept until {bound} at most, not {until}", retained=row.pk, bound=bound
        )
    if row.extended_count >= max_extensions():
        raise ExtensionLimitReached(
            f"{_describe(row)} was already extended {row.extended_count} times, the most allowed", retained=row.pk
        )
    with transaction.atomic():
        now = clock.now()
        _require_live(row, now)
        if until <= row.expires_at:
            raise ExtensionRefused(f"{_describe(row)} already lasts until {row.expires_at}", retained=row.pk)
        extended = RetainedObject.objects.filter(
            pk=row.pk,
            status=RetainedStatus.LIVE,
            expires_at=row.expires_at,
            extended_count=row.extended_count,
            expires_at__gt=now,
        ).update(expires_at=until, extended_count=F("extended_count") + 1)
        if extended != 1:
            raise ExtensionRefused(f"{_describe(row)} changed meanwhile (extended or purged): re-read it")
        audit_append(
            actor=actor,
            action="retention_extended",
            at=now,
            task_id=row.task_id,
            reason=reason,
            impact=f"{row.kind} {row.name!r} v{row.version} stays readable until {until.isoformat()}",
            details={
                "retained": row.pk,
                "version": row.version,
                "kind": row.kind,
                "name": row.name,
                "expires_before": row.expires_at.isoformat(),
                "expires_after": until.isoformat(),
                "extension": row.extended_count + 1,
            },
        )
    return RetainedObject.objects.get(pk=row.pk)


# --- sweep ------------------------------------------------------------------------------------------------------


@dataclass
class SweepReport:
    purged: int = 0  # rows this sweep moved to purged
    resumed: int = 0  # of which a crashed (or concurrent) sweep had left in purging
    files_removed: int = 0
    files_missing: int = 0  # already gone: a crash after the unlink, or another sweeper
    orphans_removed: int = 0  # files with no row (or a purged one), older than ORPHAN_GRACE
    unrecognised: int = 0  # files in the retention folder that are not ours: left alone
    failed: list[str] = field(default_factory=list)  # could not remove: stays purging, retried next sweep
    more: bool = False  # the limit was reached: run again

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        text = (
            f"retention_sweep: {self.purged} purged ({self.resumed} resumed), {self.files_removed} files removed, "
            f"{self.files_missing} already gone, {self.orphans_removed} orphans removed, "
            f"{self.unrecognised} unrecognised files left alone, {len(self.failed)} failed"
        )
        if self.failed:
            text += ": " + "; ".join(self.failed)
        return text + (" (more to do)" if self.more else "")


def _claim(now: datetime, limit: int) -> list[tuple[RetainedObject, bool]]:
    """Move up to ``limit`` expired live objects to purging; return them with the ones already purging (left by a
    crash, or being purged by another sweeper right now: finishing it again is harmless). (row, resumed) pairs."""
    with transaction.atomic():
        picked = list(
            RetainedObject.objects.due(now).claimable().select_related("task").order_by("expires_at", "pk")[:limit]
        )
        live = [row.pk for row in picked if row.status == RetainedStatus.LIVE]
        if live:
            RetainedObject.objects.filter(pk__in=live, status=RetainedStatus.LIVE, expires_at__lte=now).update(
                status=RetainedStatus.PURGING, purge_started_at=clock.now()
            )
        # Only what is purging now may lose its file: never a row an extension kept live.
        purging = set(
            RetainedObject.objects.filter(pk__in=[row.pk for row in picked], status=RetainedStatus.PURGING).values_list(
                "pk", flat=True
            )
        )
    return [(row, row.status == RetainedStatus.PURGING) for row in picked if row.pk in purging]


def _purge(row: RetainedObject, resumed: bool, report: SweepReport) -> None:
    try:
        _path_of(row).unlink()
        report.files_removed += 1
    except FileNotFoundError:
        report.files_missing += 1
    except OSError as exc:
        report.failed.append(f"#{row.pk} {exc.strerror or type(exc).__name__}")
        return
    # Conditional: of two sweepers finishing the same object, one records the purge.
    if (
        RetainedObject.objects.filter(pk=row.pk, status=RetainedStatus.PURGING).update(
            status=RetainedStatus.PURGED, purged_at=clock.now()
        )
        == 1
    ):
        report.purged += 1
        report.resumed += resumed


def _as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _file_age_start(path: Path, partial: bool) -> datetime | None:
    try:
        with path.open("rb") as handle:
            sealed_at = written_at(handle.read(HEADER_BYTES))
        if sealed_at is None and partial:
            # A torn partial (its writer died mid-write) has no readable header: only the file system's
            # time says how old it is.
            sealed_at = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None
    return sealed_at


def _remove_orphans(now: datetime, limit: int, report: SweepReport) -> None:
    root = retention_root()
    if not root.is_dir():
        return
    for folder in sorted(root.iterdir()):
        task_uid = _as_uuid(folder.name)
        # A symlinked folder could lead anywhere (the attachments, say): never followed.
        if task_uid is None or folder.is_symlink() or not folder.is_dir() or str(task_uid) != folder.name:
            report.unrecognised += 1
            continue
        files: list[tuple[Path, uuid.UUID, int, bool]] = []
        for path in sorted(folder.iterdir()):
            match = _FILE_NAME.fullmatch(path.name)
            uid = _as_uuid(match["uid"]) if match else None
            if match is None or uid is None or path.is_symlink() or not path.is_file():
                report.unrecognised += 1
                continue
            files.append((path, uid, int(match["version"]), bool(match["partial"])))
        if not files:
            continue
        # Rows of this folder's task only: a file is judged by the task whose folder it is in.
        owned = {
            (uid, version): status
            for uid, version, status in RetainedObject.objects.filter(
                task__uid=task_uid, uid__in={uid for _, uid, _, _ in files}
            ).values_list("uid", "version", "status")
        }
        for path, uid, version, partial in files:
            if not partial and owned.get((uid, version)) in (RetainedStatus.LIVE, RetainedStatus.PURGING):
                continue  # its row owns it: kept while live, removed by _purge
            started = _file_age_start(path, partial)
            if started is None:
                if not partial and path.exists():
                    report.unrecognised += 1
                continue
            if now - started < ORPHAN_GRACE:
                continue  # maybe a retain whose row is about to land
            if report.orphans_removed >= limit:
                report.more = True
                return
            try:
                path.unlink()
                report.orphans_removed += 1
            except FileNotFoundError:
                pass  # another sweeper removed it
            except OSError as exc:
                report.failed.append(f"{folder.name}/{path.name} {exc.strerror or type(exc).__name__}")


def retention_sweep(*, now: datetime | None = None, limit: int = DEFAULT_SWEEP_LIMIT) -> SweepReport:
    """Purge every object expired at ``now`` (default: the database clock), finish purges a crashed sweep left
    half-way, and remove orphan files. Idempotent; safe to run on several workers at once and beside recovery.
    At most ``limit`` objects and ``limit`` orphans per call: ``report.more`` says to run again."""
    if limit < 1:
        raise ValueError(f"limit must be positive, not {limit}")
    now = clock.now() if now is None else now
    report = SweepReport()
    claimed = _claim(now, limit)
    report.more = len(claimed) >= limit
    for row, resumed in claimed:
        _purge(row, resumed, report)
    _remove_orphans(now, limit, report)
    return report
