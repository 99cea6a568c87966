"""One named error per retention rule. Each is a TaskError, so the API and the console map it like the others.

Every service raises before it writes, or inside the transaction it rolls back: a refusal leaves the
database, the audit chain and the retention folder as they were.
"""

from tasks.core.errors import TaskError


class RetentionError(TaskError):
    code = "retention_error"


class RetentionRefused(RetentionError):
    """The object cannot be retained as asked (unknown kind, empty name, a ttl past the bound, …)."""

    code = "retention_refused"


class RetentionNotFound(RetentionError):
    """No retained object has this id and version (or it belongs to another task)."""

    code = "retention_not_found"


class RetentionExpired(RetentionError):
    """The object's retention has ended: it is purged, or will be by the next sweep. Rebuild the input from
    external facts; never go on with a reference to something that is gone."""

    code = "retention_expired"


class RetentionCorrupt(RetentionError):
    """The stored file is missing, altered, belongs to another object, or does not match its digest."""

    code = "retention_corrupt"


class RetentionKeyMismatch(RetentionCorrupt):
    """The file was sealed with another key than the one configured (RECKON_RETENTION_KEY changed?)."""

    code = "retention_key_mismatch"


class RetentionKeyInvalid(RetentionError):
    """RECKON_RETENTION_KEY is set but is not the base64 text of 32 bytes."""

    code = "retention_key_invalid"


class RetentionKeyMissing(RetentionKeyInvalid):
    """RECKON_RETENTION_KEY is not set in production, where no key is derived (settings refuse to start so; this
    guards a process whose settings were changed after start-up)."""

    code = "retention_key_missing"


class ExtensionRefused(RetentionError):
    """An extension that cannot be granted: not later than the current expiry, or lost a race."""

    code = "retention_extension_refused"


class ExtensionReasonMissing(ExtensionRefused):
    code = "retention_extension_reason_missing"


class ExtensionBeyondBound(ExtensionRefused):
    code = "retention_extension_beyond_bound"


class ExtensionLimitReached(ExtensionRefused):
    code = "retention_extension_limit_reached"
