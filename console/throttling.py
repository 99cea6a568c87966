"""Login throttling (django-axes): failed console logins are counted per user name and client address, and further
attempts are refused (429) for a cool-off once the limit is reached (settings: RECKON_LOGIN_*)."""

from typing import Any

from axes.backends import AxesStandaloneBackend  # type: ignore[import-untyped,unused-ignore]
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


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


def locked_out(request: HttpRequest, original_response: HttpResponse | None, credentials: Any = None) -> HttpResponse:
    """The page a locked-out login gets (429): how many failures locked it, for how long, and who can lift it."""
    cooloff = settings.AXES_COOLOFF_TIME
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_timedelta": cooloff,
        "cooloff_minutes": int(cooloff.total_seconds() // 60) if cooloff else 0,
    }
    return render(request, "console/auth/locked_out.html", context, status=429)
