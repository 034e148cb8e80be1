"""uvicorn's httptools protocol with a deadline for a request's headers.

uvicorn closes an idle kept-alive connection, but a client that opens a
connection and dribbles its headers a byte at a time holds a socket (and its
buffers) for as long as it likes. This protocol gives every request
``CONTEXTLAB_HEADER_TIMEOUT`` seconds (default 20; 0 turns it off) from the
connection, or from the first byte of a later request on a kept-alive
connection, to the end of its headers; then the connection is closed.

Served with ``uvicorn --http contextlab.core.uvicorn_http:HeaderTimeoutHttpTools``
(scripts/start.sh, the Procfile). No Django import: uvicorn loads this before
the application.
"""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def header_timeout() -> float:
    try:
        return max(0.0, float(os.environ.get("CONTEXTLAB_HEADER_TIMEOUT", "20")))
    except ValueError:
        return 20.0


class HeaderTimeoutHttpTools(HttpToolsProtocol):
    _header_deadline: asyncio.TimerHandle | None = None

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        seconds = header_timeout()
        if seconds:
            self._header_deadline = self.loop.call_later(seconds, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A later request on a kept-alive connection gets its own deadline.
        self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()
