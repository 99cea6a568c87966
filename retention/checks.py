"""``manage.py check``: the retention key is one the sealed objects can rely on."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from retention.crypto import retention_key, using_development_key
from retention.errors import RetentionKeyInvalid


@register()
def retention_key_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Production never gets here without a key (the settings refuse to start); in development and test an unset
    key is the derived development key, which ``check --deploy`` names."""
    if using_development_key():
        if settings.RECKON_ENV == "production":
            return [Error("RECKON_RETENTION_KEY is not set: production derives no key.", id="retention.E002")]
        if kwargs.get("deploy") or not settings.DEBUG:
            return [
                Warning(
                    "RECKON_RETENTION_KEY is not set: retained objects are sealed with a development key derived "
                    "from SECRET_KEY.",
                    hint="Set RECKON_RETENTION_KEY to the base64 text of 32 random bytes.",
                    id="retention.W001",
                )
            ]
        return []
    try:
        retention_key()
    except RetentionKeyInvalid as exc:
        return [Error(str(exc), id="retention.E001")]
    return []
