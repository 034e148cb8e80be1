"""Manage mode across an agent's own compaction, through the gateway with the anthropic SDK.

The request after the agent's compaction no longer continues the session's
history; it continues the same session anyway, its context replaced by what
the agent sent. A rewind with no compaction behind it still forks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from django.contrib.auth.models import User

from contextlab.gateway import managed_messages
from contextlab.gateway.models import GatewayExchange, UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import providers
from tests.gateway.anthropic_provider import AnthropicProvider, last_user_text, text

MODEL = "claude-sonnet-5"
SESSION = {"X-Claude-Code-Session-Id": "0b9d6c1e-58a4-4f7e-9d35-7c1f3b2a9e10"}
SUMMARY = ("This session is being continued from a previous conversation that ran out of context. "
           "Summary: the user is fixing tests/test_api.py; the failing case is test_it_pages.")


@pytest.fixture
def anthropic_upstream() -> Iterator[AnthropicProvider]:
    with AnthropicProvider() as provider:
        yield provider


@pytest.fixture
def profile(alice: User, anthropic_upstream: AnthropicProvider) -> AgentProfile:
    profile = services.profile_create(owner=alice, name="claude", knobs={"max_input_length": 200_000})
    UpstreamProvider.objects.create(profile=profile, base_url=anthropic_upstream.base_url, kind="anthropic",
                                    mode="manage", api_key=providers.encrypt_secret("sk-ant-stored"), timeout=30)
    return profile


def _brain(body: dict[str, Any]) -> Any:
    if "detailed summary of the conversation" in last_user_text(body):
        return text("<summary>the user is fixing tests/test_api.py</summary>")
    return text(f"answer {len(body['messages'])}")


def _call(client: anthropic.Anthropic, messages: list[dict[str, Any]]) -> str:
    reply = client.messages.create(model=MODEL, max_tokens=100, messages=messages, extra_headers=SESSION)
    return "".join(block.text for block in reply.content if block.type == "text")


def test_it_continues_one_session_across_the_agents_compaction(gateway_server, alice_token, profile,
                                                                anthropic_upstream):
    anthropic_upstream.brain = _brain
    client = anthropic.Anthropic(base_url=gateway_server, api_key=alice_token, max_retries=0, timeout=30)
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix tests/test_api.py"}]
    history.append({"role": "assistant", "content": _call(client, history)})
    history.append({"role": "user", "content": "and the paging case in src/api/pages.py"})
    history.append({"role": "assistant", "content": _call(client, history)})
    _call(client, [*history, {"role": "user", "content": "Your task is to create a detailed summary of the "
                                                          "conversation so far."}])
    after = [{"role": "user", "content": SUMMARY}]
    after.append({"role": "assistant", "content": _call(client, after)})
    after.append({"role": "user", "content": "run them"})
    _call(client, after)

    exchanges = list(GatewayExchange.objects.order_by("created"))
    assert [(e.identity, e.managed) for e in exchanges] == [
        ("new", True), ("continued", True), ("", False), ("compacted", True), ("continued", True)]
    session = AgentSession.objects.get()
    assert {e.session_id for e in exchanges} == {session.pk}
    assert exchanges[2].error == managed_messages.COMPACTION_REQUEST
    assert exchanges[3].error == managed_messages.AFTER_COMPACTION
    assert session.turns_count == 4
    turn = session.turns.get(number=3)
    assert (turn.trigger, turn.outcome) == ("agent", "compacted")
    step = next(s for s in turn.trace["steps"] if s["step"] == "agent_compaction")
    assert step["numbers"]["replaced"] == 4 and step["details"]["summary"] == SUMMARY
    assert "src/api/pages.py" in step["details"]["lost_identifiers"]
    # The replaced messages are archived in the session, the new ones live.
    messages = list(session.messages.order_by("seq"))
    assert [m.status for m in messages] == ["archived"] * 4 + ["live"] * 4
    # The provider got what the agent sent after its compaction, nothing of the replaced history.
    assert anthropic_upstream.messages_requests[3].body["messages"] == [{"role": "user", "content": SUMMARY}]
    assert anthropic_upstream.messages_requests[4].body["messages"][0] == {"role": "user", "content": SUMMARY}


def test_it_still_forks_a_rewind_with_no_compaction_behind_it(gateway_server, alice_token, profile,
                                                              anthropic_upstream):
    anthropic_upstream.brain = _brain
    client = anthropic.Anthropic(base_url=gateway_server, api_key=alice_token, max_retries=0, timeout=30)
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix tests/test_api.py"}]
    history.append({"role": "assistant", "content": _call(client, history)})
    _call(client, [*history, {"role": "user", "content": "go on"}])
    _call(client, [{"role": "user", "content": "start over: fix tests/test_cli.py"}])

    exchanges = list(GatewayExchange.objects.order_by("created"))
    assert [e.identity for e in exchanges] == ["new", "continued", "forked"]
    assert AgentSession.objects.count() == 2
    assert exchanges[2].session.gateway.forked_from == exchanges[0].session
