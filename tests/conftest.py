"""Personas and fixtures shared by the web-app tests.

Alice owns sessions; Bob is another user who must never see them, through a
page or through the API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from contextlab.api.models import ApiToken
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession


@pytest.fixture(autouse=True)
def _workspaces(settings: Any, tmp_path: Path) -> Iterator[Path]:
    # Every test gets its own workspaces folder, never the developer's var/.
    settings.WORKSPACES_DIR = tmp_path / "workspaces"
    yield settings.WORKSPACES_DIR


@pytest.fixture(autouse=True)
def _gateway_lookups() -> Iterator[None]:
    # Each test's database starts empty (truncated, no signals): nothing a test kept may reach the next.
    from contextlab.gateway import lookups

    lookups.clear()
    yield
    lookups.clear()


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", "alice@example.org", "alice-password")


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user("bob", "bob@example.org", "bob-password")


@pytest.fixture
def alice_token(alice: User) -> str:
    return ApiToken.issue(user=alice, name="tests")[1]


@pytest.fixture
def bob_token(bob: User) -> str:
    return ApiToken.issue(user=bob, name="tests")[1]


@pytest.fixture
def small_profile(alice: User) -> AgentProfile:
    """A 4,000-token window with small byte limits: truncation and compaction fire quickly."""
    return services.profile_create(owner=alice, name="small", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
    })


@pytest.fixture
def alice_session(alice: User, small_profile: AgentProfile) -> AgentSession:
    return services.session_create(owner=alice, system_prompt="You are a careful coding agent.",
                                   profile=small_profile, title="Fix the nightly build")


class JsonClient:
    """The Django test client speaking JSON with a bearer token."""

    def __init__(self, client: Client, token: str | None) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, body: Any = None, *, raw: bytes | str | None = None) -> Any:
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(path, data, content_type="application/json", headers=self.headers)


@pytest.fixture
def api(client: Client, alice_token: str) -> JsonClient:
    return JsonClient(client, alice_token)


@pytest.fixture
def bob_api(bob_token: str) -> JsonClient:
    return JsonClient(Client(), bob_token)
