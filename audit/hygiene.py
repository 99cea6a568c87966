"""Checkpoint hygiene (invariant 8): payloads hold references, never secrets or large model context.

Every event payload, receipt, node output and plan document passes ``check_payload`` when written — an event's in
its append (``tasks.engine.events.chain_event``), an audit row's in ``audit.services.audit_append``; ``scan_payload``
is the same test as a scanner (``manage.py verify_log`` runs it over stored rows).

Cap: 16 KiB of canonical JSON per payload (and per node input) — room for ids, versions, counts and
digests, far too small for a transcript.

Secrets are judged on keys ("db_password", "Authorization") and on every string value: credential formats
(private key blocks, AWS / GitHub / Slack / JWT tokens, user:password in URLs, Bearer / Basic credentials) and
credentials written as text ("password=…", "passwd: x", "X-Api-Key: …", "--token …"), while prose about
credentials ("the password policy was reviewed") and redactions ("password=***") pass.
"""

import base64
import binascii
import functools
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

from audit.errors import Refused


class PayloadRejected(Refused):
    code = "payload_rejected"


class PayloadTooLarge(PayloadRejected):
    code = "payload_too_large"


class SecretInPayload(PayloadRejected):
    code = "secret_in_payload"


PAYLOAD_CAP_BYTES = 16 * 1024
# Plan documents are definitions, not checkpoints: a larger cap, still far from a transcript.
PLAN_CAP_BYTES = 256 * 1024
# One node's input is data the node works on — literals, versioned refs, outputs of earlier nodes — held to the
# checkpoint cap, not the plan document's: a plan must not smuggle a transcript in as a node's input.
NODE_INPUT_CAP_BYTES = PAYLOAD_CAP_BYTES

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
    r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key ids, long-term and temporary
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}"
    r"|\bxox[abeprs]-[A-Za-z0-9-]{10,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"
    r"|://[^/\s:@]*:[^/\s@]+@"  # credentials inside a URL (the user may be empty: redis://:pw@host)
    r"|(?:^|\s)(?:-u|--user)\s+[^\s:/]+:\S+)",  # curl -u user:password
)
# "Bearer <token>" / "Basic <base64 user:pass>": only when what follows looks like a credential, not prose
# ("Basic authentication required").
_AUTH_SCHEME = re.compile(r"\b(Bearer|Basic)\s+([A-Za-z0-9._~+/=-]{8,})")
# A credential written as text: a credential-like name, then "=" or ":" (or "=>"), then a value —
# "password=…", "passwd: x", "X-Api-Key: …", "Authorization: Bearer …", '"token": "…"', "?token=…", "API key: …" —
# or a command-line flag, "--password …". The name is judged like a key (one word, or two: "API key"), so prose
# that only talks about credentials ("the password policy was reviewed", "token bucket rate limit") has no
# separator and value and is not refused. A lookahead finds overlapping candidates ("note: password=…"); every
# part is bounded (a value is judged on its first 64 characters), so a scan stays linear in the text's length.
_NAMED_VALUE = re.compile(
    r"(?<![A-Za-z0-9_])(?=(?P<name>[A-Za-z][\w.-]{0,63}(?: [A-Za-z][\w.-]{0,63})?)[\"']?\s*(?:=>|[:=])"
    r"\s*[\"']?(?P<value>[^\s\"',;&]{1,64}))"
)
_FLAG_VALUE = re.compile(r"(?<![\w-])--(?P<name>[A-Za-z][\w-]{0,63})(?:=|\s+)[\"']?(?P<value>[^\s\"'-][^\s\"']{0,63})")
# "pass" alone is ambiguous in text ("checks pass=3 fail=0"); every other credential word counts.
_TEXT_AMBIGUOUS = frozenset({"pass"})
# A value that is a redaction or the word of an error message ("token: expired", "password: required",
# "invalid token: the token has expired") says nothing secret.
_NOT_A_VALUE = frozenset(
    {
        "redacted",
        "hidden",
        "masked",
        "omitted",
        "removed",
        "required",
        "missing",
        "invalid",
        "expired",
        "revoked",
        "denied",
        "rejected",
        "incorrect",
        "wrong",
        "none",
        "null",
        "nil",
        "empty",
        "unset",
        "a",
        "an",
        "the",
        "is",
        "was",
        "has",
        "must",
        "not",
        "no",
    }
)


def _key_words(key: str) -> list[str]:
    return [w.lower() for w in _KEY_WORDS.findall(key)]


@functools.lru_cache(maxsize=4096)
def _is_secret_key(key: str) -> bool:
    """Judged once per distinct key: payload keys are a small vocabulary, and every write scans its payload."""
    words = _key_words(key)
    pairs = [a + b for a, b in itertools.pairwise(words)]
    return any(w in _SECRET_WORDS for w in words + pairs)


def _is_secret_name_in_text(name: str) -> bool:
    """The name before a separator in text: judged like a key on its last word ("db_password", "X-Api-Key"),
    or on the two words it spans ("API key", "session id"), so "authorization failed: 403" is prose."""
    *before, last = name.split(" ")
    words = _key_words(last)
    candidates = words + [a + b for a, b in itertools.pairwise(words)]
    head = _key_words(before[0]) if before else []
    if head and words:
        candidates.append(head[-1] + words[0])
    return any(w in _SECRET_WORDS and w not in _TEXT_AMBIGUOUS for w in candidates)


def _is_a_value(value: str) -> bool:
    bare = value.strip("<>[]().").lower()
    return bare not in _NOT_A_VALUE and bool(set(bare) - set("*•"))  # "*****" is a redaction


def _looks_like_credential(scheme: str, value: str) -> bool:
    if scheme == "Basic":
        try:
            decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            return False
        return b":" in decoded
    return len(value) >= 16 and any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


# A credential written as text is named by words that, joined, contain one of these (every entry of _SECRET_WORDS
# does: "secretkey" contains "secret", "sessionid" "session"); text whose letters, joined, contain none
# names no credential and is not searched for one (the searches below are the costly part of a payload's scan).
_TEXT_HINTS = (
    "pass",
    "pwd",
    "secret",
    "token",
    "auth",
    "credential",
    "cookie",
    "bearer",
    "apikey",
    "privatekey",
    "accesskey",
    "session",
)


def _hints_a_credential(letters: str) -> bool:
    lowered = letters.lower()
    return any(hint in lowered for hint in _TEXT_HINTS)


# Every alternative of _SECRET_VALUE contains one of these literally (it is case-sensitive), and _AUTH_SCHEME one
# of the last two: text without any is not searched (a search costs far more than these substring tests).
_FORMAT_LITERALS = (
    "-----BEGIN ",
    "AKIA",
    "ASIA",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "xox",
    "sk-",
    "k_live_",
    "k_test_",
    "AIza",
    "eyJ",
    "://",
    "-u",  # "-u user:password" and "--user …"
)
_SCHEME_LITERALS = ("Bearer", "Basic")


def _has_secret_format(value: str) -> bool:
    return any(literal in value for literal in _FORMAT_LITERALS) and _SECRET_VALUE.search(value) is not None


def _has_auth_scheme(value: str) -> bool:
    return any(literal in value for literal in _SCHEME_LITERALS) and _AUTH_SCHEME.search(value) is not None


def _letters(text: str, *, breaks: bool = False) -> str:
    """``text`` without everything but its ASCII letters (and, with ``breaks``, its line breaks), as
    ``re.sub(r"[^A-Za-z]+", "", text)`` gives it: the UTF-8 bytes of a non-ASCII character (a lone surrogate's too)
    are all above 127 and go too. ``bytes.translate`` does it in one C pass, several times faster than the search
    (every write's event is filtered)."""
    return text.encode("utf-8", "surrogatepass").translate(None, _NOR_BREAK if breaks else _NOT_LETTERS).decode("ascii")


_KEPT = frozenset(range(ord("A"), ord("Z") + 1)) | frozenset(range(ord("a"), ord("z") + 1))
_NOT_LETTERS = bytes(b for b in range(256) if b not in _KEPT)
_NOR_BREAK = bytes(b for b in range(256) if b not in _KEPT and b != ord("\n"))


def _is_secret_value(value: str) -> bool:
    if _has_secret_format(value):
        return True
    if _has_auth_scheme(value) and any(
        _looks_like_credential(m.group(1), m.group(2)) for m in _AUTH_SCHEME.finditer(value)
    ):
        return True
    if not _hints_a_credential(_letters(value)):
        return False
    return any(
        _is_secret_name_in_text(m.group("name")) and _is_a_value(m.group("value"))
        for pattern in (_NAMED_VALUE, _FLAG_VALUE)
        for m in pattern.finditer(value)
    )


def canonical_json(value: Any) -> str:
    return _CANONICAL(value)


def digest_of(value: Any, *, canonical: str | None = None) -> str:
    """``sha256:`` and the hex digest of the value's canonical JSON (``canonical``: that text, when the caller
    made it already)."""
    text = canonical if canonical is not None else canonical_json(value)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# What json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str) does, without
# making an encoder per call (json.dumps makes one whenever an option is not its default): the same text.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode


def scan_payload(value: Any, path: str = "$", ids: bool = False) -> Iterator[str]:
    """Yield the path of every credential-like key or value found. ``ids``: a whole number under a credential-like
    key is the id of the row it names (an audit row's ``"token": 12``, the API token issued), not a credential."""
    if isinstance(value, dict):
        for key, item in value.items():
            if _is_secret_key(str(key)) and not (ids and type(item) is int):
                yield f"{path}.{key}"
            yield from scan_payload(item, f"{path}.{key}", ids)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from scan_payload(item, f"{path}[{index}]", ids)
    elif isinstance(value, str) and _is_secret_value(value):
        yield path


def _texts(value: Any, into: list[str]) -> list[str]:
    """Every key and string value of ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            into.append(str(key))
            _texts(item, into)
    elif isinstance(value, list | tuple):
        for item in value:
            _texts(item, into)
    elif isinstance(value, str):
        into.append(value)
    return into


def may_hold_secret(value: Any, *, canonical: str | None = None) -> bool:
    """False when no key or string of ``value`` can be judged a credential by ``scan_payload``, decided on all of
    them at once: three searches over their text joined by line breaks, instead of several per string (every write
    scans its event). Each string keeps its bounds in the joined text — a line break is neither a word character
    nor a letter, and it is whitespace — so whatever ``_SECRET_VALUE`` or ``_AUTH_SCHEME`` finds in one string it
    finds there, and the letters of two strings never join into a credential word. Every credential word (keys'
    too) contains one of ``_TEXT_HINTS``, so text without one names no credential. True only calls for the scan.

    ``canonical``: the value's canonical JSON, when the caller has it. If it escapes nothing (no backslash), every key
    and string stands in it verbatim between quotes, and the text with its quotes made line breaks is the joined
    text, without walking the value; what else it holds (numbers, true, false, null, punctuation) can raise a false
    alarm, never hide a credential."""
    if canonical is not None and "\\" not in canonical:
        text = canonical.replace('"', "\n")
    else:
        text = "\n".join(_texts(value, []))
    return _has_secret_format(text) or _has_auth_scheme(text) or _hints_a_credential(_letters(text, breaks=True))


def check_payload(
    value: Any, *, what: str, cap: int = PAYLOAD_CAP_BYTES, canonical: str | None = None, ids: bool = False
) -> None:
    """Raise PayloadTooLarge or SecretInPayload; the message names the place, never the secret. ``canonical``: the
    value's canonical JSON when the caller already made it (it is not made twice); ``ids``: as ``scan_payload``."""
    text = canonical if canonical is not None else canonical_json(value)
    size = len(text.encode())
    if size > cap:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {cap}-byte cap: store a reference (id, version, digest)",
            size=size,
            cap=cap,
        )
    found = list(scan_payload(value, ids=ids)) if may_hold_secret(value, canonical=text) else []
    if found:
        raise SecretInPayload(f"{what} carries credential-like data at {', '.join(found)}", paths=found)
