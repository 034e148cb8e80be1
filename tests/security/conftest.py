"""Fixtures of the trust-boundary tests: two users, each with a session that has an archive."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

import httpx2
import pytest
from django.test import Client

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession
from tests.conversations import answer, tool_turn
from tests.gateway.servers import RunningGateway, gateway_under_daphne


def work(session: AgentSession, turns: int) -> AgentSession:
    """``turns`` tool exchanges with a hook run after each: enough to archive messages on a small profile."""
    for i in range(1, turns + 1):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=2_500)])
        services.session_prepare(session=session)
    services.compaction_run(session=session)
    session.refresh_from_db()
    return session


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def zipped(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture
def bob_session(bob) -> AgentSession:
    """Bob's session, with a dialog archive another user's upload must never touch."""
    profile = services.profile_create(owner=bob, name="small", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
    })
    session = services.session_create(owner=bob, system_prompt="You are Bob's agent.", profile=profile)
    return work(session, 5)


@pytest.fixture
def alice_worked(alice_session) -> AgentSession:
    return work(alice_session, 5)


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


# The gateway's local provider and live server, for the bad-text tests of the gateway.
from tests.gateway.conftest import gateway_server, gateway_url, provider, upstream  # noqa: E402, F401


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningGateway]:
    """The project under daphne in a subprocess (a database of its own), shared by a module's tests."""
    # No provider is called here; the gateway seed just needs an address.
    with gateway_under_daphne(tmp_path_factory.mktemp("server"), "http://127.0.0.1:9") as running:
        base = running.url.removesuffix("/v1")
        # Warm up the views these tests reach, so their first use is not counted.
        httpx2.get(f"{base}/api/v1/sessions", headers={"Authorization": f"Bearer {running.token}"}, timeout=30)
        httpx2.post(f"{base}/api/v1/sessions", json={}, timeout=30)
        yield running
