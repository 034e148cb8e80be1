"""Compaction takes effect although the client keeps, and resends, its full history."""

from __future__ import annotations

from typing import Any

from contextlab.gateway.models import GatewayExchange
from contextlab.sessions.models import AgentSession
from tests.conversations import log_output
from tests.gateway.provider import tool_loop

SYSTEM = {"role": "system", "content": "You are a build engineer. Keep exact paths and error lines."}
TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}}}}}]


def _agent(openai_client, rounds: int, *, stream: bool = False) -> list[Any]:
    """A plain tool loop over ``rounds`` user asks; returns the client's full history."""
    messages: list[Any] = [SYSTEM]
    for i in range(1, rounds + 1):
        messages.append({"role": "user", "content": f"Step {i}: build target t{i} and report errors in /srv/t{i}.log"})
        while True:
            if stream:
                chunks = list(openai_client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS,
                                                                    stream=True))
                calls = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or []]
                text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
                message: Any = {"role": "assistant", "content": text or None}
                if calls:
                    message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                        "name": c.function.name, "arguments": c.function.arguments}} for c in calls if c.id]
                call_ids = [c.id for c in calls if c.id]
            else:
                message = openai_client.chat.completions.create(model="gpt-4o", messages=messages,
                                                                tools=TOOLS).choices[0].message
                call_ids = [c.id for c in message.tool_calls or []]
            messages.append(message)
            if not call_ids:
                break
            messages.extend({"role": "tool", "tool_call_id": cid, "content": log_output(1_000, tag=f"t{i}")}
                            for cid in call_ids)
    return messages


def _same(client_message: Any, upstream_message: dict[str, Any]) -> bool:
    if not isinstance(client_message, dict):  # the SDK's message object: compare what identifies it
        return upstream_message["role"] == "assistant" and \
            [c["id"] for c in upstream_message.get("tool_calls", [])] == \
            [c.id for c in client_message.tool_calls or []] and \
            (upstream_message.get("content") or None) == (client_message.content or None)
    return client_message == upstream_message


def test_it_sends_the_managed_context_upstream_in_a_long_conversation(openai_client, provider, small_profile):
    provider.responder = tool_loop("run_shell", final="Built; no errors.")
    messages = _agent(openai_client, 22)

    session = AgentSession.objects.get()
    assert session.compactions_count >= 1
    compacted = [t for t in session.turns.order_by("number") if t.compacted]
    assert compacted, "the 4,000-token profile must have compacted"

    # The last call: the client sent everything, the provider got the managed context.
    client_sent = messages[:-1]
    upstream = provider.chat_requests[-1].body["messages"]
    assert len(upstream) < len(client_sent)
    assert upstream[0] == SYSTEM
    summaries = [m for m in upstream if m.get("name") == "summary"]
    assert len(summaries) == 1 and summaries[0]["role"] == "user" and "## Goal" in summaries[0]["content"]
    # The newest messages arrive intact: the last ask, its tool call, its full tool output.
    tail = 3
    assert all(_same(c, u) for c, u in zip(client_sent[-tail:], upstream[-tail:], strict=True))
    assert upstream[-1]["content"] == log_output(1_000, tag="t22")
    # The drift view has both counts for every call.
    latest = session.turns.order_by("-number").first()
    assert latest.usage is not None and latest.payload_tokens > 0
    assert len(latest.payload) == len(upstream)

    exchange = GatewayExchange.objects.order_by("-created").first()
    assert exchange.client_messages == len(client_sent) and exchange.upstream_messages == len(upstream)
    assert exchange.new_messages == 1  # only the newest tool result was new


def test_it_compacts_a_streamed_conversation_too(openai_client, provider):
    provider.responder = tool_loop("run_shell", final="Built; no errors.")
    messages = _agent(openai_client, 22, stream=True)
    session = AgentSession.objects.get()
    assert session.compactions_count >= 1
    upstream = provider.chat_requests[-1].body["messages"]
    assert len(upstream) < len(messages) - 1
    assert any(m.get("name") == "summary" for m in upstream)
    assert AgentSession.objects.count() == 1
