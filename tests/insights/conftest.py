"""Sessions for the insight pages: a tool session with a failure, a compacted one, imports."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession

XSS = "<script>alert('xss')</script>"


def call(call_id: str, name: str, arguments: dict[str, Any], text: str = "") -> dict[str, Any]:
    return {"role": "assistant", "content": text or None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def tool_session(alice_session: AgentSession) -> AgentSession:
    """A build that fails first and then works, under a request that carries markup."""
    services.messages_append(session=alice_session, messages=[
        {"role": "user", "content": f"Fix the nightly build {XSS}. Please always run the tests with pytest -q."},
        call("call_1", "bash", {"command": "make build"}, "Building first."),
        result("call_1", "make: *** No rule to make target 'build'.  Stop.\n[The command completed with exit code 2.]"),
        call("call_2", "bash", {"command": f"make all # {XSS}"}),
        result("call_2", "gcc -o app main.c\nbuild ok\n[The command completed with exit code 0.]"),
        {"role": "assistant", "content": "The build works again: the target is `all`, not `build`."},
    ])
    alice_session.refresh_from_db()
    return alice_session


@pytest.fixture
def compacted_session(alice_session: AgentSession) -> AgentSession:
    """Fourteen build rounds, a preference up front, and one compaction: the archive holds the head."""
    from tests.conversations import answer, tool_turn

    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "I prefer tabs over spaces in every Python file."},
        {"role": "assistant", "content": "Noted: tabs."}]
    # Enough rounds that CoPaw's own estimate would compact too (the contextlab policy waits for it).
    for i in range(1, 15):
        messages += [*tool_turn(i, output_bytes=1_400), answer(i)]
    messages.append({"role": "user", "content": "Now write the release notes."})
    services.messages_append(session=alice_session, messages=messages)
    services.session_prepare(session=alice_session)
    alice_session.refresh_from_db()
    assert alice_session.compactions_count >= 1
    return alice_session
