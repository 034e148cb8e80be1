"""Request bodies capped before they are read, by the header and while they arrive.

Django checks ``DATA_UPLOAD_MAX_MEMORY_SIZE`` only once the server has read the
whole body, and daphne reads it whole before the application runs: a large
POST grows the process by its size even when it is answered 403. Two guards:

- ``BodyLimitMiddleware`` (ASGI, HTTP only) answers 413 as soon as the
  Content-Length or the bytes received so far pass the limit, for any server;
- ``guard_daphne`` makes daphne itself refuse such a body while receiving it,
  before it is buffered, and close the connection.

A request without credentials (no ``Authorization`` header, no session cookie)
cannot be an upload, so its limit is the small one for JSON bodies.
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

_BODY = json.dumps({"error": "the request body is larger than this server accepts", "field": "body"}).encode()


def request_limit(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The largest body accepted for a request with these (lower-case) headers."""
    cookie_name = settings.SESSION_COOKIE_NAME.encode()
    for name, value in headers:
        if name == b"authorization" or (name == b"cookie" and cookie_name + b"=" in value):
            return int(settings.CONTEXTLAB_MAX_REQUEST_BYTES)
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


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
        limit = request_limit(headers)
        declared = declared_length(headers)
        if declared is not None and declared > limit:
            await _answer_413(send)
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
                await _answer_413(send)


async def _answer_413(send: Send) -> None:
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": _BODY})


def guard_daphne() -> None:
    """Make daphne refuse an over-limit body while it arrives, instead of buffering it whole.

    daphne builds its requests from ``daphne.http_protocol.WebRequest``; a
    subclass put in its place checks the Content-Length when the headers are
    in and counts the body as it comes, then answers 413 and closes.
    """
    try:
        from daphne import http_protocol
    except ImportError:  # another server: the middleware alone guards it
        return
    if getattr(http_protocol.WebRequest, "contextlab_limited", False):
        return
    base: Any = http_protocol.WebRequest

    class LimitedWebRequest(base):  # type: ignore[misc]
        contextlab_limited = True
        _refused = False
        _received = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Twisted would parse a multipart body itself (into memory, unused:
            # Django parses it again) and answer a malformed one with a bare
            # 400 before the application could explain it in JSON.
            self._parsePOSTFormSubmission = False

        def _limit(self) -> int:
            headers = [(name.lower(), value) for name, values in self.requestHeaders.getAllRawHeaders()
                       for value in values]
            return request_limit(headers)

        def gotLength(self, length: int | None) -> None:  # noqa: N802 (twisted's name)
            self._body_limit = self._limit()
            if length is not None and length > self._body_limit:
                self._refuse()
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
            if self._refused:
                return
            self._received += len(data)
            if self._received > getattr(self, "_body_limit", 0):
                self._refuse()
                return
            super().handleContentChunk(data)

        def allContentReceived(self) -> None:  # noqa: N802
            if not self._refused:
                super().allContentReceived()

        def _refuse(self) -> None:
            self._refused = True
            self.content = io.BytesIO()  # nothing is kept; twisted closes it with the request
            head = (b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(_BODY)).encode() + b"\r\nConnection: close\r\n\r\n")
            transport = self.channel.transport if self.channel is not None else None
            if transport is not None:
                transport.write(head + _BODY)
                transport.loseConnection()

    http_protocol.WebRequest = LimitedWebRequest
