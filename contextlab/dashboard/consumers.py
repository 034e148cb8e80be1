"""The session page's websocket: full-state fragments pushed as htmx OOB swaps.

The services announce changes (``gauge.update`` after a commit that touched
messages or turns, ``run.update`` when a background run moves); this consumer
renders the fragments those changes make stale, from the database, and sends
them. A page that was away (a dropped connection, a sleeping laptop) sends its
cursor (``catch_up``: the last turn and message count it shows) when the
socket opens again and gets everything that moved since.

The page also sends ``ping`` every 30 s: each one re-joins the group, because
channel layers silently drop group memberships after a day (and the in-memory
layer drops a channel that stalled for a minute).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from contextlab.dashboard import fragments
from contextlab.sessions.models import AgentSession
from contextlab.support.live import remember_loop, session_group

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def _db(function: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``database_sync_to_async`` with its types (channels ships none)."""
    return cast(Callable[P, Coroutine[Any, Any, R]], database_sync_to_async(function))

# Close codes of our own (4000-4999): the htmx ws extension reconnects only
# after abnormal closures, so a refused page does not hammer the server.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
# A burst of events renders at most this often per page; the services already
# coalesce to ten a second, this guards against slow renders piling up.
MIN_PUSH_INTERVAL = 0.05
# Sent ahead of the rest, on its own: what a viewer watches (the gauge must
# follow an append within a blink; the lists may take a few ms more). A
# ``gauge.update`` carries the gauge's inputs, so its gauge is rendered from the
# event (no query) and sent as the event arrives; this is for the other events.
FIRST = frozenset({"gauge"})
# How long the other fragments of an event wait for every viewer in this
# process to have that event's gauge: their render (tens of ms of queries and
# templates) would otherwise compete with the gauge's fan-out for the process.
GAUGE_HEAD_START = 0.05
# The page's frames are a few dozen characters; anything longer is not one of them.
MAX_FRAME_CHARS = 4_096
# Renders of the latest events, shared by every viewer of a session in this
# process: fifty open pages await one render (one trip to the database thread,
# which the HTTP requests share) instead of queueing fifty trips behind each other.
SHARED_RENDERS = 64
_shared_renders: OrderedDict[tuple[Any, ...], tuple[asyncio.AbstractEventLoop, asyncio.Future[str | None]]] = \
    OrderedDict()
# Gauges rendered from an event, by (session, event): once per process, like the renders above.
_event_gauges: OrderedDict[tuple[str, object], str | None] = OrderedDict()


class _GaugeRound:
    """How many viewers of a session in this process have handled one event's gauge."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.handled = 0
        self.done = asyncio.Event()

    def handle(self) -> None:
        self.handled += 1
        if self.handled >= self.expected:
            self.done.set()


# Viewers of each session connected to this process, and per (session, event)
# how many of them have handled that event's gauge.
_viewers: Counter[str] = Counter()
_gauge_rounds: OrderedDict[tuple[str, object], _GaugeRound] = OrderedDict()


def _gauge_round(session_id: str, key: object) -> _GaugeRound:
    slot = (session_id, key)
    found = _gauge_rounds.get(slot)
    if found is None:
        found = _gauge_rounds[slot] = _GaugeRound(_viewers[session_id])
        while len(_gauge_rounds) > SHARED_RENDERS:
            _gauge_rounds.popitem(last=False)
    return found


# channels ships no types, so its base class is Any to mypy.
class SessionConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    session_id: str
    group: str

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        self._stale: set[str] = set()
        self._event: dict[str, Any] | None = None
        self._key: object = None
        self._task: asyncio.Task[None] | None = None
        self._last_push = 0.0
        # The live fragments the page shows (None until it says): a pinned turn
        # or another page of a list has no live target, so it is never pushed.
        self._shown: frozenset[str] | None = None
        # A refusal is accepted first, then closed with our code: closing before
        # the accept makes the server answer the handshake with HTTP 403, which
        # the page cannot tell from a network error and keeps reconnecting.
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await self._fetch_owned(user.pk):
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        # Publishers on other threads hop onto this loop (contextlab.support.live).
        remember_loop()
        self.group = session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        _viewers[self.session_id] += 1
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)
            _viewers[self.session_id] -= 1
            if _viewers[self.session_id] <= 0:
                del _viewers[self.session_id]
        task = getattr(self, "_task", None)
        if task is not None and not task.done():
            task.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not getattr(self, "group", None) or len(text_data or "") > MAX_FRAME_CHARS:
            return
        try:
            message = json.loads(text_data or "{}")
        except (ValueError, RecursionError):
            return  # not a frame the page sends: ignore it, keep the socket
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "ping":
            await self.channel_layer.group_add(self.group, self.channel_name)
        elif kind == "view":
            shown = message.get("fragments")
            if isinstance(shown, list):
                self._shown = frozenset(str(name) for name in shown) & frozenset(fragments.FRAGMENTS)
        elif kind == "catch_up":
            html = await self._fetch_catch_up(_int(message.get("after")), _int(message.get("messages")),
                                              self._shown)
            if html:
                await self.send(text_data=html)

    # -- events from the services --------------------------------------------------------

    async def gauge_update(self, event: dict[str, Any]) -> None:
        state = event.get("state") or {}
        kind = "turn" if state.get("turn") else "messages"
        key = event.get("sent_at")
        html = self._gauge_from_event(state, key) if self._shown is None or "gauge" in self._shown else None
        if html is not None:
            # The gauge at once, from the event; the rest after every viewer here has it.
            await self.send(text_data=html)
            self._mark(kind, event, already={"gauge"})
        else:
            self._mark(kind, event)
        _gauge_round(self.session_id, key).handle()

    async def run_update(self, event: dict[str, Any]) -> None:
        run = event.get("run") or {}
        # A finished run also changed the session (its turn, or the import).
        self._mark("turn" if run.get("status") in ("done", "failed") else "run", event)

    async def profile_update(self, event: dict[str, Any]) -> None:
        self._mark("profile", event)

    def _mark(self, kind: str, event: dict[str, Any], *, already: set[str] | frozenset[str] = frozenset()) -> None:
        self._stale.update(set(fragments.KINDS.get(kind, ())) - already)
        self._key = event.get("sent_at")
        if event.get("type", "").startswith("run."):
            self._event = event
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._push())

    async def _push(self) -> None:
        loop = asyncio.get_running_loop()
        while self._stale:
            wait = self._last_push + MIN_PUSH_INTERVAL - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            names, self._stale = frozenset(self._stale), set()
            if self._shown is not None:
                names &= self._shown
            event, self._event = self._event, None
            key = self._key
            for group in (names & FIRST, names - FIRST):
                if not group:
                    continue
                try:
                    html = await self._fragments(group, key, event)
                except Exception:  # a broken render must not kill the page's socket
                    log.exception("session %s: could not render %s", self.session_id, sorted(group))
                    return
                if html is None:
                    await self.close(code=CLOSE_FORBIDDEN)  # the session was deleted
                    return
                await self.send(text_data=html)
            self._last_push = loop.time()

    def _gauge_from_event(self, state: dict[str, Any], key: object) -> str | None:
        # Rendered here on the loop: a fraction of a millisecond of template, no
        # query, so it does not queue behind the requests on the database thread.
        if "gauge" not in state:
            return None
        slot = (self.session_id, key)
        if key is None or slot not in _event_gauges:
            html = fragments.gauge_push(state)
            if key is None:
                return html
            _event_gauges[slot] = html
            while len(_event_gauges) > SHARED_RENDERS:
                _event_gauges.popitem(last=False)
        return _event_gauges[slot]

    async def _fragments(self, names: frozenset[str], key: object, event: dict[str, Any] | None) -> str | None:
        if event is not None or key is None:
            # Run events carry per-run progress, so they are not shared.
            return await self._fetch_fragments(names, None, event)
        loop = asyncio.get_running_loop()
        slot = (self.session_id, tuple(sorted(names)), key)
        entry = _shared_renders.get(slot)
        if entry is None or entry[0] is not loop or entry[1].cancelled():
            future: asyncio.Future[str | None] = asyncio.ensure_future(self._after_gauges(names, key))
            _shared_renders[slot] = (loop, future)
            while len(_shared_renders) > SHARED_RENDERS:
                _shared_renders.popitem(last=False)
            entry = (loop, future)
        # Shielded: a viewer leaving mid-render must not cancel the others' render.
        return await asyncio.shield(entry[1])

    async def _after_gauges(self, names: frozenset[str], key: object) -> str | None:
        round_ = _gauge_rounds.get((self.session_id, key))
        if round_ is not None and "gauge" not in names:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(round_.done.wait(), GAUGE_HEAD_START)
        return await self._fetch_fragments(names, key, None)

    # -- database ------------------------------------------------------------------------

    @_db
    def _fetch_owned(self, user_id: int) -> bool:
        return AgentSession.objects.filter(pk=self.session_id, owner_id=user_id).exists()

    @_db
    def _fetch_fragments(self, names: frozenset[str], key: object,
                         event: dict[str, Any] | None) -> str | None:
        # Run events carry per-run progress, so they are not shared through the cache.
        return fragments.push_html(self.session_id, names, key=None if event else key, event=event)

    @_db
    def _fetch_catch_up(self, after: int, messages: int, shown: frozenset[str] | None) -> str | None:
        session = AgentSession.objects.filter(pk=self.session_id).values("turns_count", "messages_count").first()
        if session is None:
            return None
        # The counters and the run panel always (they are small, and a run may
        # have finished meanwhile); the rest only when the cursor is behind.
        names = set(fragments.KINDS["run"])
        if session["turns_count"] > after:
            names |= set(fragments.KINDS["all"])
        elif session["messages_count"] != messages:
            names |= set(fragments.KINDS["messages"])
        if shown is not None:
            names &= shown
        return fragments.push_html(self.session_id, names)


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400 is infinity
        return 0
