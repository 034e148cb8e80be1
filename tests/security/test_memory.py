"""Item 3 of the trust boundary: no request makes the server hold what it sends.

A real server (the project under daphne, in a subprocess) receives a 300 MB
body and a zip bomb; its peak resident memory (``VmHWM``, which the kernel
keeps) may grow by at most 100 MB. A memory property, not a timing.
"""

from __future__ import annotations

import io
import json
import socket
import zipfile
from pathlib import Path

import httpx2
import pytest

from tests.gateway.servers import embedded_only

MB = 1024 * 1024
MAX_GROWTH = 100 * MB


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc (Linux only)")


def _send_raw(base: str, head: bytes, chunks, *, chunked: bool) -> bytes:
    """Send a request by hand (the server may answer and close mid-body); return what it answered."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending: what it answered is below
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    return answer


def _zeros(total: int):
    chunk = b"\0" * MB
    for _ in range(total // MB):
        yield chunk


@embedded_only
@pytest.mark.parametrize("chunked", [False, True])
def test_it_refuses_a_300_mb_anonymous_post_without_holding_it(server, chunked):
    base = server.url.removesuffix("/v1")
    before = _peak_rss(server.process.pid)
    length = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % (300 * MB)
    head = b"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s\r\n\r\n" % length
    answer = _send_raw(base, head, _zeros(300 * MB), chunked=chunked)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert _peak_rss(server.process.pid) - before <= MAX_GROWTH


def _bomb() -> bytes:
    """A bundle under 1 MB that unpacks to 300 MB: blank JSON lines and a tool output of zeros."""
    manifest = {"format": "contextlab.session-bundle/1", "session": {"title": "bomb"}, "engine_state": {}}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("session.json", json.dumps(manifest))
        with archive.open("messages.jsonl", "w", force_zip64=True) as member:
            for _ in range(200):
                member.write(b" " * (MB - 1) + b"\n")
        with archive.open("workspace/tool_result/zeros.txt", "w", force_zip64=True) as member:
            for chunk in _zeros(100 * MB):
                member.write(chunk)
    return buffer.getvalue()


@embedded_only
def test_it_unpacks_a_zip_bomb_without_holding_it(server):
    bomb = _bomb()
    assert len(bomb) < MB
    base = server.url.removesuffix("/v1")
    before = _peak_rss(server.process.pid)
    response = httpx2.post(f"{base}/api/v1/imports", files={"file": ("bomb.zip", bomb, "application/zip")},
                           headers={"Authorization": f"Bearer {server.token}"}, timeout=120)
    assert response.status_code in (201, 400, 413), response.text
    assert _peak_rss(server.process.pid) - before <= MAX_GROWTH


# -- the ASGI middleware, for servers that stream bodies to the application ------------------


def _scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/api/v1/sessions", "raw_path": b"/api/v1/sessions", "root_path": "",
            "query_string": b"", "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 1),
            "server": ("testserver", 80)}


@pytest.mark.django_db
@pytest.mark.parametrize("declared", [True, False])
async def test_the_middleware_answers_413_before_the_rest_is_read(settings, declared):
    from asgiref.testing import ApplicationCommunicator
    from django.core.asgi import get_asgi_application

    from contextlab.core.bodylimit import BodyLimitMiddleware

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * MB
    headers = [(b"content-type", b"application/json")]
    if declared:
        headers.append((b"content-length", b"%d" % (300 * MB)))
    app = ApplicationCommunicator(BodyLimitMiddleware(get_asgi_application()), _scope(headers))
    if not declared:
        for _ in range(5):  # 5 MB in 1 MB pieces, and "more to come": only the count can answer
            await app.send_input({"type": "http.request", "body": b"\0" * MB, "more_body": True})
    start = await app.receive_output(timeout=10)
    assert start["type"] == "http.response.start" and start["status"] == 413
    body = await app.receive_output(timeout=10)
    assert json.loads(body["body"])["field"] == "body"



# -- a forged credential does not lift the limit (issue 30, item 2) ---------------------------

FORGED = [b"Authorization: Bearer cl_forged_0123456789", b"Cookie: sessionid=forgedsessionkey0123456789abcdef"]


@embedded_only
@pytest.mark.parametrize("credential", FORGED)
@pytest.mark.parametrize("chunked", [False, True])
def test_it_refuses_a_large_upload_with_a_forged_credential_before_holding_it(server, credential, chunked):
    base = server.url.removesuffix("/v1")
    before = _peak_rss(server.process.pid)
    # 200 MB: under the upload limit, far over the limit of a JSON body.
    length = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % (200 * MB)
    head = (b"POST /api/v1/imports HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\n%s\r\n%s\r\n\r\n" % (credential, length))
    answer = _send_raw(base, head, _zeros(200 * MB), chunked=chunked)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert _peak_rss(server.process.pid) - before <= MAX_GROWTH


@embedded_only
def test_it_still_takes_a_large_upload_with_a_real_token(server):
    base = server.url.removesuffix("/v1")
    transcript = b"\n".join(json.dumps({"role": "user", "content": f"message {i} " + "y" * 40_000}).encode()
                            for i in range(1_000))  # 40 MB: over the small limit
    response = httpx2.post(f"{base}/api/v1/imports", files={"file": ("big.jsonl", transcript, "application/json")},
                           data={"background": "yes"}, headers={"Authorization": f"Bearer {server.token}"},
                           timeout=120)
    assert response.status_code in (201, 202), response.text[:300]


def _upload_scope(headers: list[tuple[bytes, bytes]], path: str = "/api/v1/imports") -> dict:
    return {**_scope(headers), "path": path, "raw_path": path.encode()}


async def _post_in_pieces(headers: list[tuple[bytes, bytes]], pieces: int,
                          path: str = "/api/v1/imports") -> tuple[dict, int, int]:
    """Send up to ``pieces`` MB to the upload endpoint through the middleware, one at a time, until it answers.

    Returns its first answer, how many pieces were sent before it came, and the
    peak of Python allocations meanwhile (each piece is made just before it is
    sent, so only what the server side keeps adds up).
    """
    import tracemalloc

    from asgiref.testing import ApplicationCommunicator
    from django.core.asgi import get_asgi_application

    from contextlab.core.bodylimit import BodyLimitMiddleware

    app = ApplicationCommunicator(BodyLimitMiddleware(get_asgi_application()), _upload_scope(headers, path))
    tracemalloc.start()
    sent = 0
    try:
        base = tracemalloc.get_traced_memory()[0]
        while sent < pieces and await app.receive_nothing(timeout=0.05, interval=0.01):
            await app.send_input({"type": "http.request", "body": b"\0" * MB, "more_body": sent < pieces - 1})
            sent += 1
        start = await app.receive_output(timeout=30)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return start, sent, peak


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("credential", [(b"authorization", b"Bearer cl_forged_0123456789"),
                                        (b"cookie", b"sessionid=forgedsessionkey0123456789abcdef")])
async def test_the_middleware_refuses_a_forged_credential_at_the_small_limit(settings, credential):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * MB
    start, sent, peak = await _post_in_pieces([(b"content-type", b"multipart/form-data; boundary=x"),
                                               credential], 40)
    assert start["status"] == 413
    assert sent <= 6
    assert peak < 8 * MB, f"{peak / MB:.1f} MB"


@pytest.mark.django_db(transaction=True)
async def test_the_middleware_lets_a_real_token_upload_past_the_small_limit(settings):
    from asgiref.sync import sync_to_async
    from django.contrib.auth.models import User

    from contextlab.api.models import ApiToken

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * MB
    user = await sync_to_async(User.objects.create_user)("uploader", password="uploader-password-1")
    token = (await sync_to_async(ApiToken.issue)(user=user, name="upload"))[1]
    start, sent, _ = await _post_in_pieces([(b"content-type", b"multipart/form-data; boundary=x"),
                                      (b"authorization", b"Bearer " + token.encode())], 6)
    # Past the small limit, the view reads the (malformed) form and explains it.
    assert start["status"] == 400 and sent == 6


@pytest.mark.django_db(transaction=True)
async def test_the_middleware_lets_a_logged_in_browser_upload_past_the_small_limit(settings):
    from asgiref.sync import sync_to_async
    from django.contrib.auth.models import User
    from django.test import Client

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * MB

    def log_in() -> str:
        browser = Client()
        browser.force_login(User.objects.create_user("browser", password="browser-password-1"))
        return browser.cookies[settings.SESSION_COOKIE_NAME].value

    session_key = await sync_to_async(log_in)()
    cookie = (b"cookie", b"csrftoken=x; " + settings.SESSION_COOKIE_NAME.encode() + b"=" + session_key.encode())
    start, sent, _ = await _post_in_pieces([(b"content-type", b"multipart/form-data; boundary=x"), cookie], 6,
                                           path="/import/")
    # Past the small limit: the page's own checks answer (no CSRF token here).
    assert start["status"] == 403 and sent == 6
