"""Sealing retained objects at rest: AES-256-GCM, one random nonce per file, the object's identity as
associated data.

File layout (all of it authenticated)::

    magic "RKR1" | key id (8 bytes) | written at (µs since the epoch, database clock) | nonce (12) | ciphertext+tag

The key id names the key without revealing it, so a file sealed under another key fails with
RetentionKeyMismatch instead of a bare "does not authenticate". The written-at time is readable without the
key: the sweep judges an orphan's age by it, on the database clock like every other time decision.
"""

import base64
import binascii
import hashlib
import os
import struct
from datetime import UTC, datetime, timedelta

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from retention.errors import RetentionCorrupt, RetentionKeyInvalid, RetentionKeyMismatch, RetentionKeyMissing

MAGIC = b"RKR1"
KEY_BYTES = 32
_HEADER = struct.Struct(">4s8sq12s")
HEADER_BYTES = _HEADER.size
_TAG_BYTES = 16
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DEVELOPMENT_INFO = b"reckon retention development key v1"


_DEVELOPMENT_MODES = ("development", "test")


def using_development_key() -> bool:
    """True when no RECKON_RETENTION_KEY is configured and the key is derived from SECRET_KEY."""
    return not str(settings.RECKON_RETENTION_KEY).strip()


def retention_key() -> bytes:
    """The configured key. Without one, only in the development and test modes (settings.RECKON_ENV), a development
    key derived from SECRET_KEY; in production none is derived at all (RetentionKeyMissing), so no object is ever
    sealed or opened with a key anyone holding SECRET_KEY, or the public development one, could compute."""
    configured = str(settings.RECKON_RETENTION_KEY).strip()
    if not configured:
        if getattr(settings, "RECKON_ENV", "production") not in _DEVELOPMENT_MODES:
            raise RetentionKeyMissing("RECKON_RETENTION_KEY is not set, and production derives no key")
        return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_DEVELOPMENT_INFO).derive(
            str(settings.SECRET_KEY).encode()
        )
    try:
        key = base64.b64decode(configured, validate=True)
    except (binascii.Error, ValueError):
        try:
            key = base64.urlsafe_b64decode(configured)
        except (binascii.Error, ValueError):
            key = b""
    if len(key) != KEY_BYTES:
        raise RetentionKeyInvalid(f"RECKON_RETENTION_KEY must be the base64 text of {KEY_BYTES} bytes")
    return key


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"reckon-retention-key-id:" + key).digest()[:8]


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def seal(plaintext: bytes, *, identity: bytes, written_at: datetime) -> bytes:
    key = retention_key()
    header = _HEADER.pack(MAGIC, key_id(key), _micros(written_at), os.urandom(12))
    return header + AESGCM(key).encrypt(header[-12:], plaintext, header + identity)


def unseal(blob: bytes, *, identity: bytes) -> tuple[bytes, datetime]:
    """The plaintext and the time it was written. Raises RetentionCorrupt or RetentionKeyMismatch."""
    if len(blob) < HEADER_BYTES + _TAG_BYTES:
        raise RetentionCorrupt("the file is truncated")
    header = blob[:HEADER_BYTES]
    magic, sealed_with, micros, nonce = _HEADER.unpack(header)
    if magic != MAGIC:
        raise RetentionCorrupt("the file is not a sealed retained object")
    key = retention_key()
    if sealed_with != key_id(key):
        raise RetentionKeyMismatch(
            f"the file was sealed with key {sealed_with.hex()}, the configured key is {key_id(key).hex()}"
        )
    try:
        plaintext = AESGCM(key).decrypt(nonce, blob[HEADER_BYTES:], header + identity)
    except InvalidTag as exc:
        raise RetentionCorrupt("the file does not authenticate: altered, or the file of another object") from exc
    return plaintext, _EPOCH + timedelta(microseconds=micros)


def written_at(head: bytes) -> datetime | None:
    """When a sealed file was written, from its (unauthenticated) header; None if it is not one of ours."""
    if len(head) < HEADER_BYTES:
        return None
    magic, _, micros, _ = _HEADER.unpack(head[:HEADER_BYTES])
    if magic != MAGIC:
        return None
    try:
        return _EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        return None
