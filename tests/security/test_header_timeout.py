"""Issue 30 item 6: a client that never finishes its request headers is disconnected.

The project under uvicorn and under daphne (a subprocess) with CONTEXTLAB_HEADER_TIMEOUT=2:
a silent socket, and one dribbling a header byte every 0.3 s (which restarts
twisted's idle timeout each time), are both closed after about 2 s; complete
requests on a kept-alive connection are not affected.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from tests.gateway.servers import RunningGateway, embedded_only, gateway_under_daphne

pytestmark = embedded_only

LIMIT = 2.0
SLACK = 3.0


@pytest.fixture(scope="module", params=["uvicorn", "daphne"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    # uvicorn as scripts/start.sh and the Procfile serve it (its --http protocol keeps the deadline).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONTEXTLAB_HEADER_TIMEOUT", str(LIMIT))
        with gateway_under_daphne(tmp_path_factory.mktemp("server"), "http://127.0.0.1:9",
                                  server=request.param) as running:
            yield running


def _connect(server: RunningGateway) -> socket.socket:
    host, port = server.url.removeprefix("http://").removesuffix("/v1").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def _closed(sock: socket.socket) -> bool:
    """True when the server has closed the connection (EOF or reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        sock.setblocking(True)


def _response(sock: socket.socket) -> bytes:
    """One whole response: a server may write its head and its body apart."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_it_closes_a_connection_that_sends_nothing(server):
    with _connect(server) as sock:
        start = time.monotonic()
        sock.settimeout(LIMIT + SLACK)
        with contextlib.suppress(ConnectionResetError):  # aborted: closed as well
            assert sock.recv(1) == b""  # closed
        assert time.monotonic() - start < LIMIT + SLACK


def test_it_closes_a_connection_that_dribbles_its_headers(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        start = time.monotonic()
        closed = False
        while time.monotonic() - start < LIMIT + SLACK:
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if _closed(sock):
                closed = True
                break
            time.sleep(0.3)
        assert closed, "the server kept a connection whose headers never ended"
        assert time.monotonic() - start >= LIMIT - 0.5


def test_it_keeps_serving_complete_requests_on_a_kept_alive_connection(server):
    with _connect(server) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = _response(sock)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
            time.sleep(LIMIT + 0.5)  # past the first request's deadline: it was cancelled
        assert not _closed(sock)
