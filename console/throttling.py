"""Login throttling (django-axes): failed console logins are counted per user name and client address, and further
attempts are refused (429) for a cool-off once the limit is reached (settings: RECKON_LOGIN_*)."""

from typing import Any

from axes.backends import AxesStandaloneBackend  # type: ignore[import-untyped,unused-ignore]
from django.http import HttpRequest


class LoginThrottle(AxesStandaloneBackend):  # type: ignore[misc]  # axes ships no type information
    """Axes' check, for logins that come with a request (the console's login form). Authentication without one
    (a management command, a test checking a password) is not a guess over the network: it passes to the next
    backend instead of failing as axes would."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if request is None:
            return None
        super().authenticate(request, username, password, **kwargs)
        return None
