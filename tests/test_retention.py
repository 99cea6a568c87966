"""Retention (DESIGN §3.8, §3.11): sealed at rest, versioned, expiring, bounded extensions, a crash-safe sweep.

Each test tries to break one promise of ``retention/services.py``. Refusals are checked against a snapshot of
every Reckon table (retention and audit included) and of every file under the data folder: a refused call
writes nothing, not even a stray file. Times come from the controllable database clock.
"""

import base64
import hashlib
import io
import json
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from pytest_django.fixtures import Settings

from audit.hygiene import PayloadTooLarge, SecretInPayload, canonical_json, check_payload
from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import verify_audit
from leases.clock import ControllableClock
from leases.models import Lease
from retention import checks
from retention.crypto import retention_key, seal
from retention.errors import (
    ExtensionBeyondBound,
    ExtensionLimitReached,
    ExtensionReasonMissing,
    ExtensionRefused,
    RetentionCorrupt,
    RetentionExpired,
    RetentionKeyInvalid,
    RetentionKeyMismatch,
    RetentionKeyMissing,
    RetentionNotFound,
    RetentionRefused,
)
from retention.jobs import sweep as sweep_job
from retention.models import RetainedKind, RetainedObject, RetainedStatus
from retention.services import (
    ORPHAN_GRACE,
    Ref,
    SweepReport,
    fetch,
    object_path,
    retain,
    retention_extend,
    retention_root,
    retention_sweep,
)
from tasks.access.permissions import PermissionDenied, permission_grant
from tasks.core.errors import TaskNotFound
from tasks.core.outcomes import Committed
from tasks.models import Receipt, Task
from tasks.people.attachments import AttachmentIn, attachment_path, store_attachment
from tests.conftest import person, snapshot
from tests.steps import record, send
from tests.test_races_postgres import run_threads

TICK = timedelta(microseconds=1)  # the finest step both databases store
KEY = base64.b64encode(bytes(range(32))).decode()
OTHER_KEY = base64.b64encode(bytes(range(100, 132))).decode()
CONTEXT = b"model context: the customer's migration notes, CANARY-7f3a9c, keep private"
REASON = "operator is still investigating the failed copy"


@pytest.fixture(autouse=True)
def retention_settings(settings: Settings, tmp_path: Path) -> Path:
    """A private data folder and a known key for every test."""
    data = tmp_path / "data"
    data.mkdir()
    settings.DATA_DIR = data
    settings.RECKON_RETENTION_KEY = KEY
    return data


# --- helpers ----------------------------------------------------------------------------------------------------


@pytest.fixture
def root(db: None) -> Principal:
    return person("root", "admin")


@pytest.fixture
def operator(root: Principal, task: Task) -> Principal:
    """An operator granted the ``task`` fixture's task."""
    who = person("olga", "operator")
    permission_grant(actor=root, user=who.user, task=task)
    return who


@pytest.fixture
def task(make_task: Callable[..., Task]) -> Task:
    return make_task()


@pytest.fixture
def other_task(make_task: Callable[..., Task]) -> Task:
    return make_task(title="another task")


def row(ref: Ref) -> RetainedObject:
    return RetainedObject.objects.select_related("task").get(pk=ref.id)


def path_of(ref: Ref) -> Path:
    r = row(ref)
    return object_path(r.task.uid, r.uid, r.version)


def files(data: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}


def everything(data: Path) -> dict[str, Any]:
    """Every Reckon row (retention included) and every file under the data folder."""
    state: dict[str, Any] = snapshot()
    state["retention"] = list(RetainedObject.objects.order_by("pk").values_list())
    state["files"] = files(data)
    return state


def assert_refused(
    error: type[BaseException] | tuple[type[BaseException], ...], data: Path, call: Callable[[], Any]
) -> Any:
    before = everything(data)
    with pytest.raises(error) as caught:
        call()
    assert everything(data) == before, "a refused call must write nothing: no row, no audit, no file"
    return caught.value


def keep(task: Task, name: str = "context", content: bytes = CONTEXT, **kwargs: Any) -> Ref:
    kwargs.setdefault("kind", RetainedKind.SENSITIVE_INPUT)
    return retain(task_id=task.pk, name=name, content=content, **kwargs)


def extend(actor: Principal, ref: Ref, until: Any, reason: str = REASON) -> RetainedObject:
    return retention_extend(actor=actor, ref=ref, until=until, reason=reason)


# --- sealed at rest ---------------------------------------------------------------------------------------------


def test_the_file_on_disk_is_ciphertext_and_only_its_owner_reads_it(task, clock, retention_settings) -> None:
    ref = keep(task)
    stored = path_of(ref)
    blob = stored.read_bytes()
    assert stored.parent == retention_root() / str(task.uid)
    assert stored.name == f"{row(ref).uid}-v1.bin"
    assert CONTEXT not in blob and b"CANARY-7f3a9c" not in blob
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert fetch(ref).content == CONTEXT
    r = row(ref)
    assert (r.sha256, r.size, r.version, r.status) == (hashlib.sha256(CONTEXT).hexdigest(), len(CONTEXT), 1, "live")
    assert "CANARY" not in json.dumps(list(RetainedObject.objects.values_list()), default=str)
    assert [p.name for p in retention_root().rglob("*") if p.is_file()] == [stored.name], "no partial left behind"


def test_each_retain_of_a_name_is_its_next_version(task, clock) -> None:
    first = keep(task, content=b"one")
    second = keep(task, content=b"two")
    other = keep(task, name="tool-notes", content=b"three")
    assert (first.version, second.version, other.version) == (1, 2, 1)
    assert (fetch(first).content, fetch(second).content, fetch(other).content) == (b"one", b"two", b"three")


def test_a_checkpoint_keeps_only_the_id_and_version(task, other_task, clock) -> None:
    ref = keep(task)
    checkpoint = ref.as_checkpoint()
    assert checkpoint == {"retained": ref.id, "version": 1}
    check_payload(checkpoint, what="checkpoint")  # passes the checkpoint hygiene: a reference, no secret
    assert fetch(Ref(checkpoint["retained"], checkpoint["version"]), task_id=task.pk).content
    with pytest.raises(RetentionNotFound):
        fetch(ref, task_id=other_task.pk)  # another task's checkpoint cannot reach it
    with pytest.raises(RetentionNotFound):
        fetch(Ref(ref.id, 2))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="tag"),
        pytest.param(lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], id="ciphertext"),
        pytest.param(lambda b: b[:14] + bytes([b[14] ^ 1]) + b[15:], id="written-at"),
        pytest.param(lambda b: b[:-5], id="truncated"),
        pytest.param(lambda b: b[:20], id="header-only"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"XXXX" + b[4:], id="magic"),
    ],
)
def test_a_tampered_file_is_corrupt_never_garbage(task, clock, damage) -> None:
    ref = keep(task)
    path_of(ref).write_bytes(damage(path_of(ref).read_bytes()))
    with pytest.raises(RetentionCorrupt):
        fetch(ref)


def test_a_missing_file_of_a_live_object_is_corrupt(task, clock) -> None:
    ref = keep(task)
    path_of(ref).unlink()
    with pytest.raises(RetentionCorrupt, match="missing"):
        fetch(ref)


def test_content_resealed_with_the_key_but_not_matching_the_digest_is_corrupt(task, clock) -> None:
    """Someone holding the key re-seals other bytes for the same object: the digest in the row still catches it."""
    ref = keep(task)
    r = row(ref)
    identity = canonical_json(
        {"kind": r.kind, "name": r.name, "object": str(r.uid), "task": str(task.uid), "version": 1}
    ).encode()
    path_of(ref).write_bytes(seal(b"forged context", identity=identity, written_at=r.created_at))
    with pytest.raises(RetentionCorrupt, match="digest"):
        fetch(ref)


@pytest.mark.parametrize("configured", [OTHER_KEY, ""], ids=["another-key", "development-key"])
def test_a_wrong_key_gives_a_named_error(task, clock, settings, configured) -> None:
    ref = keep(task)
    settings.RECKON_RETENTION_KEY = configured
    with pytest.raises(RetentionKeyMismatch) as caught:
        fetch(ref)
    assert isinstance(caught.value, RetentionCorrupt)
    assert KEY not in str(caught.value) and OTHER_KEY not in str(caught.value)
    settings.RECKON_RETENTION_KEY = KEY
    assert fetch(ref).content == CONTEXT


def test_without_a_configured_key_the_development_key_still_seals(task, clock, settings) -> None:
    settings.RECKON_RETENTION_KEY = ""
    ref = keep(task)
    assert CONTEXT not in path_of(ref).read_bytes()
    assert fetch(ref).content == CONTEXT
    settings.SECRET_KEY = "another secret key"
    with pytest.raises(RetentionKeyMismatch):
        fetch(ref)


def test_an_object_sealed_with_the_development_key_is_not_read_with_a_configured_one(task, clock, settings) -> None:
    """The other direction: what the demo sealed with the public development key stays unreadable (named error, no
    plaintext) once a real key is configured, and the configured key's objects under the development key."""
    settings.RECKON_RETENTION_KEY = ""
    developed = keep(task, name="developed")
    settings.RECKON_RETENTION_KEY = KEY
    configured = keep(task, name="configured")
    with pytest.raises(RetentionKeyMismatch):
        fetch(developed)
    settings.RECKON_RETENTION_KEY = ""
    with pytest.raises(RetentionKeyMismatch):
        fetch(configured)


def test_in_production_no_key_is_derived_at_all(task, clock, settings, retention_settings) -> None:
    """Outside the development and test modes an unset key is no key: nothing is sealed (refused, nothing written)
    and nothing sealed earlier under the derived key is opened, whatever SECRET_KEY is."""
    settings.RECKON_RETENTION_KEY = ""
    sealed_in_development = keep(task, name="development")
    settings.RECKON_ENV = "production"
    with pytest.raises(RetentionKeyMissing):
        retention_key()
    with pytest.raises(RetentionKeyMissing) as caught:
        fetch(sealed_in_development)
    assert CONTEXT.decode() not in str(caught.value)
    assert_refused(RetentionKeyMissing, retention_settings, lambda: keep(task))
    assert [m.id for m in checks.retention_key_check()] == ["retention.E002"]
    settings.RECKON_RETENTION_KEY = KEY  # a configured key works in production as anywhere
    assert fetch(keep(task, name="configured")).content == CONTEXT


@pytest.mark.parametrize("configured", ["not base64!", base64.b64encode(b"short").decode()])
def test_an_unusable_key_is_refused_by_name_and_nothing_is_written(
    task, clock, settings, retention_settings, configured
) -> None:
    settings.RECKON_RETENTION_KEY = configured
    assert_refused(RetentionKeyInvalid, retention_settings, lambda: keep(task))


@pytest.mark.parametrize(
    "target",
    ["same task, other name", "same name, other version", "other task, same name"],
)
def test_a_file_moved_to_another_object_does_not_decrypt(task, other_task, clock, target) -> None:
    """Same content on both sides, so the digest cannot tell them apart: the associated data must."""
    source = keep(task)
    victim = {
        "same task, other name": lambda: keep(task, name="other"),
        "same name, other version": lambda: keep(task),
        "other task, same name": lambda: keep(other_task),
    }[target]()
    assert row(victim).sha256 == row(source).sha256
    path_of(victim).write_bytes(path_of(source).read_bytes())
    with pytest.raises(RetentionCorrupt, match="does not authenticate"):
        fetch(victim)
    assert fetch(source).content == CONTEXT


# --- what may be retained -----------------------------------------------------------------------------------------


def test_each_kind_has_its_default_retention(task, clock, settings) -> None:
    cases: list[tuple[str, bytes | dict[str, Any]]] = [
        (RetainedKind.SENSITIVE_INPUT, b"a"),
        (RetainedKind.TEMP_MATERIAL, b"b"),
        (RetainedKind.DEBUG_ARTIFACT, {"status": 503}),
    ]
    for kind, content in cases:
        r = row(retain(task_id=task.pk, kind=kind, name=f"k-{kind}", content=content))
        assert r.expires_at - r.created_at == settings.RECKON_RETENTION_TTL[kind]
        assert r.created_at == clock.now()
    ttls = settings.RECKON_RETENTION_TTL
    assert ttls == {
        "sensitive_input": timedelta(days=7),
        "debug_artifact": timedelta(days=3),
        "temp_material": timedelta(days=1),
    }


def test_a_debug_artifact_of_minimal_fields_round_trips_as_json(task, clock) -> None:
    fields = {"tool": "store.copy_batch", "status": 503, "remote_id": "batch-9", "excerpt": "Service Unavailable"}
    ref = retain(task_id=task.pk, kind="debug_artifact", name="copy attempt 2", content=fields)
    assert json.loads(fetch(ref).content) == fields


@pytest.mark.parametrize(
    "fields",
    [
        {"tool": "store.copy_batch", "api_token": "abc"},
        {"response": {"headers": {"Authorization": "Bearer abcdef0123456789abcdef"}}},
        {"request": {"url": "https://deploy:hunter2@store.example/v1"}},
        {"excerpt": "key AKIAABCDEFGHIJKLMNOP leaked"},
        {"model_output": ["fine", {"password": "x"}]},
    ],
    ids=["token-key", "bearer-header", "url-credentials", "aws-key", "nested-password"],
)
def test_a_debug_artifact_with_credential_like_data_is_refused_and_nothing_is_left(
    task, clock, retention_settings, fields
) -> None:
    error = assert_refused(
        SecretInPayload,
        retention_settings,
        lambda: retain(task_id=task.pk, kind="debug_artifact", name="tool response", content=fields),
    )
    assert "hunter2" not in str(error) and "AKIA" not in str(error)
    assert not retention_root().exists() or not any(retention_root().rglob("*.bin*"))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda t: retain(task_id=t.pk, kind="transcript", name="n", content=b"x"), id="unknown-kind"),
        pytest.param(lambda t: retain(task_id=t.pk, kind="temp_material", name="", content=b"x"), id="empty-name"),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="temp_material", name="x" * 201, content=b"x"), id="long-name"
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="temp_material", name="token=ghp_" + "a" * 30, content=b"x"),
            id="secret-in-name",
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="debug_artifact", name="n", content=b"raw tool output"),
            id="debug-as-bytes",
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="sensitive_input", name="n", content={"a": 1}), id="input-as-dict"
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="temp_material", name="n", content=b"x", ttl=timedelta(0)),
            id="zero-ttl",
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="temp_material", name="n", content=b"x", ttl=timedelta(days=31)),
            id="ttl-past-the-bound",
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="temp_material", name="n", content=b"x" * 1025), id="too-large"
        ),
        pytest.param(
            lambda t: retain(task_id=t.pk, kind="debug_artifact", name="n", content={"excerpt": "x" * 70_000}),
            id="debug-too-large",
        ),
        pytest.param(lambda t: retain(task_id=t.pk + 999, kind="temp_material", name="n", content=b"x"), id="no-task"),
    ],
)
def test_what_cannot_be_retained_is_refused_before_anything_is_written(
    task, clock, settings, retention_settings, call
) -> None:
    settings.RECKON_RETENTION_MAX_BYTES = 1024
    refusals = (RetentionRefused, PayloadTooLarge, SecretInPayload, TaskNotFound)
    assert_refused(refusals, retention_settings, lambda: call(task))


# --- expiry -------------------------------------------------------------------------------------------------------


def test_an_object_reads_until_one_tick_before_its_expiry_and_never_at_it(task, clock) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    clock.advance(timedelta(hours=1) - TICK)
    assert fetch(ref).content == CONTEXT
    assert retention_sweep().purged == 0
    clock.advance(TICK)
    with pytest.raises(RetentionExpired, match="expired"):
        fetch(ref)  # expired even before any sweep ran
    assert retention_sweep().purged == 1
    with pytest.raises(RetentionExpired, match="purged"):
        fetch(ref)


def test_an_object_a_sweep_is_purging_reads_as_expired_not_corrupt(task, clock) -> None:
    """Recovery reading while a sweep works: the row says purging, the file may be gone."""
    ref = keep(task, ttl=timedelta(hours=1))
    RetainedObject.objects.filter(pk=ref.id).update(status=RetainedStatus.PURGING, purge_started_at=clock.now())
    path_of(ref).unlink()
    with pytest.raises(RetentionExpired):
        fetch(ref)


def test_an_expired_object_names_what_to_recreate_and_never_reads_a_missing_file(task, clock) -> None:
    """What an agent needs to re-create it from external facts and retain it again (the API's 410, the client's
    fetch_or_recreate: tests/test_client_retained.py): its kind and name — never the content, never a path."""
    ref = keep(task, ttl=timedelta(hours=1))
    read = fetch(ref, task_id=task.pk)
    assert (read.ref, read.kind, read.name, read.content) == (ref, "sensitive_input", "context", CONTEXT)
    assert read.expires_at == row(ref).expires_at
    clock.advance(timedelta(hours=1))
    for sweep in (False, True):
        if sweep:
            retention_sweep()  # the file is gone now
        with pytest.raises(RetentionExpired) as gone:
            fetch(ref, task_id=task.pk)
        named = {k: gone.value.details[k] for k in ("retained", "version", "kind", "name")}
        assert named == {"retained": ref.id, "version": 1, "kind": "sensitive_input", "name": "context"}
    new = keep(task, content=b"manifest of projects/acme@7, re-read")
    assert (new.id != ref.id, new.version) == (True, 2)
    assert fetch(new).content == b"manifest of projects/acme@7, re-read"
    assert fetch(new, task_id=task.pk).ref == new


# --- extension ----------------------------------------------------------------------------------------------------


def test_an_extension_with_a_reason_moves_the_expiry_and_is_audited(task, operator, clock) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    before = row(ref).expires_at
    until = clock.now() + timedelta(days=2)
    extended = extend(operator, ref, until)
    assert (extended.expires_at, extended.extended_count) == (until, 1)
    event = AuditEvent.objects.order_by("-seq").first()
    assert event is not None
    assert (event.action, event.actor_id, event.task_id, event.reason) == (
        "retention_extended",
        "olga",
        task.pk,
        REASON,
    )
    assert event.details["retained"] == ref.id and event.details["version"] == 1
    assert event.details["expires_before"] == before.isoformat()
    assert event.details["expires_after"] == until.isoformat()
    assert verify_audit().broken_at is None
    clock.advance(timedelta(hours=1))
    assert retention_sweep().purged == 0, "the sweep honours the extension"
    assert fetch(ref).content == CONTEXT


@pytest.mark.parametrize("reason", ["", "   ", "because", "  short!  "])
def test_an_extension_without_a_real_reason_is_refused(task, operator, clock, retention_settings, reason) -> None:
    ref = keep(task)
    assert_refused(
        ExtensionReasonMissing,
        retention_settings,
        lambda: extend(operator, ref, clock.now() + timedelta(days=8), reason),
    )


def test_an_extension_is_bounded_from_creation(task, operator, clock, settings, retention_settings) -> None:
    ref = keep(task)
    bound = row(ref).created_at + settings.RECKON_RETENTION_MAX_EXTENSION
    assert_refused(ExtensionBeyondBound, retention_settings, lambda: extend(operator, ref, bound + TICK))
    clock.advance(timedelta(days=6))
    assert extend(operator, ref, bound).expires_at == bound  # exactly at the bound is allowed
    assert_refused(ExtensionBeyondBound, retention_settings, lambda: extend(operator, ref, bound + timedelta(days=1)))


def test_extensions_are_limited_in_number(task, operator, clock, settings, retention_settings) -> None:
    ref = keep(task)
    expiry = row(ref).expires_at
    for n in range(settings.RECKON_RETENTION_MAX_EXTENSIONS):
        expiry += timedelta(days=1)
        assert extend(operator, ref, expiry).extended_count == n + 1
    assert_refused(ExtensionLimitReached, retention_settings, lambda: extend(operator, ref, expiry + timedelta(days=1)))
    assert AuditEvent.objects.filter(action="retention_extended").count() == settings.RECKON_RETENTION_MAX_EXTENSIONS


def test_an_extension_must_be_later_than_the_current_expiry(task, operator, clock, retention_settings) -> None:
    ref = keep(task)
    expiry = row(ref).expires_at
    for until in (expiry, expiry - timedelta(hours=1)):
        assert_refused(ExtensionRefused, retention_settings, partial(extend, operator, ref, until))


def test_an_extension_refuses_an_object_of_another_task_and_one_changed_since_it_was_seen(
    task, other_task, operator, root, clock, retention_settings
) -> None:
    ref = keep(task)
    later = row(ref).expires_at + timedelta(days=1)
    assert_refused(
        RetentionNotFound,
        retention_settings,
        lambda: retention_extend(actor=root, ref=ref, until=later, reason=REASON, task_id=other_task.pk),
    )
    assert extend(operator, ref, later).extended_count == 1  # by someone else, meanwhile
    refused = assert_refused(
        ExtensionRefused,
        retention_settings,
        lambda: retention_extend(
            actor=root, ref=ref, until=later + timedelta(days=1), reason=REASON, task_id=task.pk, seen_extensions=0
        ),
    )
    assert "changed meanwhile" in str(refused)
    kept = retention_extend(
        actor=root, ref=ref, until=later + timedelta(days=1), reason=REASON, task_id=task.pk, seen_extensions=1
    )
    assert kept.extended_count == 2


def test_an_expired_or_purged_object_cannot_be_extended(task, operator, clock, retention_settings) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    later = clock.now() + timedelta(days=1)
    assert_refused(RetentionExpired, retention_settings, lambda: extend(operator, ref, later))
    retention_sweep()
    assert_refused(RetentionExpired, retention_settings, lambda: extend(operator, ref, later))


@pytest.mark.parametrize("who", ["outsider", "agent", "auditor"])
def test_only_a_person_who_may_operate_the_task_extends(task, root, clock, retention_settings, who) -> None:
    ref = keep(task)
    actor = {
        "outsider": lambda: person("otto", "operator"),
        "agent": lambda: Principal.agent("agent-1"),
        "auditor": lambda: person("aude", "auditor"),
    }[who]()
    assert_refused(PermissionDenied, retention_settings, lambda: extend(actor, ref, clock.now() + timedelta(days=8)))
    assert extend(root, ref, clock.now() + timedelta(days=8)).extended_count == 1  # an admin may


# --- sweep --------------------------------------------------------------------------------------------------------


def test_a_purge_removes_the_file_and_keeps_the_row_as_the_record(task, clock) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    stored = path_of(ref)
    clock.advance(timedelta(hours=2))
    report = retention_sweep()
    assert (report.purged, report.files_removed, report.files_missing, report.resumed) == (1, 1, 0, 0)
    assert not stored.exists()
    r = row(ref)
    assert (r.pk, r.version, r.sha256, r.status) == (ref.id, 1, hashlib.sha256(CONTEXT).hexdigest(), "purged")
    assert r.purged_at == clock.now() and r.purge_started_at == clock.now()


def test_sweeping_twice_gives_the_same_result(task, other_task, clock, retention_settings) -> None:
    for n in range(3):
        keep(task, name=f"in-{n}", ttl=timedelta(hours=1))
    keep(other_task, ttl=timedelta(days=2))
    clock.advance(timedelta(hours=1))
    first = retention_sweep()
    after_first = everything(retention_settings)
    second = retention_sweep()
    assert first.purged == 3
    assert second == SweepReport()
    assert everything(retention_settings) == after_first


@pytest.mark.parametrize("file_left", [True, False], ids=["file-still-there", "file-already-gone"])
def test_a_sweep_that_crashed_half_way_is_finished_by_the_next(task, clock, file_left) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    # The crashed sweep claimed the object (and maybe removed its file) but never marked it purged.
    RetainedObject.objects.filter(pk=ref.id).update(status=RetainedStatus.PURGING, purge_started_at=clock.now())
    if not file_left:
        path_of(ref).unlink()
    report = retention_sweep()
    assert (report.purged, report.resumed) == (1, 1)
    assert (report.files_removed, report.files_missing) == ((1, 0) if file_left else (0, 1))
    assert row(ref).status == RetainedStatus.PURGED
    assert not path_of(ref).exists()
    assert retention_sweep() == SweepReport()


def test_a_sweep_that_cannot_remove_a_file_leaves_it_purging_and_the_next_retries(
    task, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    real_unlink = Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refuse)
    report = retention_sweep()
    assert (report.purged, len(report.failed)) == (0, 1)
    assert row(ref).status == RetainedStatus.PURGING
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert (retention_sweep().purged, row(ref).status) == (1, RetainedStatus.PURGED)


def test_the_sweep_never_touches_another_tasks_objects(task, other_task, clock) -> None:
    mine = keep(task, ttl=timedelta(hours=1))
    theirs = keep(other_task, ttl=timedelta(hours=3))
    theirs_path = path_of(theirs)
    theirs_bytes = theirs_path.read_bytes()
    # A copy of their file under this task's folder is this folder's orphan, not their object.
    misplaced = path_of(mine).parent / theirs_path.name
    misplaced.write_bytes(theirs_bytes)
    clock.advance(timedelta(hours=2))
    report = retention_sweep()
    assert (report.purged, report.orphans_removed) == (1, 1)
    assert not misplaced.exists()
    assert theirs_path.read_bytes() == theirs_bytes
    assert row(theirs).status == RetainedStatus.LIVE
    assert fetch(theirs).content == CONTEXT


def test_the_sweep_never_touches_receipts_or_attachment_files(
    task, agent_lease: Callable[..., Lease], clock, retention_settings
) -> None:
    lease = agent_lease(task)
    op = record(send(task, lease, "a"), Committed(remote_id="batch-1", count=10), lease)
    digest, _ = store_attachment(AttachmentIn(name="screenshot.png", content=b"evidence of the copy"))
    evidence = attachment_path(digest)
    old = time.time() - 86_400 * 365
    os.utime(evidence, (old, old))  # older than any grace: still never the sweep's
    receipts = list(Receipt.objects.order_by("pk").values_list())
    assert receipts and Receipt.objects.filter(operation=op).exists()
    keep(task, ttl=timedelta(hours=1))
    retain(task_id=task.pk, kind="debug_artifact", name="copy response", content={"remote_id": "batch-1"})
    clock.advance(timedelta(days=30))
    report = retention_sweep()
    assert report.purged == 2
    assert list(Receipt.objects.order_by("pk").values_list()) == receipts
    assert evidence.read_bytes() == b"evidence of the copy"
    assert set(files(retention_settings)) == {str(evidence.relative_to(retention_settings))}


def test_an_orphan_file_is_removed_only_once_older_than_the_grace(task, clock) -> None:
    """A retain that died between writing its file and inserting its row leaves an orphan."""
    ref = keep(task, ttl=timedelta(days=1))
    stored = path_of(ref)
    RetainedObject.objects.filter(pk=ref.id).delete()  # the row that never landed
    clock.advance(ORPHAN_GRACE - TICK)
    assert retention_sweep().orphans_removed == 0
    assert stored.exists()
    clock.advance(TICK)
    assert retention_sweep().orphans_removed == 1
    assert not stored.exists()


def test_leftover_partials_are_removed_and_unknown_files_left_alone(task, clock) -> None:
    ref = keep(task)
    folder = path_of(ref).parent
    torn = folder / f"{row(ref).uid}-v2.bin.4242.partial"
    torn.write_bytes(b"RKR")  # its writer died mid-write: no readable header
    old = time.time() - 3600
    os.utime(torn, (old, old))
    fresh = folder / f"{row(ref).uid}-v3.bin.4243.partial"
    fresh.write_bytes(path_of(ref).read_bytes())  # written just now by the clock in its header
    stranger = folder / "notes.txt"
    stranger.write_text("not ours")
    (retention_root() / "README").write_text("not ours either")
    clock.advance(timedelta(seconds=30))
    report = retention_sweep()
    assert (report.orphans_removed, report.unrecognised) == (1, 2)
    assert not torn.exists() and fresh.exists() and stranger.exists()
    assert fetch(ref).content == CONTEXT


def test_the_sweep_follows_no_symlink_out_of_its_folder(task, clock, retention_settings) -> None:
    elsewhere = retention_settings / "elsewhere"
    elsewhere.mkdir()
    bait = elsewhere / "00000000-0000-0000-0000-000000000000-v1.bin.1.partial"
    bait.write_bytes(b"RKR")
    os.utime(bait, (0, 0))
    retention_root().mkdir(parents=True, exist_ok=True)
    (retention_root() / "11111111-1111-1111-1111-111111111111").symlink_to(elsewhere, target_is_directory=True)
    report = retention_sweep()
    assert (report.orphans_removed, report.unrecognised) == (0, 1)
    assert bait.exists()


def test_a_purged_objects_file_that_reappears_is_removed(task, clock) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    blob = path_of(ref).read_bytes()
    clock.advance(timedelta(hours=1))
    retention_sweep()
    path_of(ref).write_bytes(blob)  # restored from a backup, say
    assert retention_sweep().orphans_removed == 1
    assert not path_of(ref).exists()


def test_the_sweep_works_in_batches(task, clock) -> None:
    refs = [keep(task, name=f"n{n}", ttl=timedelta(hours=1)) for n in range(5)]
    clock.advance(timedelta(hours=1))
    reports = [retention_sweep(limit=2) for _ in range(3)]
    assert [r.purged for r in reports] == [2, 2, 1]
    assert [r.more for r in reports] == [True, True, False]
    assert {row(ref).status for ref in refs} == {RetainedStatus.PURGED}


def test_an_explicit_now_decides_what_is_due(task, clock) -> None:
    ref = keep(task, ttl=timedelta(hours=1))
    assert retention_sweep(now=clock.now() + timedelta(minutes=59)).purged == 0
    assert retention_sweep(now=clock.now() + timedelta(hours=1)).purged == 1
    assert row(ref).status == RetainedStatus.PURGED


def test_the_job_and_the_command_run_the_sweep(task, clock, settings) -> None:
    assert sweep_job.name == "retention.sweep"
    assert settings.CELERY_BEAT_SCHEDULE["retention-sweep"] == {"task": "retention.sweep", "schedule": 300.0}
    keep(task, ttl=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    assert sweep_job() == SweepReport(purged=1, files_removed=1).as_dict()
    keep(task, name="second", ttl=timedelta(hours=1))
    keep(task, name="third", ttl=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    out = io.StringIO()
    call_command("retention_sweep", "--limit", "1", "--all", stdout=out)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1].split(",")[0].strip() for line in lines] == [
        "1 purged (0 resumed)",
        "1 purged (0 resumed)",
        "0 purged (0 resumed)",
    ]
    assert set(RetainedObject.objects.values_list("status", flat=True)) == {RetainedStatus.PURGED}


def test_the_checks_warn_about_the_development_key_and_refuse_a_bad_one(settings) -> None:
    settings.DEBUG = False
    settings.RECKON_RETENTION_KEY = ""
    assert [m.id for m in checks.retention_key_check()] == ["retention.W001"]
    settings.RECKON_RETENTION_KEY = "nope"
    assert [m.id for m in checks.retention_key_check()] == ["retention.E001"]
    settings.RECKON_RETENTION_KEY = KEY
    assert checks.retention_key_check() == []


# --- real concurrency (PostgreSQL) ----------------------------------------------------------------------------------

THREADS = 6
READERS = frozenset(range(2, THREADS, 3))  # these threads play the recovery path; the others sweep
needs_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason=f"needs PostgreSQL for real concurrent sweepers (database vendor is {connection.vendor}); "
    "set DATABASE_URL=postgres://…",
)


@pytest.mark.postgres
@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_sweeps_purge_each_object_exactly_once_beside_recovery(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    tasks = [make_task(title=f"t{n}") for n in range(3)]
    contents: dict[Ref, bytes] = {}
    for n in range(60):
        ref = keep(tasks[n % 3], name=f"input-{n}", content=f"content {n}".encode(), ttl=timedelta(hours=1))
        contents[ref] = f"content {n}".encode()
    survivor = keep(tasks[0], name="kept", content=b"still needed", ttl=timedelta(days=1))
    due_at = clock.now() + timedelta(hours=1)
    reports: list[SweepReport] = []
    reads: Counter[str] = Counter()
    lock = threading.Lock()

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        if index in READERS:
            # Recovery reading at the database time before expiry, while the sweepers purge what is due then.
            for ref, content in list(contents.items()) * 2:
                try:
                    got = fetch(ref).content
                    assert got == content
                    outcome = "read"
                except RetentionExpired:
                    outcome = "expired"
                with lock:
                    reads[outcome] += 1
            return
        while True:
            report = retention_sweep(now=due_at, limit=7)
            with lock:
                reports.append(report)
            if not report.more and report.purged == 0:
                return

    run_threads(THREADS, work)

    purged = sum(r.purged for r in reports)
    removed = sum(r.files_removed for r in reports)
    print(
        f"\n[retention_sweep] sweepers={THREADS - len(READERS)} passes={len(reports)} purged={purged} "
        f"files removed={removed} already gone={sum(r.files_missing for r in reports)} "
        f"resumed={sum(r.resumed for r in reports)} reads={dict(reads)}"
    )
    assert purged == len(contents), "each object is purged exactly once"
    assert removed == len(contents), "each file is removed exactly once"
    assert not any(r.failed for r in reports)
    assert set(RetainedObject.objects.exclude(pk=survivor.id).values_list("status", flat=True)) == {"purged"}
    assert all(not path_of(ref).exists() for ref in contents)
    assert fetch(survivor).content == b"still needed"
    assert sum(reads.values()) == len(READERS) * 2 * len(contents), "every read gave the content or RetentionExpired"


@pytest.mark.postgres
@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_retains_of_one_name_get_distinct_versions_and_leave_no_stray_file(
    make_task: Callable[..., Task], clock: ControllableClock
) -> None:
    task = make_task()
    refs: list[Ref] = []
    lock = threading.Lock()

    def work(index: int, barrier: threading.Barrier) -> None:
        for n in range(5):
            barrier.wait()
            ref = keep(task, name="context", content=f"{index}-{n}".encode())
            with lock:
                refs.append(ref)

    run_threads(THREADS, work)
    versions = sorted(ref.version for ref in refs)
    assert versions == list(range(1, THREADS * 5 + 1))
    folder = retention_root() / str(task.uid)
    assert sorted(p.name for p in folder.iterdir()) == sorted(path_of(ref).name for ref in refs)
    assert {fetch(ref).content for ref in refs} == {f"{i}-{n}".encode() for i in range(THREADS) for n in range(5)}
