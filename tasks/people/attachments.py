"""Evidence files: content-addressed under ``<data>/attachments/<sha256[:2]>/<sha256>``.

The bytes are written before the database row (outside any transaction, no I/O inside one); a file whose
row never landed is an orphan with a known digest, harmless and re-usable.
"""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from audit.hygiene import PayloadTooLarge

ATTACHMENT_CAP_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class AttachmentIn:
    name: str
    content: bytes


def attachments_root() -> Path:
    return Path(settings.DATA_DIR) / "attachments"


def attachment_path(sha256: str) -> Path:
    return attachments_root() / sha256[:2] / sha256


def store_attachment(item: AttachmentIn) -> tuple[str, int]:
    """Store the bytes (idempotent by digest) and return (sha256, size)."""
    if len(item.content) > ATTACHMENT_CAP_BYTES:
        raise PayloadTooLarge(
            f"attachment {item.name!r} is {len(item.content)} bytes, over the {ATTACHMENT_CAP_BYTES}-byte cap"
        )
    digest = hashlib.sha256(item.content).hexdigest()
    path = attachment_path(digest)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(item.content)
        partial.replace(path)  # atomic: a reader never sees half a file
    return digest, len(item.content)


def read_attachment(sha256: str) -> bytes:
    """The stored bytes, checked against their digest."""
    content = attachment_path(sha256).read_bytes()
    if hashlib.sha256(content).hexdigest() != sha256:
        raise ValueError(f"attachment {sha256} does not match its digest")
    return content
