"""The Anthropic adapter's own rules: conversion to the internal shape and back, streams, signatures,
and who is calling (``contextlab.gateway.credentials``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.api.models import ApiToken
from contextlab.gateway import credentials, history
from contextlab.gateway.protocols import anthropic_messages as am

SIGNED = {"type": "thinking", "thinking": "Check the log first.", "signature": "EqQBCkYIBxgCKkB"}


def test_it_converts_a_claude_code_request_to_the_internal_shape():
    body = {"model": "m", "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.93d;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>env</system-reminder>"},
                                         {"type": "text", "text": "list the files"}]},
            {"role": "assistant", "content": [SIGNED, {"type": "redacted_thinking", "data": "opaque"},
                                              {"type": "tool_use", "id": "t1", "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "a.txt"}, {"type": "image"}]},
                                         {"type": "text", "text": "go on"}]},
            {"role": "system", "content": ""},
            {"role": "user", "content": [{"type": "hologram_2031", "x": 1}]},
            {"role": "user", "content": "again"},
        ],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}
    chat = am.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>env</system-reminder>"},
                                     {"type": "text", "text": "list the files"}]},
        {"role": "assistant", "content": None, "reasoning_content": "Check the log first.",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "Bash",
                                                                      "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.txt\n[image]", "is_error": True},
        {"role": "user", "content": [{"type": "text", "text": "go on"}]},
        {"role": "system", "content": ""},
        # A block type the adapter does not read: its JSON, marked unknown (sent upstream as it came).
        {"role": "user", "content": [{"type": "text", "text": '[unknown hologram_2031] {"type": "hologram_2031", "x": 1}'}]},
        {"role": "user", "content": "again"},
    ]
    assert chat["tools"][0]["function"]["name"] == "Bash" and chat["tools"][1]["type"] == "web_search_20250305"
    assert chat["context_management"] == {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    # The engine's copy never carries thinking: it is sent verbatim and never summarised.
    assert "reasoning_content" not in am.to_chat(body, thinking_text=False)["messages"][2]


def test_the_engines_payload_goes_back_as_the_agents_own_blocks():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Build.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [SIGNED, {"type": "tool_use", "id": "t1", "name": "Bash",
                                                   "input": {"command": "make"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x" * 500,
                                      "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "next"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "OK."}]},
    ]
    _, chat = history.split_system(am.to_chat({"messages": messages}, thinking_text=False)["messages"])
    assert am.from_chat(chat, messages) == messages
    # The engine shortened the tool output and put a summary first.
    managed = [{"role": "user", "name": "summary", "content": "<summary>built once</summary>"}, *chat[1:]]
    managed[2] = {**managed[2], "content": "x" * 40 + " [truncated]"}
    back = am.from_chat(managed, messages)
    assert back[0] == {"role": "user", "content": [{"type": "text", "text": "<summary>built once</summary>"}]}
    assert back[1] == messages[1]  # thinking and its signature, untouched
    assert back[2]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "x" * 40 + " [truncated]",
                                     "cache_control": {"type": "ephemeral"}}
    assert back[2]["content"][1] == {"type": "text", "text": "next"}


def test_equal_answers_keep_their_own_thinking():
    first = {"role": "assistant", "content": [{**SIGNED, "signature": "one"}, {"type": "text", "text": "OK."}]}
    second = {"role": "assistant", "content": [{**SIGNED, "signature": "two"}, {"type": "text", "text": "OK."}]}
    messages = [{"role": "user", "content": "a"}, first, {"role": "user", "content": "b"}, second]
    _, chat = history.split_system(am.to_chat({"messages": messages}, thinking_text=False)["messages"])
    assert am.from_chat(chat, messages) == messages


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20).filter(
    lambda t: t.strip() == t and t)
_cache = st.one_of(st.none(), st.just({"type": "ephemeral"}))


def _with_cache(block: dict[str, Any], cache: Any) -> dict[str, Any]:
    return {**block, "cache_control": cache} if cache else block


@st.composite
def _conversation(draw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for turn in range(draw(st.integers(1, 6))):
        user: list[dict[str, Any]] = [_with_cache({"type": "tool_result", "tool_use_id": call, "content": draw(_text)},
                                                  draw(_cache)) for call in pending]
        user += [_with_cache({"type": "text", "text": f"u{turn} {draw(_text)}"}, draw(_cache))]
        if draw(st.booleans()):
            user.append({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}})
        messages.append({"role": "user", "content": user})
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(_text), "signature": f"sig{turn}"})
        if draw(st.booleans()):
            blocks.append({"type": "redacted_thinking", "data": f"enc{turn}"})
        blocks.append({"type": "text", "text": f"a{turn} {draw(_text)}"})
        pending = [f"call{turn}_{i}" for i in range(draw(st.integers(0, 2)))]
        blocks += [{"type": "tool_use", "id": call, "name": "Bash", "input": {"n": i}} for i, call in enumerate(pending)]
        messages.append({"role": "assistant", "content": blocks})
    return messages


@settings(max_examples=150, deadline=None)
@given(_conversation())
def test_a_conversation_the_engine_keeps_whole_goes_upstream_exactly_as_the_agent_sent_it(messages):
    _, chat = history.split_system(am.to_chat({"system": "s", "messages": messages}, thinking_text=False)["messages"])
    assert am.from_chat(chat, messages) == messages


def test_it_adds_up_a_stream_into_the_message():
    builder = am.StreamBuilder()
    events = [
        {"type": "message_start", "message": {"id": "m", "role": "assistant", "content": [],
                                              "usage": {"input_tokens": 10, "cache_read_input_tokens": 7}}},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "Read",
                                                                       "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"pa'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'th": 1}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}},
    ]
    for event in events:
        builder.add(event)
    assert not builder.finished
    builder.add({"type": "message_stop"})
    assert builder.complete
    message = builder.result()
    assert message["content"] == [{"type": "thinking", "thinking": "hm", "signature": "sig"},
                                  {"type": "tool_use", "id": "t", "name": "Read", "input": {"path": 1}}]
    assert message["usage"] == {"input_tokens": 10, "cache_read_input_tokens": 7, "output_tokens": 5}
    reply = am.reply_of(message)
    assert reply.tool_calls == [{"id": "t", "type": "function", "function": {"name": "Read",
                                                                            "arguments": '{"path":1}'}}]


def test_an_error_event_ends_the_stream_as_a_failure():
    builder = am.StreamBuilder()
    builder.add({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert builder.finished and not builder.complete and builder.error == "Overloaded"


def test_it_recognises_claude_codes_compaction():
    asking = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"},
        {"type": "text", "text": "CRITICAL: Respond with TEXT ONLY.\nYour task is to create a detailed summary of "
                                 "the conversation so far"}]}]}
    assert am.is_compaction_request(asking)
    assert not am.is_compaction_request({"messages": [{"role": "user", "content": "summarise the README"}]})
    continued = {"messages": [{"role": "user", "content": "This session is being continued from a previous "
                                                          "conversation that ran out of context. Summary: plum"}]}
    assert am.compaction_summary(continued).endswith("plum")
    assert am.compaction_summary({"messages": [{"role": "user", "content": "hello"}]}) == ""


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                              (413, "request_too_large"), (429, "rate_limit_error"),
                                              (502, "api_error"), (529, "overloaded_error")])
def test_its_errors_have_anthropics_shape(status, kind):
    assert am.error_body(status, "why") == {"type": "error", "error": {"type": kind, "message": "why"}}
    event = am.error_event("cut", status).decode()
    assert event.startswith("event: error\ndata: ") and json.loads(event.split("data: ", 1)[1])["error"]["message"] \
        == "cut"


# -- credentials -----------------------------------------------------------------------------


@pytest.fixture
def token(alice) -> str:
    return ApiToken.issue(user=alice, name="t")[1]


@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-api-key": "{token}"}, None),
    ({"Authorization": "Bearer {token}"}, None),
    ({"X-ContextLab-Token": "{token}", "x-api-key": "sk-ant-own"}, ("x-api-key", "sk-ant-own")),
    ({"X-ContextLab-Token": "{token}", "Authorization": "Bearer oauth-own"}, ("Authorization", "Bearer oauth-own")),
    ({"x-api-key": "{token}", "Authorization": "Bearer oauth-own"}, ("Authorization", "Bearer oauth-own")),
    ({"x-api-key": "sk-ant-own", "Authorization": "Bearer {token}"}, ("x-api-key", "sk-ant-own")),
])
def test_it_finds_the_contextlab_token_and_the_clients_own_credential(token, alice, headers, expected):
    found = credentials.resolve({k: v.format(token=token) for k, v in headers.items()})
    assert found.token is not None and found.token.user == alice
    credential = found.provider_credential
    assert (credential.header, credential.value) == expected if expected else credential is None
    assert token not in repr(credential)


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "sk-ant-unknown"}, {"Authorization": "Basic abc"},
                                     {"X-ContextLab-Token": "cl_unknown", "x-api-key": "{token}"},
                                     {"x-api-key": "x" * 5000}])
def test_it_finds_no_token_where_there_is_none(token, headers):
    assert credentials.resolve({k: v.format(token=token) for k, v in headers.items()}).token is None


@settings(max_examples=60, deadline=None)
@given(_conversation(), _conversation(), st.integers(0, 12))
def test_converting_only_what_is_new_gives_what_converting_everything_gives(first, other, cut):
    cache = am.ConvertedPrefixes(size=2)
    # A conversation that grows, then one rewritten from the middle (an agent's own compaction).
    for messages in (first[:1], first, first[:cut] + other):
        for thinking_text in (False, True):
            assert cache.convert("c", messages, thinking_text=thinking_text) == \
                am.messages_to_chat(messages, thinking_text=thinking_text)
