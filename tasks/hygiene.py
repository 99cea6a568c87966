"""Checkpoint hygiene (invariant 8): payloads hold references, never secrets or large model context.

Every event payload, receipt, node output and plan document passes ``check_payload`` when written;
``scan_payload`` is the same test as a scanner (``manage.py verify_log`` runs it over stored rows).

Cap: 16 KiB of canonical JSON per payload — room for ids, versions, counts and digests, far too
small for a transcript.
"""

import base64
import binascii
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

from tasks.errors import PayloadTooLarge, SecretInPayload

PAYLOAD_CAP_BYTES = 16 * 1024
# Plan documents are definitions, not checkpoints: a larger cap, still far from a transcript.
PLAN_CAP_BYTES = 256 * 1024

# Credential-like keys, judged on the words of the key ("db_password", "accessToken", "Authorization"),
# so "objects_passed" or "tokens_used" are not taken for secrets.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pass",
        "pwd",
        "secret",
        "token",
        "authorization",
        "auth",
        "credential",
        "credentials",
        "cookie",
        "bearer",
        "apikey",
        "privatekey",
        "accesskey",
        "secretkey",
        "sessionid",
        "sessionkey",
    }
)
_KEY_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_SECRET_VALUE = re.compile(
    r"(-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"
    r"|://[^/\s:@]+:[^/\s@]+@)",  # credentials inside a URL
)
# "Bearer <token>" / "Basic <base64 user:pass>": only when what follows looks like a credential, not prose
# ("Basic authentication required").
_AUTH_SCHEME = re.compile(r"\b(Bearer|Basic)\s+([A-Za-z0-9._~+/=-]{8,})")


def _is_secret_key(key: str) -> bool:
    words = [w.lower() for w in _KEY_WORDS.findall(key)]
    pairs = [a + b for a, b in itertools.pairwise(words)]
    return any(w in _SECRET_WORDS for w in words + pairs)


def _looks_like_credential(scheme: str, value: str) -> bool:
    if scheme == "Basic":
        try:
            decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            return False
        return b":" in decoded
    return len(value) >= 16 and any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


def _is_secret_value(value: str) -> bool:
    if _SECRET_VALUE.search(value):
        return True
    return any(_looks_like_credential(m.group(1), m.group(2)) for m in _AUTH_SCHEME.finditer(value))


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def scan_payload(value: Any, path: str = "$") -> Iterator[str]:
    """Yield the path of every credential-like key or value found."""
    if isinstance(value, dict):
        for key, item in value.items():
            if _is_secret_key(str(key)):
                yield f"{path}.{key}"
            yield from scan_payload(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from scan_payload(item, f"{path}[{index}]")
    elif isinstance(value, str) and _is_secret_value(value):
        yield path


def check_payload(value: Any, *, what: str, cap: int = PAYLOAD_CAP_BYTES) -> None:
    """Raise PayloadTooLarge or SecretInPayload; the message names the place, never the secret."""
    size = len(canonical_json(value).encode())
    if size > cap:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {cap}-byte cap: store a reference (id, version, digest)",
            size=size,
            cap=cap,
        )
    found = list(scan_payload(value))
    if found:
        raise SecretInPayload(f"{what} carries credential-like data at {', '.join(found)}", paths=found)
