"""Checkpoint hygiene (invariant 8): payloads hold references, never secrets or large model context.

Every event payload, receipt, node output and plan document passes ``check_payload`` when written;
``scan_payload`` is the same test as a scanner (``manage.py verify_log`` runs it over stored rows).

Cap: 16 KiB of canonical JSON per payload — room for ids, versions, counts and digests, far too
small for a transcript.
"""

import json
import re
from collections.abc import Iterator
from typing import Any

from tasks.errors import PayloadTooLarge, SecretInPayload

PAYLOAD_CAP_BYTES = 16 * 1024

_SECRET_KEY = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key|access[_-]?key|authorization|"
    r"credential|cookie|session[_-]?id|bearer)",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"(-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"
    r"|://[^/\s:@]+:[^/\s@]+@)",  # credentials inside a URL
)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def scan_payload(value: Any, path: str = "$") -> Iterator[str]:
    """Yield the path of every credential-like key or value found."""
    if isinstance(value, dict):
        for key, item in value.items():
            if _SECRET_KEY.search(str(key)):
                yield f"{path}.{key}"
            yield from scan_payload(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from scan_payload(item, f"{path}[{index}]")
    elif isinstance(value, str) and _SECRET_VALUE.search(value):
        yield path


def check_payload(value: Any, *, what: str) -> None:
    """Raise PayloadTooLarge or SecretInPayload; the message names the place, never the secret."""
    size = len(canonical_json(value).encode())
    if size > PAYLOAD_CAP_BYTES:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {PAYLOAD_CAP_BYTES}-byte cap: store a reference (id, version, digest)",
            size=size,
            cap=PAYLOAD_CAP_BYTES,
        )
    found = list(scan_payload(value))
    if found:
        raise SecretInPayload(f"{what} carries credential-like data at {', '.join(found)}", paths=found)
