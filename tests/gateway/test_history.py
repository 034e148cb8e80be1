"""The pure parts: message digests, history matching, the SSE relay's pieces."""

from __future__ import annotations

import json

from contextlab.gateway import history, sse
from contextlab.gateway.upstream import lines

CALL = {"id": "call_1", "type": "function", "function": {"name": "run_shell", "arguments": '{"command": "make"}'}}


def test_it_ignores_what_clients_change_when_they_echo_a_reply():
    sent = {"role": "assistant", "content": "Done.", "refusal": None, "annotations": [], "audio": None}
    for echo in ({"role": "assistant", "content": "Done."},
                 {"content": "Done.", "role": "assistant", "name": "bot"},
                 {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
                 {"role": "assistant", "content": "Done.\n"}):
        assert history.digest(echo) == history.digest(sent)
    assert history.digest({"role": "assistant", "content": None}) == history.digest({"role": "assistant"})
    assert history.digest({"role": "assistant", "content": ""}) == history.digest({"role": "assistant"})


def test_it_identifies_a_tool_calling_message_by_its_call_ids():
    sent = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    relaxed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "function": {"name": "run_shell", "arguments": '{"command":"make"}'}}]}
    assert history.digest(relaxed) == history.digest(sent)
    other = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "call_2"}]}
    assert history.digest(other) != history.digest(sent)


def test_it_tells_different_messages_apart():
    digests = {history.digest(m) for m in (
        {"role": "user", "content": "build it"},
        {"role": "user", "content": "build it again"},
        {"role": "assistant", "content": "build it"},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]},
    )}
    assert len(digests) == 6
    assert history.digest({"role": "developer", "content": "x"}) == history.digest({"role": "system", "content": "x"})


def test_it_splits_off_the_leading_system_messages_only():
    messages = [{"role": "system", "content": "A"}, {"role": "developer", "content": [{"type": "text", "text": "B"}]},
                {"role": "user", "content": "hi"}, {"role": "system", "content": "late note"}]
    system, rest = history.split_system(messages)
    assert system == messages[:2] and rest == messages[2:]
    assert history.system_prompt(system) == "A\n\nB"
    assert history.first_user(rest) == {"role": "user", "content": "hi"}


def test_it_matches_the_longest_ingested_prefix():
    assert history.common_prefix(["a", "b", "c"], ["a", "b", "x", "y"]) == 2
    assert history.continues(["a", "b"], ["a", "b", "c"])
    assert history.continues([], ["a"])
    assert history.continues(["a", "b"], ["a", "b"])
    assert not history.continues(["a", "b", "c"], ["a", "b"])  # the client went back
    assert not history.continues(["a", "x"], ["a", "b", "c"])  # the client edited


def test_it_derives_a_stable_key_per_profile_system_and_first_ask():
    first = {"role": "user", "content": "Fix the build"}
    key = history.derived_key(profile_id=1, system="S", first_user_message=first, include_system=True)
    assert key == history.derived_key(profile_id=1, system="S", first_user_message=dict(first), include_system=True)
    assert key.startswith("auto:1:")
    assert key != history.derived_key(profile_id=2, system="S", first_user_message=first, include_system=True)
    assert key != history.derived_key(profile_id=1, system="T", first_user_message=first, include_system=True)
    assert history.derived_key(profile_id=1, system="S", first_user_message=first, include_system=False) == \
        history.derived_key(profile_id=1, system="T", first_user_message=first, include_system=False)


def test_it_keeps_only_what_a_later_call_sends_back_of_a_reply():
    reply = history.reply_message({"role": "assistant", "content": None, "refusal": None, "annotations": [],
                                   "tool_calls": [{**CALL, "type": None}], "reasoning_content": "think"})
    assert reply == {"role": "assistant", "content": None, "reasoning_content": "think",
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "run_shell", "arguments": '{"command": "make"}'}}]}
    assert history.reply_message({"role": "assistant", "content": None, "refusal": "I can't."}) == \
        {"role": "assistant", "content": "I can't."}


def test_it_frames_events_whatever_the_chunking():
    stream = b'data: {"a": 1}\n\n: keep-alive\n\ndata: {"b"\ndata: : 2}\r\n\r\ndata: [DONE]\n\n'
    for size in (1, 3, 7, len(stream)):
        chunks = iter([stream[i:i + size] for i in range(0, len(stream), size)])
        found = list(sse.events(lines(chunks)))
        assert [e.data for e in found] == [b'{"a": 1}', None, b'{"b"\n: 2}', b"[DONE]"]
        assert found[0].json() == {"a": 1} and found[3].done and found[1].encode() == b": keep-alive\n\n"


def test_it_adds_up_streamed_deltas_into_the_reply():
    builder = sse.ReplyBuilder()
    for chunk in (
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "Let me "}}]},
        {"choices": [{"index": 0, "delta": {"content": "check."}}]},
        {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_9", "type": "function", "function": {"name": "grep", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"p":'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 5}},
    ):
        builder.add(chunk)
    assert builder.complete and builder.usage == {"prompt_tokens": 5}
    assert builder.message() == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "grep", "arguments": '{"p": "x"}'}}]}


def test_it_recognises_and_trims_the_usage_it_asked_for():
    assert sse.is_usage_only({"choices": [], "usage": {"prompt_tokens": 1}})
    assert not sse.is_usage_only({"choices": [{"index": 0}], "usage": {"prompt_tokens": 1}})
    assert not sse.is_usage_only({"choices": [], "usage": None})
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {}}], "usage": {"prompt_tokens": 1}}
    trimmed = sse.without_usage(sse.Event([b"data: x"], b"x"), chunk)
    assert json.loads(trimmed.data or b"") == {"id": "c", "choices": [{"index": 0, "delta": {}}]}
