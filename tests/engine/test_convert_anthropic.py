"""Anthropic Messages API conversion."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from contextlab.engine.convert.anthropic import from_anthropic, to_anthropic
from contextlab.engine.convert.openai import from_openai
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
        {"role": "user", "content": "List /tmp and count the lines of a.txt"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "sig-1"},
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "/tmp"}},
                {"type": "tool_use", "id": "toolu_2", "name": "wc", "input": {"file": "a.txt"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "wc: a.txt: Permission denied"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Also, be quick."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "a.txt is unreadable."}]},
    ]


def test_it_splits_a_user_message_into_results_then_text() -> None:
    msgs = from_anthropic(conversation(), system="Be brief.")

    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user", "assistant"]
    assert msgs[3].content == (ToolResultBlock(id="toolu_1", name="ls", output="a.txt"),)
    assert msgs[4].content == (
        ToolResultBlock(id="toolu_2", name="wc", output=(TextBlock("wc: a.txt: Permission denied"),), is_error=True),
    )
    assert msgs[5].content == (TextBlock("Also, be quick."),)
    assert msgs[2].content[0] == ThinkingBlock("two calls")
    check_sequence(msgs)


def test_it_regroups_results_and_text_on_the_way_back() -> None:
    data = conversation()
    system, back = to_anthropic(from_anthropic(copy.deepcopy(data), system="Be brief."))

    assert system == "Be brief."
    assert back == data  # signatures, is_error and string content survive


def test_it_takes_a_list_system_prompt() -> None:
    msgs = from_anthropic([{"role": "user", "content": "hi"}], system=[
        {"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two.", "cache_control": {"type": "ephemeral"}}
    ])
    assert msgs[0].role == "system"
    assert to_anthropic(msgs)[0] == "Rule one.\nRule two."


def test_it_merges_consecutive_same_role_messages() -> None:
    msgs = [
        Message.text("user", "first"),
        Message.text("user", "second"),
        Message(role="assistant", content=(ToolUseBlock(id="t1", name="f", input={}),
                                           ToolUseBlock(id="t2", name="g", input={}))),
        Message(role="tool", content=(ToolResultBlock(id="t1", name="f", output="one"),)),
        Message(role="tool", content=(ToolResultBlock(id="t2", name="g", output="two", is_error=True),)),
        Message.text("user", "next question"),
        Message.text("assistant", "answer"),
    ]
    system, back = to_anthropic(msgs)

    assert system is None
    assert [m["role"] for m in back] == ["user", "assistant", "user", "assistant"]
    assert back[0]["content"] == [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert back[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "two", "is_error": True},
        {"type": "text", "text": "next question"},
    ]


def test_it_sends_a_later_system_note_as_user_text() -> None:
    msgs = [Message.text("system", "policy"), Message.text("user", "hi"), Message.text("assistant", "hello"),
            Message.text("system", "Conversation compacted"), Message.text("user", "go on")]
    system, back = to_anthropic(msgs)

    assert system == "policy"
    assert back[-1] == {"role": "user", "content": [{"type": "text", "text": "Conversation compacted"},
                                                    {"type": "text", "text": "go on"}]}


def test_it_leaves_out_thinking_the_api_did_not_sign() -> None:
    msgs = from_openai([{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a", "reasoning_content": "deepseek thoughts"}])
    _, back = to_anthropic(msgs)
    assert back[1] == {"role": "assistant", "content": [{"type": "text", "text": "a"}]}


def test_it_keeps_redacted_thinking() -> None:
    data: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "EncRypt3d"},
                                          {"type": "text", "text": "a"}]},
    ]
    assert to_anthropic(from_anthropic(copy.deepcopy(data)))[1] == data


def test_it_reads_images_and_documents() -> None:
    data = [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
                {"type": "text", "text": "what are these?"},
            ],
        }
    ]
    msg = from_anthropic(copy.deepcopy(data))[0]
    assert msg.content[:3] == (
        MediaBlock(kind="image", media_type="image/png", data="iVBOR"),
        MediaBlock(kind="image", url="https://x.test/a.png"),
        MediaBlock(kind="file", media_type="application/pdf", data="JVBE"),
    )
    assert to_anthropic([msg])[1] == data


def test_it_reads_image_tool_results() -> None:
    data = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "text", "text": "here"},
            {"type": "image", "source": {"type": "url", "url": "https://x.test/s.png"}},
        ]}]},
    ]
    result = from_anthropic(copy.deepcopy(data))[1].tool_results[0]
    assert result.output == (TextBlock("here"), MediaBlock(kind="image", url="https://x.test/s.png"))
    assert to_anthropic(from_anthropic(copy.deepcopy(data)))[1] == data


def test_it_rejects_an_orphan_tool_result() -> None:
    data = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}]
    with pytest.raises(InvalidMessages) as info:
        from_anthropic(data)
    assert info.value.field == "messages[0].content[1].tool_use_id"


def test_it_accepts_results_of_calls_from_an_earlier_batch() -> None:
    data = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "ok"}]}]
    assert from_anthropic(data, known_calls={"toolu_x": "ls"})[0].tool_results[0].name == "ls"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([{"role": "system", "content": "x"}], "messages[0].role"),
        ([{"role": "tool", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "audio"}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}],
         "messages[0].content[0].type"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}],
         "messages[0].content[0].id"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]}],
         "messages[0].content[0].input"),
        ([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
         "messages[0].content[0].tool_use_id"),
        ([{"role": "user", "content": [{"type": "image", "source": {"type": "ftp"}}]}],
         "messages[0].content[0].source.type"),
        (["nope"], "messages[0]"),
    ],
)
def test_it_names_the_field_of_malformed_messages(data: list[Any], field: str) -> None:
    with pytest.raises(InvalidMessages) as info:
        from_anthropic(data)
    assert info.value.field == field


def test_it_rejects_a_bad_system_prompt() -> None:
    with pytest.raises(InvalidMessages) as info:
        from_anthropic([], system=42)  # type: ignore[arg-type]
    assert info.value.field == "system"
