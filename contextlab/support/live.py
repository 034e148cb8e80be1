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
from collections.abc import Callable
from typing import Any, Protocol

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


def publish(group: str, event: dict[str, Any], *, coalesce: str | None = None) -> None:
    """Send ``event`` (a dict with a dotted ``type``) to every consumer in ``group``.

    Safe to call from request threads, job threads and the event loop itself.
    A failure to deliver is logged, never raised: the database row the event
    describes is the source of truth, and pages catch up from it on reconnect.

    With ``coalesce`` (a key such as ``"gauge"``), events of that key in that
    group go out at most every ``COALESCE_SECONDS``: the first at once, then the
    latest one at the end of each interval. Only for full-state events, where
    the latest makes the ones it replaces useless.
    """
    if coalesce is not None:
        _coalescer.offer(group, coalesce, event)
        return
    _send(group, event)


def _send(group: str, event: dict[str, Any]) -> None:
    if not threading.main_thread().is_alive():
        # The process is exiting (a coalesced event's timer fired while exit handlers, such as
        # the span exporter's flush, still run): no thread pool takes new work any more, and
        # no page is left to update. Pages catch up from the database on reconnect.
        return
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


# At most ten full-state updates a second per group and key: a page cannot show
# more, and the in-memory layer drops the newest events of a channel whose 100
# (here 1,000) slots are full, so a burst must not fill them.
COALESCE_SECONDS = 0.1


class Timer(Protocol):
    def cancel(self) -> None: ...


def _thread_timer(delay: float, action: Callable[[], None]) -> Timer:
    timer = threading.Timer(delay, action)
    timer.daemon = True
    timer.start()
    return timer


class Coalescer:
    """At most one event per ``interval`` per (group, key); the newest waiting one wins.

    ``clock`` (seconds, monotonic), ``schedule`` (run an action after a delay,
    cancellable) and ``send`` are the real ones by default; a test passes its own
    to step through time without sleeping.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic,
                 schedule: Callable[[float, Callable[[], None]], Timer] = _thread_timer,
                 send: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.interval = interval
        self._clock = clock
        self._schedule = schedule
        self._send = send
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._timers: dict[tuple[str, str], Timer] = {}

    def _deliver(self, group: str, event: dict[str, Any]) -> None:
        (self._send or _send)(group, event)

    def offer(self, group: str, key: str, event: dict[str, Any]) -> None:
        slot = (group, key)
        now = self._clock()
        with self._lock:
            wait = self._last.get(slot, -self.interval) + self.interval - now
            if wait <= 0 and slot not in self._timers:
                self._last[slot] = now
                self._forget_old(now)
                send_now = True
            else:
                # The newest state replaces one still waiting; one timer per slot.
                self._pending[slot] = event
                if slot not in self._timers:
                    self._timers[slot] = self._schedule(max(wait, 0.0), lambda: self._flush(slot))
                send_now = False
        if send_now:
            self._deliver(group, event)

    def _flush(self, slot: tuple[str, str]) -> None:
        with self._lock:
            event = self._pending.pop(slot, None)
            self._timers.pop(slot, None)
            self._last[slot] = self._clock()
        if event is not None:
            self._deliver(slot[0], event)

    def _forget_old(self, now: float) -> None:
        # Keep the table small in a long-lived process with many sessions.
        if len(self._last) > 1_000:
            for slot in [s for s, t in self._last.items() if now - t > self.interval and s not in self._timers]:
                del self._last[slot]

    def flush_all(self) -> None:
        """Send every waiting event now (tests, and a process about to exit)."""
        with self._lock:
            slots = list(self._timers)
            for slot in slots:
                self._timers[slot].cancel()
        for slot in slots:
            self._flush(slot)


_coalescer = Coalescer(COALESCE_SECONDS)


def flush() -> None:
    _coalescer.flush_all()
