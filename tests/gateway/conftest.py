"""Fixtures of the gateway tests: a local provider, a profile routed to it, and
official ``openai`` clients pointed at the gateway served by Django's live-server
thread (real HTTP on 127.0.0.1, WSGI; ``test_asgi`` runs it under Daphne)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from django.contrib.auth.models import User
from django.core.servers.basehttp import WSGIServer
from django.db import connections
from django.test import Client
from django.test.testcases import LiveServerThread, _StaticFilesHandler
from openai import AsyncOpenAI, OpenAI

from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions.models import AgentProfile
from contextlab.support import providers
from tests.gateway.observed_calls import drained
from tests.gateway.provider import Provider

UPSTREAM_KEY = "sk-upstream-test-key"


@pytest.fixture
def provider() -> Iterator[Provider]:
    with Provider() as stub:
        yield stub


@pytest.fixture
def upstream(small_profile: AgentProfile, provider: Provider) -> UpstreamProvider:
    """Alice's small profile (4,000-token window) routed to the local provider."""
    return UpstreamProvider.objects.create(profile=small_profile, base_url=provider.base_url,
                                           api_key=providers.encrypt_secret(UPSTREAM_KEY), model_map={"gpt-4o": "fake-model-2026"},
                                           timeout=30)


class _OneAtATimeServer(WSGIServer):
    """Django's development WSGI server without threads.

    Without a threading server Django answers every request with "Connection:
    close", so no handler thread outlives a test holding a pooled client
    connection and, with it, the test's shared in-memory database connection.
    Tests send one request at a time anyway.
    """

    def __init__(self, *args: Any, connections_override: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)


class _ServerThread(LiveServerThread):
    server_class = _OneAtATimeServer


def _recorded_after_each_answer(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """Every client of the server at ``port`` (httpx2: the OpenAI and Anthropic SDKs' too) waits,
    once it has read a whole answer, until the gateway has recorded what it answered.

    Observe mode answers first and rebuilds the session after the answer has left
    (``CONTEXTLAB_OBSERVE_ANSWER_FIRST``), in the server's thread: a test reading
    the session right after its call would race that thread. The wait is on the
    calls the gateway registered before answering (``observe.recording_drained``),
    never a sleep, and the gateway's path is the one it takes in production."""
    def ours(request: httpx2.Request) -> bool:
        return request.url.host == "127.0.0.1" and request.url.port == port

    send, send_async = httpx2.Client.send, httpx2.AsyncClient.send

    def draining_send(self: httpx2.Client, request: httpx2.Request, *args: Any, stream: bool = False,
                      **kwargs: Any) -> httpx2.Response:
        response = send(self, request, *args, stream=stream, **kwargs)
        if ours(request):
            if stream:
                close = response.close

                def closed() -> None:
                    close()
                    drained()

                response.close = closed  # type: ignore[method-assign]
            else:
                drained()
        return response

    async def draining_send_async(self: httpx2.AsyncClient, request: httpx2.Request, *args: Any,
                                  stream: bool = False, **kwargs: Any) -> httpx2.Response:
        response = await send_async(self, request, *args, stream=stream, **kwargs)
        if ours(request):
            if stream:
                aclose = response.aclose

                async def aclosed() -> None:
                    await aclose()
                    drained()

                response.aclose = aclosed  # type: ignore[method-assign]
            else:
                drained()
        return response

    monkeypatch.setattr(httpx2.Client, "send", draining_send)
    monkeypatch.setattr(httpx2.AsyncClient, "send", draining_send_async)


@pytest.fixture
def gateway_server(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The project under WSGI on 127.0.0.1, started and stopped around one test; yields its URL.

    Like Django's LiveServerTestCase: the in-memory test database connection is
    shared with the server thread, and data is committed (transactional_db).
    Its clients wait for observe mode's recording after each answer
    (``_recorded_after_each_answer``).
    """
    shared = {c.alias: c for c in connections.all() if c.vendor == "sqlite" and c.is_in_memory_db()}
    thread = _ServerThread("127.0.0.1", _StaticFilesHandler, connections_override=shared, port=0)
    thread.daemon = True
    for connection in shared.values():
        connection.inc_thread_sharing()
    thread.start()
    thread.is_ready.wait()
    try:
        if thread.error:
            raise thread.error
        _recorded_after_each_answer(monkeypatch, thread.port)
        yield f"http://127.0.0.1:{thread.port}"
    finally:
        thread.terminate()
        for connection in shared.values():
            connection.dec_thread_sharing()


@pytest.fixture
def gateway_url(gateway_server: str) -> str:
    return f"{gateway_server}/v1"


@pytest.fixture
def openai_client(gateway_url: str, alice_token: str, upstream: UpstreamProvider) -> OpenAI:
    # No retries: a test must see the first answer, not a retried one.
    return OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0, timeout=30)


@pytest.fixture
def async_client(gateway_url: str, alice_token: str, upstream: UpstreamProvider) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0, timeout=30)


@pytest.fixture
def alice_browser(alice: User) -> Client:
    browser = Client()
    browser.force_login(alice)
    return browser
