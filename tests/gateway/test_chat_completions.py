"""The official openai client (sync, async, streaming) through the gateway to a local provider."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest

from contextlab.gateway.models import GatewayExchange, GatewaySession
from contextlab.sessions.models import AgentSession, Turn
from tests.gateway.conftest import UPSTREAM_KEY
from tests.gateway.provider import USAGE, Answer, completion

SYSTEM = {"role": "system", "content": "You are a careful build agent."}
ASK = {"role": "user", "content": "Build the shop and tell me what fails."}


def test_it_forwards_a_completion_and_gives_back_the_providers_bytes(openai_client, provider, alice_token):
    provider.responder = lambda body: Answer("The payments module fails to link.")
    raw = openai_client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[SYSTEM, ASK])
    assert raw.http_response.status_code == 200
    assert raw.http_response.content == json.dumps(completion(Answer("The payments module fails to link."), 1)).encode()
    assert raw.http_response.headers["x-request-id"] == "req-test"
    assert raw.parse().choices[0].message.content == "The payments module fails to link."

    sent = provider.chat_requests[-1]
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # never the ContextLab token
    assert alice_token not in json.dumps(sent.headers)
    assert sent.body == {"model": "fake-model-2026", "messages": [SYSTEM, ASK]}

    session = AgentSession.objects.get()
    assert raw.http_response.headers["X-ContextLab-Session"] == str(session.pk)
    assert raw.http_response.headers["X-ContextLab-Managed"] == "true"
    assert session.title == "gateway · Build the shop and tell me what fails."
    assert session.system_prompt == SYSTEM["content"]
    turn = Turn.objects.get(session=session)
    assert turn.usage == USAGE  # the provider's count, beside ours (turn.payload_tokens)
    assert turn.payload == [SYSTEM, ASK]
    # The reply is in the session already, ready to pair with the next call.
    assert [m.role for m in session.messages.order_by("seq")] == ["user", "assistant"]
    exchange = GatewayExchange.objects.get()
    assert (exchange.managed, exchange.identity, exchange.status_code, exchange.turn_number) == (True, "new", 200, 1)
    assert (exchange.model, exchange.upstream_model) == ("gpt-4o", "fake-model-2026")


def test_it_forwards_every_other_parameter_unchanged(openai_client, provider):
    tools = [{"type": "function", "function": {"name": "run_shell", "description": "Run a command",
                                               "parameters": {"type": "object",
                                                              "properties": {"command": {"type": "string"}}}}}]
    params = {
        "temperature": 0.2, "top_p": 0.9, "max_tokens": 321, "seed": 7, "user": "agent-7", "stop": ["###"],
        "presence_penalty": 0.1, "frequency_penalty": 0.3, "logit_bias": {"50256": -100}, "n": 1,
        "response_format": {"type": "json_object"}, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "run_shell"}}, "parallel_tool_calls": False,
        "metadata": {"run": "42"}, "store": False,
    }
    openai_client.chat.completions.create(model="some-unmapped-model", messages=[SYSTEM, ASK], **params,
                                          extra_body={"vendor_knob": {"depth": 3}})
    sent = provider.chat_requests[-1].body
    assert sent.pop("messages") == [SYSTEM, ASK]
    assert sent == {"model": "some-unmapped-model", **params, "vendor_knob": {"depth": 3}}


def test_it_continues_the_session_with_only_the_new_messages(openai_client, provider):
    provider.responder = lambda body: Answer(f"answer {len(body['messages'])}")
    messages = [SYSTEM, ASK]
    for n in range(3):
        reply = openai_client.chat.completions.create(model="gpt-4o", messages=messages).choices[0].message
        messages += [reply, {"role": "user", "content": f"and now step {n}"}]
    openai_client.chat.completions.create(model="gpt-4o", messages=messages)
    session = AgentSession.objects.get()
    assert session.turns_count == 4
    assert session.messages.count() == len(messages)  # every message once, replies included
    assert list(GatewayExchange.objects.order_by("created").values_list("matched_messages", "new_messages")) == \
        [(0, 1), (2, 1), (4, 1), (6, 1)]
    assert GatewaySession.objects.get().history_length == len(messages)


def test_it_works_with_the_async_client(async_client, provider):
    provider.responder = lambda body: Answer("async answer")

    async def conversation() -> list[str]:
        first = await async_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK])
        again = await async_client.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, ASK, first.choices[0].message, {"role": "user", "content": "more"}])
        await async_client.close()
        return [first.choices[0].message.content or "", again.choices[0].message.content or ""]

    assert asyncio.run(conversation()) == ["async answer", "async answer"]
    assert AgentSession.objects.get().turns_count == 2


def test_it_streams_and_strips_the_usage_chunk_it_asked_for(openai_client, provider):
    provider.responder = lambda body: Answer("Streaming works through the gateway.")
    chunks = list(openai_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "Streaming works through the gateway."
    assert all(c.choices for c in chunks)  # no usage-only chunk reached a client that did not ask
    assert all(c.usage is None for c in chunks)
    assert provider.chat_requests[-1].body["stream_options"] == {"include_usage": True}
    turn = Turn.objects.get()
    assert turn.usage == USAGE
    reply = AgentSession.objects.get().messages.get(role="assistant")
    assert reply.content == [{"type": "text", "text": "Streaming works through the gateway."}]


def test_it_passes_the_usage_chunk_when_the_client_asked(openai_client, provider):
    provider.responder = lambda body: Answer("counted")
    chunks = list(openai_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK], stream=True,
                                                        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == USAGE["prompt_tokens"]
    assert provider.chat_requests[-1].body["stream_options"] == {"include_usage": True}
    assert Turn.objects.get().usage == USAGE


def test_it_streams_with_the_async_client(async_client, provider):
    provider.responder = lambda body: Answer("async stream")

    async def consume() -> str:
        stream = await async_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK], stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await async_client.close()
        return text

    assert asyncio.run(consume()) == "async stream"
    assert Turn.objects.get().usage == USAGE


def test_it_relays_the_providers_event_stream_unchanged(gateway_url, alice_token, upstream, provider):
    """Byte level: every event but the gateway's own usage chunk is passed as the provider framed it."""
    provider.responder = lambda body: Answer("exact bytes", usage=None)
    body = {"model": "gpt-4o", "messages": [SYSTEM, ASK], "stream": True, "stream_options": {"include_usage": True}}
    with httpx2.Client(timeout=30) as http:
        through = http.post(f"{gateway_url}/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {alice_token}"})
        direct = http.post(f"{provider.base_url}/chat/completions", json=body)
    assert through.status_code == 200 and through.headers["content-type"].startswith("text/event-stream")
    assert through.content.replace(b"chatcmpl-1", b"chatcmpl-N") == direct.content.replace(b"chatcmpl-2", b"chatcmpl-N")


@pytest.mark.parametrize("stream", [False, True])
def test_it_records_a_reply_for_every_call(openai_client, provider, stream):
    provider.responder = lambda body: Answer("noted")
    response = openai_client.chat.completions.create(model="gpt-4o", messages=[ASK], stream=stream)
    if stream:
        list(response)
    gateway = GatewaySession.objects.get()
    assert gateway.history_length == 2  # the ask and the reply
    assert gateway.session.messages.last().role == "assistant"


def test_it_counts_the_calls_tool_schemas_as_a_layer_of_the_budget(openai_client, provider):
    from contextlab.engine.core.schemas import tool_tokens
    from contextlab.engine.core.tokens import TiktokenCounter

    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Run step {i} of the build and report its errors.",
        "parameters": {"type": "object", "properties": {"target": {"type": "string", "description": "Target."}}}}}
        for i in range(40)]
    openai_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK], tools=tools)
    assert provider.chat_requests[-1].body["tools"] == tools  # forwarded unchanged
    turn = Turn.objects.get()
    tokens = turn.trace["payload"]["tokens"]
    layer = tool_tokens(TiktokenCounter(), tools)
    assert tokens["tools"] == layer > 40 * 20
    assert tokens["total"] == tokens["system"] + tokens["summary"] + tokens["tools"] + tokens["messages"] \
        + tokens["tool_results"] + 3
    gate = next(s for s in turn.trace["steps"] if s["step"] == "gate")
    assert gate["numbers"]["tools_tokens"] == layer
