"""OpenAI chat-completions conversion, and format detection for the ingest API."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlab.engine.convert import detect_message_format, messages_from_any
from contextlab.engine.convert.openai import from_openai, to_openai
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import (
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    check_sequence,
)


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is in /tmp?", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "/tmp"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "du", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": "4K"},
        {"role": "assistant", "content": "Two files, 4K."},
    ]


def roundtrip(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return to_openai(from_openai(copy.deepcopy(messages)))


# -- reading ----------------------------------------------------------------------------


def test_it_converts_a_tool_call_conversation() -> None:
    msgs = from_openai(conversation())

    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[1].name == "alice"
    uses = msgs[2].tool_uses
    assert uses[0] == ToolUseBlock(id="call_1", name="ls", input={"path": "/tmp"}, raw_input='{"path": "/tmp"}')
    assert msgs[3].content == (ToolResultBlock(id="call_1", name="ls", output="a.txt\nb.txt"),)
    assert msgs[4].tool_results[0].name == "du"  # the name comes from the matching call
    check_sequence(msgs)


def test_it_keeps_invalid_json_arguments_raw() -> None:
    data = conversation()
    data[2]["tool_calls"][0]["function"]["arguments"] = '{"path": "/tmp"'  # cut off by the model
    msgs = from_openai(data)

    use = msgs[2].tool_uses[0]
    assert use.input == {}
    assert use.raw_input == '{"path": "/tmp"'
    assert to_openai(msgs) == data


def test_it_takes_non_object_json_arguments_as_no_input() -> None:
    data = conversation()
    data[2]["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    assert from_openai(data)[2].tool_uses[0].input == {}
    assert roundtrip(data) == data


def test_it_turns_reasoning_content_into_thinking_and_back() -> None:
    data = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]
    msgs = from_openai(data)

    assert msgs[1].content == (ThinkingBlock("greet"), TextBlock("hello"))
    assert to_openai(msgs) == data


def test_it_reads_image_parts_as_media() -> None:
    data = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": "high"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
            ],
        }
    ]
    msg = from_openai(data)[0]

    assert msg.content[1] == MediaBlock(kind="image", url="https://x.test/a.png")
    assert msg.content[2] == MediaBlock(kind="image", media_type="image/png", data="iVBORw0K")
    assert to_openai([msg]) == data


def test_it_keeps_a_system_message_as_system() -> None:
    msgs = from_openai([{"role": "system", "content": "rules"}, {"role": "developer", "content": "more rules"}])

    assert [m.role for m in msgs] == ["system", "system"]
    assert to_openai(msgs) == [{"role": "system", "content": "rules"}, {"role": "developer", "content": "more rules"}]


# -- lossless round trip ------------------------------------------------------------------


def test_it_round_trips_every_content_form() -> None:
    data: list[dict[str, Any]] = [
        {"role": "user", "content": ""},
        {"role": "user", "content": []},
        {"role": "user", "content": [{"type": "text", "text": "one part", "cache_control": {"type": "ephemeral"}}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}],
            "refusal": None,
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r1"}], "name": "f"},
        {"role": "assistant", "content": None, "reasoning_content": ""},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}], "tool_calls": []},
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}]},
        {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1", "filename": "a.pdf"}}]},
        {"role": "user", "content": [{"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE"}}]},
        {"role": "user", "content": "x", "name": None, "x_trace_id": {"a": [1, 2]}},
    ]
    assert roundtrip(data) == data


def test_it_round_trips_the_tau_bench_trajectory() -> None:
    from tests.engine.test_importers import corpus_file

    data = json.loads(corpus_file("tau-bench/gpt-4o-airline.idx52.task2.trial1.json").read_text("utf-8"))
    assert roundtrip(data["traj"]) == data["traj"]


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=5))
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_extra_keys = st.dictionaries(st.sampled_from(["x_a", "x_b", "metadata", "tool_call_id", "audio"]), _json, max_size=2)
_text = st.text(max_size=12)
_text_part = st.builds(lambda t: {"type": "text", "text": t}, _text)
_image_part = st.builds(
    lambda url, detail: {"type": "image_url", "image_url": {"url": url, **detail}},
    st.sampled_from(["https://x.test/i.png", "data:image/jpeg;base64,AAAA", "data:;base64,", "file.png"]),
    st.sampled_from([{}, {"detail": "low"}]),
)
_user_content = st.one_of(_text, st.none(), st.lists(st.one_of(_text_part, _image_part), max_size=3))
_arguments = st.one_of(
    st.dictionaries(st.text(max_size=4), _json, max_size=3).map(json.dumps),
    st.text(max_size=10),  # models do write broken JSON
)


@st.composite
def openai_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(_text)})
    call_number = 0
    for _ in range(draw(st.integers(1, 4))):
        user: dict[str, Any] = {"role": "user", "content": draw(_user_content)}
        if draw(st.booleans()):
            user["name"] = draw(st.sampled_from(["bob", "x-1"]))
        user.update(draw(_extra_keys))
        out.append(user)
        assistant: dict[str, Any] = {"role": "assistant"}
        calls = []
        for _ in range(draw(st.integers(0, 3))):
            call_number += 1
            call: dict[str, Any] = {
                "id": f"call_{call_number}",
                "type": "function",
                "function": {"name": draw(st.sampled_from(["ls", "read"])), "arguments": draw(_arguments)},
            }
            if draw(st.booleans()):
                call["index"] = call_number
            calls.append(call)
        content_choices = [st.none(), _text, st.lists(_text_part, max_size=2)]
        if draw(st.booleans()):
            assistant["content"] = draw(st.one_of(*content_choices))
        if calls:
            assistant["tool_calls"] = calls
        if draw(st.booleans()):
            assistant["reasoning_content"] = draw(st.one_of(st.none(), _text))
        assistant.update(draw(st.dictionaries(st.sampled_from(["x_a", "refusal"]), _json, max_size=1)))
        out.append(assistant)
        for call in calls:
            tool: dict[str, Any] = {"role": "tool", "tool_call_id": call["id"]}
            tool["content"] = draw(st.one_of(_text, st.lists(_text_part, max_size=2), st.none()))
            if draw(st.booleans()):
                tool["name"] = call["function"]["name"]
            out.append(tool)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(openai_conversations())
def test_it_round_trips_generated_conversations_losslessly(data: list[dict[str, Any]]) -> None:
    msgs = from_openai(copy.deepcopy(data))
    assert to_openai(msgs) == data
    # The internal form survives its own JSON round trip too (what the archive stores).
    assert to_openai([Message.from_dict(json.loads(json.dumps(m.to_dict()))) for m in msgs]) == data


def test_it_renders_a_rewritten_message_plainly() -> None:
    # A hint recorded for two parts no longer fits once the content changed.
    data = [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}, {"type": "text", "text": "b"}]}]
    msg = from_openai(data)[0]
    rewritten = msg.replace_content([TextBlock("only one")])
    assert to_openai([rewritten]) == [{"role": "user", "content": [{"type": "text", "text": "only one"}]}]


def test_it_sends_anthropic_style_results_as_tool_messages() -> None:
    msgs = [
        Message(role="assistant", content=(ToolUseBlock(id="t1", name="f", input={"a": 1}),)),
        Message(role="user", content=(ToolResultBlock(id="t1", name="f", output="ok"), TextBlock("and now?"))),
    ]
    assert to_openai(msgs) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "user", "content": "and now?"},
    ]


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": "x"}, {"content": "no role"}], "messages[1].role"),
        (["just a string"], "messages[0]"),
        ([{"role": "user", "content": 42}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "video_url"}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": "x", "name": 5}], "messages[0].name"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}], "messages[0].tool_calls[0].id"),
        ([{"role": "assistant", "tool_calls": [{"id": "a", "function": "f"}]}], "messages[0].tool_calls[0].function"),
        ([{"role": "assistant", "content": "x", "tool_calls": "nope"}], "messages[0].tool_calls"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
    ],
)
def test_it_names_the_field_of_malformed_messages(data: list[Any], field: str) -> None:
    with pytest.raises(InvalidMessages) as info:
        from_openai(data)
    assert info.value.field == field


def test_it_rejects_a_non_list() -> None:
    with pytest.raises(InvalidMessages) as info:
        from_openai({"role": "user"})  # type: ignore[arg-type]
    assert info.value.field == "messages"


def test_it_rejects_an_orphan_tool_result() -> None:
    data = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "?"}]
    with pytest.raises(InvalidMessages) as info:
        from_openai(data)
    assert info.value.field == "messages[1].tool_call_id"
    assert "call_9" in info.value.message


def test_it_accepts_results_of_calls_from_an_earlier_batch() -> None:
    msgs = from_openai([{"role": "tool", "tool_call_id": "call_9", "content": "ok"}], known_calls={"call_9": "ls"})
    assert msgs[0].tool_results[0].name == "ls"


_fuzz_keys = st.sampled_from(
    ["role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content", "type", "text", "id",
     "function", "arguments", "input", "tool_use_id", "is_error", "source", "url", "data", "image_url",
     "output", "raw_input", "metadata", "timestamp", "thinking", "file", "input_audio"]
)
_fuzz_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=3),
    st.sampled_from(["user", "assistant", "tool", "system", "text", "tool_use", "tool_result", "image",
                     "image_url", "function", "base64", "url", "thinking", "audio", "c1"]),
)
_fuzz_json = st.recursive(
    _fuzz_values | st.dictionaries(_fuzz_keys, _fuzz_values, max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_fuzz_keys, inner, max_size=5),
    max_leaves=25,
)
_fuzz_messages = st.lists(
    st.builds(lambda role, rest: {"role": role, **rest},
              st.sampled_from(["user", "assistant", "tool", "system"]),
              st.dictionaries(_fuzz_keys, _fuzz_json, max_size=4)) | _fuzz_json,
    max_size=4,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fuzz_messages)
def test_it_answers_garbage_with_invalid_messages_only(data: list[Any]) -> None:
    from contextlab.engine.convert import from_agentscope, from_anthropic, to_agentscope, to_anthropic

    for convert in (from_openai, from_anthropic, from_agentscope, messages_from_any):
        try:
            msgs = convert(copy.deepcopy(data))
        except InvalidMessages:
            continue
        to_openai(msgs)
        to_anthropic(msgs)
        to_agentscope(msgs)
        if convert is from_openai:
            assert to_openai(msgs) == data


# -- format detection ---------------------------------------------------------------------


def test_it_detects_openai_messages() -> None:
    assert detect_message_format(conversation()) == "openai"
    assert detect_message_format([{"role": "user", "content": "plain text"}]) == "openai"
    assert detect_message_format([]) == "openai"


def test_it_detects_anthropic_messages() -> None:
    data = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
    ]
    assert detect_message_format(data) == "anthropic"
    assert detect_message_format([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == "anthropic"


def test_it_detects_agentscope_messages() -> None:
    data = [
        {"id": "1", "name": "Friday", "role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {}, "raw_input": "{}"}], "metadata": {},
         "timestamp": "2026-03-19 10:00:00.000"},
        {"id": "2", "name": "system", "role": "system", "content": [
            {"type": "tool_result", "id": "t", "name": "f", "output": "ok"}], "metadata": {},
         "timestamp": "2026-03-19 10:00:01.000"},
    ]
    assert detect_message_format(data) == "agentscope"
    converted = messages_from_any(data)
    assert [m.role for m in converted] == ["assistant", "tool"]


def test_it_converts_whatever_it_detects() -> None:
    assert [m.role for m in messages_from_any(conversation())][:3] == ["system", "user", "assistant"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([{"content": "no role"}], "messages[0]"),
        ([42], "messages[0]"),
        ("not a list", "messages"),
        (
            [
                {"role": "assistant", "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
            ],
            "messages",
        ),
    ],
)
def test_it_refuses_shapes_it_cannot_tell(data: Any, field: str) -> None:
    with pytest.raises(InvalidMessages) as info:
        detect_message_format(data)
    assert info.value.field == field
    assert "expected" in info.value.message


def test_it_keeps_non_finite_numbers_in_arguments_as_raw_text() -> None:
    from contextlab.engine.convert.openai import parse_arguments

    assert parse_arguments('{"a": 1e400}') == {}
    assert parse_arguments('{"a": NaN}') == {}
    assert parse_arguments('{"a": 1.5}') == {"a": 1.5}
