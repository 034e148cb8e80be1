"""What every gateway call looks up first (its token, its profile, the profile's provider), kept briefly.

Each is an ORM query on every call, and each changes a few times in a
deployment's life. A change made in this process (the admin, a management
command, the API) clears what is kept at once, through the models' signals; a
change made in another process (scaled mode: another web process's admin) is
seen here after at most ``TTL`` seconds. So is a change that sends no signal
(``QuerySet.update``, such as deactivating users in bulk).

What is handed out is a copy, so a caller that sets an attribute on a profile
or a provider never changes what the next call gets.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.db.models.signals import post_delete, post_save

from contextlab.api.models import ApiToken
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions.models import AgentProfile

TTL = float(os.getenv("CONTEXTLAB_GATEWAY_LOOKUP_TTL", "2"))
# Bounded: a flood of distinct bad tokens must not grow the process's memory.
MAX_ENTRIES = 4096

T = TypeVar("T")
_kept: dict[tuple[Any, ...], tuple[float, Any]] = {}
_lock = threading.Lock()


def kept(key: tuple[Any, ...], load: Callable[[], T]) -> T:
    """``load()``'s value, taken from what this process keeps when it is at most ``TTL`` old."""
    moment = time.monotonic()
    with _lock:
        entry = _kept.get(key)
        generation = _generation
    if entry is not None and moment - entry[0] < TTL:
        value = entry[1]
    else:
        value = load()
        with _lock:
            # A change that cleared the cache while this loaded must not be undone by a stale value.
            if generation == _generation:
                if len(_kept) >= MAX_ENTRIES:
                    _kept.clear()
                _kept[key] = (moment, value)
    return [copy.copy(v) for v in value] if isinstance(value, list) else copy.copy(value)  # type: ignore[return-value]


_generation = 0


def keep(key: tuple[Any, ...], value: Any) -> None:
    """Replace what is kept under ``key`` with a value this process just wrote."""
    with _lock:
        _kept[key] = (time.monotonic(), copy.copy(value))


def clear(**_: Any) -> None:
    global _generation
    with _lock:
        _kept.clear()
        _generation += 1


for _model in (ApiToken, User, AgentProfile, UpstreamProvider):
    post_save.connect(clear, sender=_model, dispatch_uid=f"gateway-lookups-save-{_model.__name__}")
    post_delete.connect(clear, sender=_model, dispatch_uid=f"gateway-lookups-delete-{_model.__name__}")
