"""Live events to browsers: the one place that sends to the channel layer.

Everything that changes what a page shows (a turn, a message, a run's
progress) calls ``publish(group, event)``. Pages always receive complete
fragments (never deltas), so a lost event heals itself with the next one.

Two transports, chosen by the settings:

* embedded mode (in-memory layer, one process): the layer is not thread-safe
  and ``async_to_sync`` from a worker thread stalls until the event loop wakes
  (measured 0.06-1 s under Daphne). We capture the server's loop when the first
  websocket connects (``remember_loop``) and hop onto it with
  ``run_coroutine_threadsafe`` (measured 1-2 ms).
* scaled mode (Redis layer): any process can send; plain ``async_to_sync``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def session_group(session_id: object) -> str:
    return f"session-{session_id}"


def remember_loop(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Record the server's event loop (call from a consumer's ``connect``)."""
    global _loop
    with _loop_lock:
        _loop = loop or asyncio.get_running_loop()


def _in_memory_layer(layer: Any) -> bool:
    return type(layer).__name__ == "InMemoryChannelLayer"


def publish(group: str, event: dict[str, Any]) -> None:
    """Send ``event`` (a dict with a dotted ``type``) to every consumer in ``group``.

    Safe to call from request threads, job threads and the event loop itself.
    A failure to deliver is logged, never raised: the database row the event
    describes is the source of truth, and pages catch up from it on reconnect.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    event = {**event, "sent_at": time.time()}
    try:
        running: asyncio.AbstractEventLoop | None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            # Already on a loop (a consumer or an async view): schedule, don't block.
            running.create_task(layer.group_send(group, event))
        elif _in_memory_layer(layer) and _loop is not None and _loop.is_running():
            future = asyncio.run_coroutine_threadsafe(layer.group_send(group, event), _loop)
            future.result(timeout=5)
        else:
            async_to_sync(layer.group_send)(group, event)
    except Exception:  # a page update must never break the work it reports on
        log.exception("could not publish %s to %s", event.get("type"), group)
