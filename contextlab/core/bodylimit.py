"""Request bodies capped before they are read, by the header and while they arrive.

Django checks ``DATA_UPLOAD_MAX_MEMORY_SIZE`` only once the server has read the
whole body, and daphne reads it whole before the application runs: a large
POST grows the process by its size even when it is answered 403. Two guards:

- ``BodyLimitMiddleware`` (ASGI, HTTP only) answers 413 as soon as the
  Content-Length or the bytes received so far pass the limit, for any server;
- ``guard_daphne`` makes daphne itself refuse such a body while receiving it,
  before it is buffered, and close the connection.

Only an upload (``UPLOAD_URL_NAMES``) from an authenticated client gets the
large limit: the credential it carries (a bearer API token or a session
cookie) is resolved first, off the server's event loop, and a forged one gets
the small limit for JSON bodies like any other request.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.urls import Resolver404, resolve

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

_BODY = json.dumps({"error": "the request body is larger than this server accepts", "field": "body"}).encode()
# The 413 body of views whose clients read errors in a wire protocol's own shape (an agent's
# SDK shows the message only from there), by URL name; the app that serves them fills it in
# (the gateway's protocol adapters), so this module knows no protocol. A callable is asked at
# the time of the refusal (a body that names the limit in force).
REFUSAL_BODIES: dict[str, bytes | Callable[[], bytes]] = {}
# The 413 page of the browser's own pages (a form posting a file), by URL name: a person reads
# it, so it is HTML and says which limit was passed. Filled in by the dashboard.
REFUSAL_PAGES: dict[str, Callable[[], bytes]] = {}
_JSON = b"application/json"
_HTML = b"text/html; charset=utf-8"


def refusal(path: str) -> tuple[bytes, bytes]:
    """The 413 content type and body for a request to ``path``: its view's own shape, or ContextLab's."""
    if not (REFUSAL_BODIES or REFUSAL_PAGES):
        return _JSON, _BODY
    try:
        name = resolve(path).url_name or ""
    except Resolver404:
        return _JSON, _BODY
    if name in REFUSAL_PAGES:
        return _HTML, REFUSAL_PAGES[name]()
    body = REFUSAL_BODIES.get(name, _BODY)
    return _JSON, body() if callable(body) else body


def refusal_body(path: str) -> bytes:
    """The 413 body for a request to ``path`` (see ``refusal``)."""
    return refusal(path)[1]


# The views that take a file upload (multipart, outside DATA_UPLOAD_MAX_MEMORY_SIZE).
UPLOAD_URL_NAMES = frozenset({"cl-api-imports", "cl-import"})


def small_limit() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def large_limit() -> int:
    return int(settings.CONTEXTLAB_MAX_REQUEST_BYTES)


def _credentials(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str]:
    """The bearer token and the session key a request carries ("" when absent)."""
    token = session_key = ""
    cookie_name = settings.SESSION_COOKIE_NAME
    for name, value in headers:
        if name == b"authorization":
            scheme, _, rest = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                token = rest.strip()
        elif name == b"cookie":
            cookies = SimpleCookie()
            with contextlib.suppress(CookieError):
                cookies.load(value.decode("latin-1"))
            if cookie_name in cookies:
                session_key = cookies[cookie_name].value
    return token, session_key


def may_upload(path: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True when the request goes to an upload view carrying a credential: only then is it worth resolving.

    Touches no database, so it may run on the server's event loop.
    """
    if not any(_credentials(headers)):
        return False
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return match.url_name in UPLOAD_URL_NAMES


def authenticated(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True when the request's bearer token or session cookie belongs to an active user (reads the database)."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.utils.crypto import constant_time_compare

    from contextlab.api.models import ApiToken, hash_token

    token, session_key = _credentials(headers)
    close_old_connections()
    try:
        if token and ApiToken.objects.filter(key_hash=hash_token(token), user__is_active=True).exists():
            return True
        if not session_key:
            return False
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        user_id, backend = store.get(SESSION_KEY), store.get(BACKEND_SESSION_KEY)
        if user_id is None or backend not in settings.AUTHENTICATION_BACKENDS:
            return False
        user = get_user_model()._default_manager.filter(pk=user_id, is_active=True).first()
        # The same check as django.contrib.auth.get_user: a session from before
        # a password change no longer counts.
        return user is not None and constant_time_compare(str(store.get(HASH_SESSION_KEY, "")),
                                                          user.get_session_auth_hash())
    finally:
        close_old_connections()


def request_limit(path: str, headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The largest body accepted for a request to ``path`` with these (lower-case) headers (reads the database)."""
    headers = list(headers)
    return large_limit() if may_upload(path, headers) and authenticated(headers) else small_limit()


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Answers 413 once a request body passes its limit, before the application reads the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = list(scope.get("headers") or [])
        limit = small_limit()
        if may_upload(str(scope.get("path") or ""), headers):
            limit = await sync_to_async(request_limit)(str(scope.get("path") or ""), headers)
        declared = declared_length(headers)
        if declared is not None and declared > limit:
            await _answer_413(send, str(scope.get("path") or ""))
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body") or b"")
                if received > limit:
                    raise _TooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _TooLarge:
            if not started:
                await _answer_413(send, str(scope.get("path") or ""))


async def _answer_413(send: Send, path: str) -> None:
    content_type, body = refusal(path)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def guard_daphne() -> None:
    """Make daphne refuse an over-limit body while it arrives, instead of buffering it whole.

    daphne builds its requests from ``daphne.http_protocol.WebRequest``; a
    subclass put in its place checks the Content-Length when the headers are
    in and counts the body as it comes, then answers 413 and closes.
    """
    try:
        from daphne import http_protocol
        from twisted.internet import threads
    except ImportError:  # another server: the middleware alone guards it
        return
    if getattr(http_protocol.WebRequest, "contextlab_limited", False):
        return
    base: Any = http_protocol.WebRequest

    class LimitedWebRequest(base):  # type: ignore[misc]
        contextlab_limited = True
        _refused = False
        _received = 0
        _pending = False
        _complete = False
        _deferred_all = False
        _declared: int | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Twisted would parse a multipart body itself (into memory, unused:
            # Django parses it again) and answer a malformed one with a bare
            # 400 before the application could explain it in JSON.
            self._parsePOSTFormSubmission = False
            # A request exists from its first line on: its headers have a deadline.
            self._header_timer = _header_deadline(self.channel)

        def _headers(self) -> list[tuple[bytes, bytes]]:
            return [(name.lower(), value) for name, values in self.requestHeaders.getAllRawHeaders()
                    for value in values]

        def gotLength(self, length: int | None) -> None:  # noqa: N802 (twisted's name)
            _headers_in(self.channel, self._header_timer)
            self._body_limit = small_limit()
            self._declared = length
            # The request's own path is set only once its body is in; the
            # channel holds the request line's meanwhile.
            target = getattr(self.channel, "_path", None) or b""
            path = target.split(b"?", 1)[0].decode("latin-1")
            headers = self._headers()
            if may_upload(path, headers):
                # The credential is resolved in a thread (the database may not be
                # read on the reactor); reading stops meanwhile, so at most what
                # is already in the socket's buffer arrives before the answer.
                self._body_limit = large_limit()
                self._pending = True
                self._pause()
                deferred = threads.deferToThread(authenticated, headers)
                deferred.addCallbacks(self._resolved, self._unresolved)
            elif length is not None and length > self._body_limit:
                self._refuse()
                return
            super().gotLength(length)

        def _pause(self) -> None:
            transport = self.channel.transport if self.channel is not None else None
            if transport is not None:
                transport.pauseProducing()

        def _resolved(self, allowed: bool) -> None:
            self._pending = False
            self._body_limit = large_limit() if allowed else small_limit()
            if self._refused:
                return
            if (self._declared is not None and self._declared > self._body_limit) \
                    or self._received > self._body_limit:
                self._refuse()
                return
            if self._deferred_all:
                self._deferred_all = False
                self.allContentReceived()
                return
            transport = self.channel.transport if self.channel is not None else None
            if transport is not None and not self._complete:
                transport.resumeProducing()

        def _unresolved(self, failure: Any) -> None:
            log.error("could not check the credential of an upload: %s", failure.getErrorMessage())
            self._resolved(False)

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
            if self._refused:
                return
            self._received += len(data)
            if self._received > getattr(self, "_body_limit", 0):
                self._refuse()
                return
            super().handleContentChunk(data)

        def allContentReceived(self) -> None:  # noqa: N802
            if self._refused:
                return
            if self._pending:
                # The whole body came before the credential was resolved: the
                # request waits for it, then is refused or handled.
                self._deferred_all = True
                return
            self._complete = True
            super().allContentReceived()

        def _refuse(self) -> None:
            self._refused = True
            self.content = io.BytesIO()  # nothing is kept; twisted closes it with the request
            target = getattr(self.channel, "_path", None) or b""
            content_type, body = refusal(target.split(b"?", 1)[0].decode("latin-1"))
            head = (b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: " + content_type + b"\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
            transport = self.channel.transport if self.channel is not None else None
            if transport is not None:
                transport.write(head + body)
                transport.loseConnection()

    http_protocol.WebRequest = LimitedWebRequest

    # A connection that never completes a request line has no request yet: its
    # deadline starts with the connection.
    build = http_protocol.HTTPFactory.buildProtocol

    def build_protocol(self: Any, addr: Any) -> Any:
        protocol = build(self, addr)
        channel = getattr(protocol, "_channel", protocol)
        channel.contextlab_header_timer = _header_deadline(channel)
        return protocol

    http_protocol.HTTPFactory.buildProtocol = build_protocol


def _header_deadline(channel: Any) -> Any:
    """Close ``channel`` unless a request's headers are complete within CONTEXTLAB_HEADER_TIMEOUT seconds.

    Twisted's idle timeout starts again with every byte, so a client that
    dribbles its headers a byte at a time would hold the socket forever.
    """
    seconds = float(getattr(settings, "CONTEXTLAB_HEADER_TIMEOUT", 0) or 0)
    if seconds <= 0 or channel is None:
        return None
    from twisted.internet import reactor  # the server's (daphne installs it before the application loads)

    def overdue() -> None:
        transport = getattr(channel, "transport", None)
        if transport is not None:
            log.info("closing a connection whose request headers took over %g s", seconds)
            transport.abortConnection()

    clock: Any = reactor
    return clock.callLater(seconds, overdue)


def _headers_in(channel: Any, timer: Any) -> None:
    for pending in (timer, getattr(channel, "contextlab_header_timer", None)):
        if pending is not None and pending.active():
            pending.cancel()
