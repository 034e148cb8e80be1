"""An oversized body refused by the server before any view runs, in the shape the agent's SDK reads.

The body limit answers 413 from the ASGI middleware (any server) or from
daphne itself while the body arrives; on the gateway's endpoints the answer is
the provider's own error shape: Anthropic's on /v1/messages, OpenAI's on
/v1/responses and /v1/chat/completions. Elsewhere it stays ContextLab's.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import pytest

from tests.gateway.servers import RunningGateway, embedded_only, gateway_under_daphne

MB = 1024 * 1024
MESSAGE = "the request body is larger than this server accepts"
ANTHROPIC = {"type": "error", "error": {"type": "request_too_large", "message": MESSAGE}}
OPENAI = {"error": {"message": MESSAGE, "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
CONTEXTLAB = {"error": MESSAGE, "field": "body"}
SHAPES = [("/v1/messages", ANTHROPIC), ("/v1/messages/count_tokens", ANTHROPIC), ("/v1/responses", OPENAI),
          ("/v1/responses/compact", OPENAI), ("/v1/chat/completions", OPENAI), ("/api/v1/sessions", CONTEXTLAB)]


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"beta=true",
            "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), *headers],
            "client": ("127.0.0.1", 1), "server": ("testserver", 80)}


@pytest.mark.django_db
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "streamed"])
@pytest.mark.parametrize(("path", "shape"), SHAPES)
async def test_it_refuses_in_the_shape_of_the_endpoints_protocol(settings, path, shape, declared):
    from asgiref.testing import ApplicationCommunicator
    from django.core.asgi import get_asgi_application

    from contextlab.core.bodylimit import BodyLimitMiddleware

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * MB
    headers = [(b"content-length", b"%d" % (50 * MB))] if declared else []
    app = ApplicationCommunicator(BodyLimitMiddleware(get_asgi_application()), _scope(path, headers))
    if not declared:
        for _ in range(3):  # more than the limit, and "more to come": only the count can answer
            await app.send_input({"type": "http.request", "body": b" " * MB, "more_body": True})
    start = await app.receive_output(timeout=10)
    assert (start["type"], start["status"]) == ("http.response.start", 413)
    body = (await app.receive_output(timeout=10))["body"]
    assert json.loads(body) == shape
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()


@pytest.fixture(scope="module")
def daphne(tmp_path_factory) -> Iterator[RunningGateway]:
    with gateway_under_daphne(tmp_path_factory.mktemp("limit"), "http://127.0.0.1:9") as running:
        yield running


@embedded_only
@pytest.mark.parametrize(("path", "shape"), [SHAPES[0], SHAPES[2], SHAPES[4]])
def test_daphne_refuses_in_the_shape_of_the_endpoints_protocol(daphne, path, shape):
    host, port = daphne.url.removeprefix("http://").removesuffix("/v1").split(":")
    head = (f"POST {path}?beta=true HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"x-api-key: {daphne.token}\r\nContent-Length: {200 * MB}\r\n\r\n").encode()
    answer = b""
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head)
        # Refused while sending, perhaps: the answer is read below either way.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b" " * MB)
        try:
            while data := sock.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), answer[:200]
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == shape


def _import_path() -> str:
    from django.urls import reverse

    return reverse("cl-import")


def _assert_import_page(content_type: bytes, body: bytes, limit: int) -> None:
    # A person posted a form: the refusal is a page that names the limit and leads back.
    assert content_type.startswith(b"text/html"), content_type
    page = body.decode()
    assert "This file is larger than this server accepts" in page
    assert f"({limit} bytes)" in page and "CONTEXTLAB_MAX_UPLOAD_BYTES" in page
    assert f'href="{_import_path()}"' in page


@pytest.mark.django_db
async def test_it_refuses_an_oversized_import_form_with_a_page_that_names_the_limit(settings):
    from asgiref.testing import ApplicationCommunicator
    from django.core.asgi import get_asgi_application

    from contextlab.core.bodylimit import BodyLimitMiddleware

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * MB
    settings.CONTEXTLAB_MAX_UPLOAD_BYTES = 8 * MB
    scope = _scope(_import_path(), [(b"content-length", b"%d" % (50 * MB))])
    scope["headers"] = [(k, b"multipart/form-data; boundary=x" if k == b"content-type" else v)
                        for k, v in scope["headers"]]
    app = ApplicationCommunicator(BodyLimitMiddleware(get_asgi_application()), scope)
    start = await app.receive_output(timeout=10)
    assert (start["type"], start["status"]) == ("http.response.start", 413)
    body = (await app.receive_output(timeout=10))["body"]
    _assert_import_page(dict(start["headers"])[b"content-type"], body, 8 * MB)
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()


@embedded_only
def test_daphne_refuses_an_oversized_import_form_with_a_page(daphne):
    from django.conf import settings

    host, port = daphne.url.removeprefix("http://").removesuffix("/v1").split(":")
    size = settings.CONTEXTLAB_MAX_REQUEST_BYTES + MB
    head = (f"POST {_import_path()} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {size}\r\n\r\n").encode()
    answer = b""
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b" " * MB)
        try:
            while data := sock.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), answer[:200]
    headers, _, body = rest.partition(b"\r\n\r\n")
    content_type = next(line.split(b":", 1)[1].strip() for line in headers.split(b"\r\n")
                        if line.lower().startswith(b"content-type:"))
    _assert_import_page(content_type, body, settings.CONTEXTLAB_MAX_UPLOAD_BYTES)
