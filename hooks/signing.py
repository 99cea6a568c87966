"""Signing a delivery, and the reference verification a receiver does.

``Reckon-Signature: v1=<hex>`` where ``hex`` = HMAC-SHA256(secret, ``"<timestamp>."`` + raw body), ``timestamp``
being ``Reckon-Timestamp`` (Unix seconds). The timestamp is inside the MAC so an old delivery cannot be replayed
with a fresh timestamp; the receiver refuses timestamps outside its tolerance and dedupes by ``Reckon-Delivery``.
The ``v1=`` prefix names the scheme so that a later one can be sent beside it during a change-over."""

import hashlib
import hmac

SCHEME = "v1"
TOLERANCE_SECONDS = 300  # what receivers are told to accept (docs/api.md): five minutes either way

HEADER_DELIVERY = "Reckon-Delivery"
HEADER_EVENT = "Reckon-Event"
HEADER_TIMESTAMP = "Reckon-Timestamp"
HEADER_SIGNATURE = "Reckon-Signature"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{SCHEME}={mac.hexdigest()}"


def verify(
    secret: str, *, timestamp: str, body: bytes, signature: str, now: float, tolerance: int = TOLERANCE_SECONDS
) -> bool:
    """True when ``signature`` (the header, possibly several comma-separated schemes) holds a v1 MAC of this body
    and timestamp, and the timestamp is within ``tolerance`` seconds of ``now``. Compared in constant time."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent_at) > tolerance:
        return False
    expected = sign(secret, sent_at, body)
    return any(hmac.compare_digest(expected, part.strip()) for part in signature.split(","))
