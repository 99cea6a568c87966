"""``manage.py check``: say it loudly when retained objects are sealed with the development key."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from retention.crypto import retention_key, using_development_key
from retention.errors import RetentionKeyInvalid


@register()
def retention_key_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if using_development_key():
        if settings.DEBUG:
            return []
        return [
            Warning(
                "RECKON_RETENTION_KEY is not set: retained objects are sealed with a development key derived "
                "from SECRET_KEY.",
                hint="Set RECKON_RETENTION_KEY to the base64 text of 32 random bytes.",
                id="retention.W001",
            )
        ]
    try:
        retention_key()
    except RetentionKeyInvalid as exc:
        return [Error(str(exc), id="retention.E001")]
    return []
