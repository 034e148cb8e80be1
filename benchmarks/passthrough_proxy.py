"""The least any proxy that rewrites ``messages`` must do, as an ASGI app: the floor of the gateway benchmark.

``benchmarks/gateway_latency.py`` serves this under Daphne, like the gateway, in
front of the same provider. It parses the client's JSON body, encodes it again
and forwards it with the gateway's HTTP client (``httpx2``, a pooled async
client here, so not even a thread hop), then passes the provider's answer back
(streamed answers event by event as they arrive). No authentication, no
database, no session, no engine: what it adds over the direct call is the cost
of the second HTTP hop itself, which no proxy can avoid, and the gateway's own
work is what it adds above this.

Not part of ContextLab: never route traffic through it.

    daphne benchmarks.passthrough_proxy:application   # UPSTREAM_BASE_URL=http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx2

UPSTREAM = os.environ.get("UPSTREAM_BASE_URL", "").rstrip("/")
_client: httpx2.AsyncClient | None = None


def _http() -> httpx2.AsyncClient:
    global _client
    if _client is None:
        _client = httpx2.AsyncClient(timeout=120, limits=httpx2.Limits(max_keepalive_connections=50))
    return _client


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        return
    if scope["type"] != "http":
        return
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
        # Anything else (the benchmark's readiness probe): a plain 404.
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = json.loads(b"".join(chunks))
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    stream = body.get("stream") is True
    request = _http().build_request("POST", f"{UPSTREAM}/chat/completions", content=data,
                                    headers={"Content-Type": "application/json",
                                             "Authorization": "Bearer sk-upstream"})
    answer = await _http().send(request, stream=True)
    try:
        await send({"type": "http.response.start", "status": answer.status_code,
                    "headers": [(b"content-type", answer.headers.get("content-type", "application/json").encode())]})
        if stream:
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": await answer.aread()})
    finally:
        await answer.aclose()
