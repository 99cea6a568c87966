"""How many requests an agent token may make a minute (``RECKON_API_RATE``, default 6000: 100 a second, some 30
steps a second for one agent): a fixed window counted in Django's cache. With several web processes the cache must
be shared (``RECKON_CACHE_URL=redis://…``, the scale-out set-up); the embedded default's in-process cache counts per
process, so the limit there is per process."""

import time

from django.conf import settings
from django.core.cache import cache

WINDOW_SECONDS = 60


class RateLimited(Exception):
    code = "rate_limited"

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(f"This token made more than {limit} requests this minute: retry after {retry_after} s.")
        self.retry_after = retry_after


def rate_limit(token_key: str) -> None:
    """Count one request of the token; RateLimited once it is over the limit for the current minute."""
    limit: int = settings.RECKON_API_RATE
    if limit <= 0:  # 0: no limit
        return
    now = time.time()
    window = int(now // WINDOW_SECONDS)
    key = f"reckon:api-rate:{token_key}:{window}"
    if cache.add(key, 1, timeout=WINDOW_SECONDS + 5):
        return
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr: this request opens the window
        cache.add(key, 1, timeout=WINDOW_SECONDS + 5)
        return
    if count > limit:
        raise RateLimited(limit, retry_after=max(1, int((window + 1) * WINDOW_SECONDS - now) + 1))
