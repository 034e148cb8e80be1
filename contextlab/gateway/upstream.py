"""Talking to the real provider, and answering in OpenAI's shapes.

A raw HTTP client (``httpx2``, which the ``openai`` package is built on) rather
than the ``openai`` client: the gateway must forward request parameters it has
never heard of and give back the provider's bytes — success or error — exactly
as they came, which a typed SDK would parse, validate and re-serialise.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
from django.http import HttpResponse, JsonResponse

from contextlab.gateway.models import UpstreamProvider

# Provider headers worth passing back: the content type, and what clients use
# to back off (retry-after, rate-limit budgets) or to report a request id.
_PASSED_HEADERS = ("content-type", "retry-after", "retry-after-ms", "x-request-id")
_PASSED_PREFIXES = ("x-ratelimit-", "openai-")
# Connection-level failures never reached the provider's application, so they
# have no provider body to pass on; the gateway answers for them.
CONNECT_TIMEOUT = 10.0

_client: httpx2.Client | None = None
_client_lock = threading.Lock()


def client() -> httpx2.Client:
    """One pooled client per process: keep-alive connections to the provider are reused."""
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx2.Client(
                follow_redirects=False,
                limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50, keepalive_expiry=30.0),
            )
        return _client


def _timeout(provider: UpstreamProvider) -> httpx2.Timeout:
    return httpx2.Timeout(provider.timeout, connect=min(provider.timeout, CONNECT_TIMEOUT))


def _headers(provider: UpstreamProvider, api_key: str, *, stream: bool) -> dict[str, str]:
    headers = {"Content-Type": "application/json",
               "Accept": "text/event-stream" if stream else "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if isinstance(provider.extra_headers, dict):
        headers.update({str(k): str(v) for k, v in provider.extra_headers.items()})
    return headers


def post_chat(provider: UpstreamProvider, api_key: str, body: dict[str, Any], *, stream: bool,
              trace_headers: dict[str, str] | None = None) -> httpx2.Response:
    """POST the chat completion; with ``stream`` the body is left unread for ``relay``.

    Raises ``httpx2.TimeoutException`` / ``httpx2.TransportError`` when the
    provider cannot be reached or does not answer in time.
    """
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    http = client()
    # The caller's trace continues upstream (W3C trace context), so the provider's span joins it.
    headers = {**_headers(provider, api_key, stream=stream), **(trace_headers or {})}
    request = http.build_request("POST", provider.chat_url, content=data, headers=headers,
                                 timeout=_timeout(provider))
    return http.send(request, stream=stream)


def with_credential(headers: dict[str, str], credential: tuple[str, str] | None) -> dict[str, str]:
    """``headers`` with the client's own provider credential (header, value) instead of the stored key."""
    if credential is not None:
        headers.pop("Authorization", None)
        headers[credential[0]] = credential[1]
    return headers


def post(provider: UpstreamProvider, api_key: str, path: str, body: dict[str, Any], *, stream: bool,
         trace_headers: dict[str, str] | None = None, credential: tuple[str, str] | None = None) -> httpx2.Response:
    """POST a JSON body to ``path`` under the provider's base URL (another protocol's endpoint);
    ``credential``: the client's own (header, value), sent instead of ``api_key``."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    http = client()
    headers = {**with_credential(_headers(provider, api_key, stream=stream), credential), **(trace_headers or {})}
    request = http.build_request("POST", provider.url(path), content=data, headers=headers,
                                 timeout=_timeout(provider))
    return http.send(request, stream=stream)


def get(provider: UpstreamProvider, api_key: str, path: str) -> httpx2.Response:
    headers = _headers(provider, api_key, stream=False)
    del headers["Content-Type"]
    return client().get(provider.url(path), headers=headers, timeout=_timeout(provider))


def lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Split a byte stream into lines (the line ending removed), whatever the chunking."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending


def passed_headers(response: httpx2.Response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items()
            if name.lower() in _PASSED_HEADERS or name.lower().startswith(_PASSED_PREFIXES)}


def passthrough(response: httpx2.Response, content: bytes) -> HttpResponse:
    """The provider's answer as it came: status, body bytes and the headers clients use."""
    out = HttpResponse(content, status=response.status_code)
    for name, value in passed_headers(response).items():
        out[name] = value
    if "content-type" not in {n.lower() for n in passed_headers(response)}:
        del out["Content-Type"]
    return out


def openai_error(status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> JsonResponse:
    """An error the gateway itself raises, shaped like the provider's own errors."""
    return JsonResponse({"error": {"message": message, "type": type, "param": param, "code": code}}, status=status)
