"""The engine cache across processes: one conversation's calls alternate between two web processes.

Each web process keeps the engines it used, valid for one committed state
version. When the other process has written the session since, the version on
the row has moved and the engine must be loaded again: a process that reused
its own engine would send upstream a context without the messages the other
process ingested, and write rows that lose or repeat them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from tests.conversations import log_output
from tests.gateway.provider import Provider, tool_loop
from tests.scaled.conftest import skip_unless_scaled
from tests.scaled.deployment import Deployment

pytestmark = skip_unless_scaled

SETUP = """
import json
from django.contrib.auth.models import User
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
alice = User.objects.get(username="alice")
profile = services.profile_create(owner=alice, name={name!r}, knobs={knobs!r})
UpstreamProvider.objects.create(profile=profile, base_url={base_url!r}, api_key="sk-upstream", timeout=60)
print(json.dumps(profile.name))
"""

STATE = """
import json
from contextlab.gateway.models import GatewaySession
from contextlab.sessions.models import AgentSession, SessionMessage
from tests.invariants import assert_nothing_lost
sessions = list(AgentSession.objects.filter(profile__name={name!r}))
assert len(sessions) == 1, [s.title for s in sessions]
session = sessions[0]
assert_nothing_lost(session)
rows = SessionMessage.objects.filter(session=session).order_by("seq")
print(json.dumps({{
    "id": str(session.pk), "turns": session.turns_count, "compactions": session.compactions_count,
    "state_version": session.state_version, "history": GatewaySession.objects.get(session=session).history_length,
    "contents": [r.content for r in rows], "roles": [r.role for r in rows],
}}))
"""

TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with Provider(tool_loop("run_shell", final="Built; no errors.")) as stub:
        yield stub


def _profile(deployment: Deployment, provider: Provider, name: str, knobs: dict[str, Any]) -> str:
    return str(deployment.python(SETUP.format(name=name, knobs=knobs, base_url=provider.base_url)))


def _clients(deployment: Deployment, profile: str) -> list[OpenAI]:
    return [OpenAI(base_url=f"{deployment.processes[name].url}/v1", api_key=deployment.token, max_retries=0,
                   timeout=60, default_headers={"X-ContextLab-Profile": profile}) for name in ("web1", "web2")]


def _agent_step(client: OpenAI, messages: list[Any], *, stream: bool) -> None:
    """One call of a tool-using agent, on ``client``; the reply (and a tool result) join ``messages``."""
    if stream:
        chunks = list(client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS, stream=True))
        calls = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or []]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments}} for c in calls if c.id]
    else:
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS).choices[0].message
        message = reply.model_dump(exclude_none=True)
    messages.append(message)
    for call in message.get("tool_calls") or []:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": log_output(1_000, tag=call["id"])})


def _calls(message: dict[str, Any]) -> list[str]:
    return [c["id"] for c in message.get("tool_calls") or []]


def _run(clients: list[OpenAI], provider: Provider, calls: int, *, check_payload: bool) -> tuple[list[Any], int]:
    """The agent's history after ``calls`` calls, and how many of its messages the last call sent."""
    messages: list[Any] = [{"role": "system", "content": "You are a build engineer. Keep exact paths."}]
    sent = 0
    for number in range(calls):
        if messages[-1]["role"] != "tool":
            messages.append({"role": "user", "content": f"Step {number}: build target t{number}."})
        sent = len(messages)
        # web1, web2, web1, ...: every call meets an engine the other process moved on from.
        _agent_step(clients[number % 2], messages, stream=number % 3 == 2)
        if check_payload:
            # Nothing compacts: what goes upstream is exactly what the client sent.
            upstream = provider.chat_requests[-1].body["messages"]
            client_sent = messages[:sent]
            assert [m["role"] for m in upstream] == [m["role"] for m in client_sent]
            assert [m.get("content") or None for m in upstream] == [m.get("content") or None for m in client_sent]
            assert [_calls(m) for m in upstream] == [_calls(m) for m in client_sent]
    return messages, sent


def test_it_never_serves_a_stale_engine_when_calls_alternate_between_processes(deployment, provider):
    profile = _profile(deployment, provider, "alternating", {"max_input_length": 1_000_000})
    messages, sent = _run(_clients(deployment, profile), provider, 12, check_payload=True)

    state = deployment.python(STATE.format(name=profile))
    # One row per message the client sent (after the system prompt), in order, none lost or
    # doubled, plus the last reply; the gateway's history covers exactly those.
    recorded = messages[1:sent + 1]
    assert state["roles"] == [m["role"] for m in recorded]
    assert state["history"] == len(recorded)
    assert state["turns"] == 12


def test_it_compacts_consistently_when_calls_alternate_between_processes(deployment, provider):
    profile = _profile(deployment, provider, "alternating-small", {
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400})
    messages, sent = _run(_clients(deployment, profile), provider, 44, check_payload=False)

    state = deployment.python(STATE.format(name=profile))
    assert state["compactions"] >= 1, "the 4,000-token window must have compacted"
    assert state["roles"] == [m["role"] for m in messages[1:sent + 1]]
    assert state["turns"] == 44
    # The newest message reached the provider as the client sent it, after the summary.
    upstream = provider.chat_requests[-1].body["messages"]
    assert any(m.get("name") == "summary" for m in upstream)
    assert upstream[-1]["role"] == messages[sent - 1]["role"]
    assert upstream[-1].get("content") == messages[sent - 1].get("content")
