"""Per-token request limits for the API and the gateway, and counts of failed logins.

A fixed window per token: at most N requests in each window of S seconds.
``record`` and ``exhausted`` count events (failed logins, see
``contextlab.core.login_throttle``) in the same windows without counting the
checks themselves.
Scaled mode counts in Redis, so every web process shares the count; embedded
mode (one process) counts in memory. A limit of "0" (or "off") turns it off.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limit:
    requests: int
    seconds: int


def parse_limit(text: str) -> Limit | None:
    """ "600/60" is 600 requests a minute; "", "0" or "off" is no limit."""
    text = text.strip().lower()
    if text in ("", "0", "off"):
        return None
    requests, _, seconds = text.partition("/")
    try:
        limit = Limit(int(requests), int(seconds or "60"))
    except ValueError as exc:
        raise ValueError(f"a rate limit is REQUESTS/SECONDS, such as 600/60, not {text!r}") from exc
    if limit.requests < 1 or limit.seconds < 1:
        raise ValueError(f"a rate limit needs at least 1 request and 1 second, not {text!r}")
    return limit


def limit_for(scope: str) -> Limit | None:
    return parse_limit(str(getattr(settings, f"CONTEXTLAB_RATE_LIMIT_{scope.upper()}", "")))


def check(scope: str, token: str) -> int | None:
    """Count one request of the token (its stored hash); None if it may go on, else the seconds to wait."""
    limit = limit_for(scope)
    if limit is None:
        return None
    moment = time.time()
    window = int(moment // limit.seconds)
    retry_after = max(1, int((window + 1) * limit.seconds - moment + 0.999))
    key = f"ratelimit:{scope}:{token[:32]}:{limit.seconds}:{window}"
    count = _redis_count(key, limit.seconds) if settings.REDIS_URL else _local.count(key, window)
    if count is None or count <= limit.requests:
        return None
    return retry_after


def _window(limit: Limit) -> tuple[int, int]:
    """The current window's number and the seconds until it is over."""
    moment = time.time()
    window = int(moment // limit.seconds)
    return window, max(1, int((window + 1) * limit.seconds - moment + 0.999))


def record(scope: str, key: str) -> None:
    """Count one event (a failed login) of ``key`` in the current window."""
    limit = limit_for(scope)
    if limit is None:
        return
    window, _ = _window(limit)
    name = f"ratelimit:{scope}:{key[:32]}:{limit.seconds}:{window}"
    if settings.REDIS_URL:
        _redis_count(name, limit.seconds)
    else:
        _local.count(name, window)


def exhausted(scope: str, key: str) -> int | None:
    """The seconds until the window is over when ``key`` has reached its limit of events in it, else None."""
    limit = limit_for(scope)
    if limit is None:
        return None
    window, retry_after = _window(limit)
    name = f"ratelimit:{scope}:{key[:32]}:{limit.seconds}:{window}"
    count = _redis_get(name) if settings.REDIS_URL else _local.get(name)
    return retry_after if count is not None and count >= limit.requests else None


class _LocalCounter:
    """Counts of the current windows, in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, int]] = {}

    def count(self, key: str, window: int) -> int:
        with self._lock:
            if len(self._counts) > 10_000:
                # Drop the windows that are over (their key holds an older window number).
                self._counts = {k: v for k, v in self._counts.items() if v[0] >= window}
            _, seen = self._counts.get(key, (window, 0))
            self._counts[key] = (window, seen + 1)
            return seen + 1

    def get(self, key: str) -> int:
        with self._lock:
            return self._counts.get(key, (0, 0))[1]

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


_local = _LocalCounter()


@lru_cache(maxsize=4)
def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)


def _redis_count(key: str, seconds: int) -> int | None:
    name = f"{settings.REDIS_PREFIX}{key}"
    try:
        pipe = _redis(settings.REDIS_URL).pipeline()
        pipe.incr(name)
        pipe.expire(name, seconds + 1)
        count, _ = pipe.execute()
        return int(count)
    except Exception:
        # A limit that cannot be counted is not a reason to refuse every request.
        log.warning("rate limit not counted: Redis did not answer", exc_info=True)
        return None


def _redis_get(key: str) -> int | None:
    try:
        value = _redis(settings.REDIS_URL).get(f"{settings.REDIS_PREFIX}{key}")
    except Exception:
        log.warning("rate limit not read: Redis did not answer", exc_info=True)
        return None
    return int(value) if value is not None else 0
